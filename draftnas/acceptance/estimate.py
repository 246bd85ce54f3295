"""Acceptance estimator: a drafter's expected tokens per speculative step, from one teacher-forced pass.

The drafter reads each trace's prompt + target continuation once (batched, right
padded: causal attention makes the padding invisible to real positions). At each
continuation position t it predicts the target's token there.

Greedy (temperature 0). Before the first mismatch of a step the drafter has seen
exactly the target's tokens, so the per-position top-1 agreement a_t in {0, 1}
decides every step: a step starting at t with gamma drafts accepts the longest run
of agreements a_t, a_{t+1}, ... (at most gamma) and emits it plus the target's
correction or bonus token. Replaying the steps over each trace gives the exact
tokens per step of real greedy speculative decoding (up to float noise in near-ties).

Sampling (temperature T > 0). A drafted token is accepted with probability
beta_t = sum_x min(p_t(x), q_t(x)) (Leviathan et al. 2023, Chen et al. 2023), p the
target's and q the drafter's temperature-T distribution. Only the target's top-k
probabilities are stored, so beta is bracketed:
``sum_{x in top-k} min(p, q) <= beta <= that + min(leftover_p, 1 - sum_{x in top-k} q)``
(outside the top-k, min(p, q) <= p sums to at most the leftover mass). The point
estimate is the lower end; the upper end is reported beside it. Steps are then the
expectation of the same replay with acceptance probabilities beta_t (a dynamic
programme over positions; the contexts after a rejection are approximated by the
trace's own tokens, which is exact in distribution for the accepted prefix).

The replay itself (expected and greedy steps, per-domain summaries) is `acceptance.steps`.

`vocab_subset` restricts the drafter's head to a subset of full-vocabulary ids
(a reduced draft vocabulary): a target token outside it is always rejected under
greedy, and q is renormalized over the subset under sampling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from draftnas.acceptance.accepts import AcceptsPrompt, AcceptsTrace, policy_steps, walk_accepts
from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.acceptance.steps import PerPosition, replay_steps, summarize
from draftnas.acceptance.traces import (
    TraceRecord,
    Traces,
    check_compatible,
    model_vocab_size,
    tokenizer_fingerprint,
)
from draftnas.core.errors import InvalidInputError, TraceError
from draftnas.core.records import Progress

log = logging.getLogger(__name__)
TOKENS_PER_BATCH = 4096
HEAD_CHUNK_ROWS = 512


def _unwrap(drafter: Any) -> tuple[Any, str | None]:
    """A model, or a LoadedModel whose tokenizer is then fingerprinted."""
    if hasattr(drafter, "model") and hasattr(drafter, "tokenizer"):
        return drafter.model, tokenizer_fingerprint(drafter.tokenizer)
    return drafter, None


def _subset_tensor(vocab_subset: Any, vocab_size: int) -> torch.Tensor | None:
    if vocab_subset is None:
        return None
    subset = torch.as_tensor(vocab_subset, dtype=torch.long).flatten()
    if subset.numel() == 0:
        raise InvalidInputError("vocab_subset is empty")
    if int(subset.min()) < 0 or int(subset.max()) >= vocab_size:
        raise InvalidInputError(f"vocab_subset ids must be in [0, {vocab_size - 1}]")
    if subset.unique().numel() != subset.numel():
        raise InvalidInputError("vocab_subset repeats ids")
    return subset


def head_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head over hidden states [n, H] -> [n, V] float32 (with Gemma's soft-capping)."""

    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _device(model: Any) -> Any:
    """Where the model's weights are (CPU for weightless stubs)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else "cpu"


def _hidden_states(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, T, H] (after the final norm), without running the LM head."""
    decoder = model.get_decoder()
    return decoder(input_ids=ids, use_cache=False).last_hidden_state


def _batches(records: Sequence[TraceRecord]) -> list[list[int]]:
    """Record indices grouped by similar length into batches of about TOKENS_PER_BATCH tokens."""
    def length(i: int) -> int:
        return len(records[i].prompt_ids) + len(records[i].continuation_ids)

    order = sorted(range(len(records)), key=length)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and length(i) * (len(current) + 1) > TOKENS_PER_BATCH:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def _score_rows(logits: torch.Tensor, rec: TraceRecord, temperature: float,
                head_to_full: torch.Tensor | None, full_to_head: torch.Tensor | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-position (beta, beta_upper, top1 agreement, the drafter's probability of its own argmax over
    its head: what a confidence stop reads) for one record. logits: [C, V_head]."""

    pred = logits.argmax(-1)
    confidence = torch.softmax(logits.float(), dim=-1).amax(-1).double().numpy() if len(logits) else \
        np.zeros(0)
    if head_to_full is not None:
        pred = head_to_full[pred]
    top1 = (pred == rec.topk_ids[:, 0]).float()
    if temperature <= 0:
        agree = (pred == rec.continuation_ids).double().numpy()
        return agree, agree, top1.numpy(), confidence
    q = torch.softmax(logits / temperature, dim=-1)  # [C, V_head]
    idx = rec.topk_ids if full_to_head is None else full_to_head[rec.topk_ids]  # [C, K]
    q_top = q.gather(1, idx.clamp(min=0)) * (idx >= 0)
    low = torch.minimum(rec.topk_probs, q_top).sum(-1)
    high = low + torch.minimum(rec.leftover, (1.0 - q_top.sum(-1)).clamp(min=0.0))
    return low.double().numpy(), high.clamp(max=1.0).double().numpy(), top1.numpy(), confidence


@dataclass
class BodyMemo:
    """Final hidden states of the drafter body `key` names per batch of one set of records (`body_key`)."""

    key: str = ""
    hidden: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)


def _teacher_forced(model: Any, records: Sequence[TraceRecord], temperature: float,
                    subset: torch.Tensor | None, vocab_size: int, progress: Progress | None,
                    body: BodyMemo | None = None) -> PerPosition:

    full_to_head = None
    if subset is not None:
        full_to_head = torch.full((vocab_size,), -1, dtype=torch.long)
        full_to_head[subset] = torch.arange(subset.numel())
    empty = [np.zeros(0)] * len(records)
    out = PerPosition(list(empty), list(empty), list(empty), list(empty))
    done = 0
    with torch.inference_mode():
        for batch in _batches(records):
            seqs = [records[i].input_ids for i in batch]
            ids = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
            for row, s in enumerate(seqs):
                ids[row, :len(s)] = s
            hidden = body.hidden.get(tuple(batch)) if body is not None else None
            if hidden is None:
                hidden = _hidden_states(model, ids.to(_device(model)))  # [B, T, H]
                if body is not None:
                    body.hidden[tuple(batch)] = hidden
            for row, i in enumerate(batch):
                rec = records[i]
                p, c = len(rec.prompt_ids), len(rec.continuation_ids)
                h = hidden[row, p - 1:p + c - 1]  # position p-1+t predicts continuation[t]
                logits = torch.cat([head_logits(model, h[s:s + HEAD_CHUNK_ROWS])
                                    for s in range(0, c, HEAD_CHUNK_ROWS)]) if c else hidden.new_zeros(0, 1)
                logits = logits.cpu()  # scoring reads the traces' CPU tensors
                if subset is not None and logits.shape[-1] == vocab_size:
                    logits = logits[:, subset]
                out.beta[i], out.beta_hi[i], out.top1[i], out.confidence[i] = _score_rows(
                    logits, rec, temperature, subset, full_to_head)
            done += len(batch)
            if progress:
                progress(done, len(records))
    return out


def _check_head(model: Any, vocab_size: int, subset: torch.Tensor | None) -> None:
    rows = int(model.get_output_embeddings().weight.shape[0])
    allowed = {vocab_size} | ({int(subset.numel())} if subset is not None else set())
    if rows not in allowed:
        hint = "" if subset is not None else " (a reduced-vocabulary head needs vocab_subset)"
        raise TraceError(f"the drafter's LM head has {rows} rows; expected {sorted(allowed)}{hint}")


def _agreement(drafter_model: Any, traces: Traces, temperature: float, vocab_subset: Any,
               progress: Progress | None, body: BodyMemo | None = None
               ) -> tuple[Traces, PerPosition, torch.Tensor | None]:
    """The drafter checked against the traces and run teacher-forced over the records at
    `temperature` -> (those records, per-position acceptance, the head's subset)."""
    model, fingerprint = _unwrap(drafter_model)
    check_compatible(traces, vocab_size=model_vocab_size(model), fingerprint=fingerprint)
    selected = traces.select(temperature=temperature)
    if vocab_subset is None:  # a drafter given a reduced head by draftnas.drafter.vocab.apply_vocab_subset
        vocab_subset = getattr(model, "draft_vocab_subset", None)
    if vocab_subset is not None and hasattr(vocab_subset, "ids"):
        vocab_subset = list(vocab_subset.ids)
    subset = _subset_tensor(vocab_subset, traces.metadata.vocab_size)
    _check_head(model, traces.metadata.vocab_size, subset)
    per = _teacher_forced(model, selected.records, temperature, subset, traces.metadata.vocab_size, progress,
                          body)
    return selected, per, subset


def estimated_accepts(drafter_model: Any, traces: Traces, *, gamma: int, label: str, drafter: str = "",
                      vocab_subset: Any = None, p_min: float = 0.0) -> AcceptsTrace:
    """The accepted counts per step greedy speculative decoding at `gamma` (stopping after a draft below
    `p_min`) would have on each greedy record of `traces`: the drafter's agreement with the target's own
    outputs, walked step by step (`accepts.walk_accepts`). Exact where the drafter's teacher-forced argmax
    is the one it drafts (the drafted counts after a rejected draft are the teacher-forced walk's)."""
    selected, per, _ = _agreement(drafter_model, traces, 0.0, vocab_subset, None)
    budget = traces.metadata.max_new_tokens
    prompts = []
    for record, agree, confidence in zip(selected.records, per.beta, per.confidence, strict=True):
        accepted, drafted = walk_accepts(agree.tolist(), gamma, max(budget, len(agree)), confidence.tolist(),
                                         p_min)
        prompts.append(AcceptsPrompt(prompt_id=record.info.prompt_id, prompt_tokens=len(record.prompt_ids),
                                     new_tokens=len(agree), accepted=tuple(accepted), drafted=tuple(drafted)))
    return AcceptsTrace(label=label, drafter=drafter, source="estimate", gamma=gamma, prompts=tuple(prompts))


def estimate_acceptance(
    drafter_model: Any,
    traces: Traces,
    *,
    max_gamma: int = 8,
    temperature: float = 0.0,
    vocab_subset: Any = None,
    progress: Progress | None = None,
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    p_mins: Sequence[float] = (0.0,),
    body: BodyMemo | None = None,
) -> AcceptanceEstimate:
    """Expected tokens per speculative step of `drafter_model` against the target in `traces`.

    drafter_model: a causal LM (or a LoadedModel, whose tokenizer is then checked too).
    temperature: 0 = greedy; else the traces must hold records sampled at that temperature.
    vocab_subset: full-vocabulary ids the drafter's head predicts over (its head may have
    len(vocab_subset) rows, row j = id vocab_subset[j], or the full vocabulary).
    progress(done, total) is called after each batch of records.
    p_mins: greedy only, the confidence stops to walk beside gamma (`PolicySteps`; 0 = draft gamma always).
    body: hidden states of this drafter's body kept from a drafter that differs only in its head.
    """
    if not 1 <= max_gamma <= 64:
        raise InvalidInputError(f"max_gamma must be in [1, 64], got {max_gamma}")
    if temperature < 0:
        raise InvalidInputError(f"temperature must be >= 0, got {temperature:g}")
    if any(not 0.0 <= p < 1.0 for p in p_mins):
        raise InvalidInputError(f"p_mins must be in [0, 1), got {list(p_mins)}")
    started = time.perf_counter()
    selected, per, subset = _agreement(drafter_model, traces, temperature, vocab_subset, progress, body)
    lengths = np.array([len(r.continuation_ids) for r in selected.records])
    max_new = max(traces.metadata.max_new_tokens, int(lengths.max()))
    steps = replay_steps(per, lengths, max_gamma, max_new, greedy=temperature <= 0)
    everything = np.ones(len(lengths), dtype=bool)
    overall = summarize(steps, everything, n_bootstrap, confidence, seed)
    per_domain = {
        domain: summarize(steps, np.array([r.info.domain == domain for r in selected.records]),
                           n_bootstrap, confidence, seed)
        for domain in selected.domains
    }
    policies = policy_steps([a.tolist() for a in per.beta], [c.tolist() for c in per.confidence], max_gamma,
                            max_new, p_mins) if temperature <= 0 else ()
    upper = steps.tokens.sum() / steps.steps_hi.sum(0)
    rate_hi = float(steps.beta_hi_sum.sum() / max(overall.n_positions, 1))
    elapsed = time.perf_counter() - started
    log.info("acceptance over %d records (%d positions) in %.2f s", len(lengths), overall.n_positions,
             elapsed)
    return AcceptanceEstimate(
        temperature=float(temperature), max_gamma=max_gamma, n_prompts=overall.n_prompts,
        n_positions=overall.n_positions, top1_agreement=overall.top1_agreement,
        acceptance_rate=overall.acceptance_rate, acceptance_rate_upper=rate_hi,
        tokens_per_step=overall.tokens_per_step,
        tokens_per_step_upper={str(g): float(v) for g, v in enumerate(upper.tolist(), start=1)},
        ci_low=overall.ci_low, ci_high=overall.ci_high, per_domain=per_domain,
        confidence=confidence, n_bootstrap=n_bootstrap,
        vocab_subset_size=None if subset is None else int(subset.numel()),
        elapsed_s=round(elapsed, 4), policies=policies,
    )
