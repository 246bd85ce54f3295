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
from draftnas.acceptance.records import AcceptanceEstimate, DomainAcceptance
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


def expected_steps(beta: np.ndarray, lengths: np.ndarray, gamma: int, max_new_tokens: int) -> np.ndarray:
    """Expected number of speculative steps to emit each sequence.

    beta: [N, T] per-position acceptance probability (1/0 under greedy), zero past each
    sequence's length; lengths: [N] tokens in each sequence (the last may be EOS).
    A step at position t drafts g = min(gamma, max_new_tokens - t - 1) tokens (the
    decoding loops' end-of-budget rule), accepts a prefix of k with probability
    prod_{j<k} beta_{t+j} * (1 - beta_{t+k}) (k < g) or prod_{j<g} beta_{t+j} (k = g),
    and moves to min(t + k + 1, length). Returns [N] expected steps (exact under greedy).
    """
    n, width = beta.shape
    padded = np.zeros((n, width + gamma + 2))
    padded[:, :width] = beta
    steps = np.zeros((n, width + gamma + 2))  # steps[:, t] = expected steps from position t
    cols = np.arange(width + gamma + 2)
    for t in range(width - 1, -1, -1):
        g = max(0, min(gamma, max_new_tokens - t - 1))
        reach = np.ones(n)  # prod_{j<k} beta_{t+j}
        total = np.ones(n)
        for k in range(g + 1):
            p_k = reach * (1.0 - padded[:, t + k]) if k < g else reach
            nxt = np.minimum(t + k + 1, lengths)
            total += p_k * steps[np.arange(n), np.minimum(nxt, cols[-1])]
            reach = reach * padded[:, t + k]
        steps[:, t] = np.where(t < lengths, total, 0.0)
    return steps[:, 0]


def greedy_steps(agree: Sequence[np.ndarray], gamma: int, max_new_tokens: int) -> np.ndarray:
    """Exact steps of greedy speculative decoding per sequence (the replay `expected_steps`
    computes, walked directly: much faster for 0/1 agreement). agree: per sequence [C] of 0/1."""
    return np.array([len(walk_accepts(a.tolist(), gamma, max_new_tokens)[0]) for a in agree], dtype=float)


def _bootstrap(tokens: np.ndarray, steps: np.ndarray, n: int, confidence: float,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of sum(tokens)/sum(steps) over prompts resampled with replacement.

    tokens [N]; steps [N, G]. Returns (low [G], high [G]).
    """
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tokens), size=(n, len(tokens)))
    ratios = tokens[idx].sum(1)[:, None] / steps[idx].sum(1)  # [n, G]
    tail = (1.0 - confidence) / 2 * 100
    return np.percentile(ratios, tail, axis=0), np.percentile(ratios, 100 - tail, axis=0)


@dataclass
class _Steps:
    """Per record: tokens [N], expected steps [N, G] (point and upper), and per-position sums."""

    tokens: np.ndarray
    steps: np.ndarray
    steps_hi: np.ndarray
    beta_sum: np.ndarray
    beta_hi_sum: np.ndarray
    top1_sum: np.ndarray


def _summarize(s: _Steps, rows: np.ndarray, n_bootstrap: int, confidence: float,
               seed: int) -> DomainAcceptance:
    tokens, steps = s.tokens[rows], s.steps[rows]
    low, high = _bootstrap(tokens, steps, n_bootstrap, confidence, seed)
    point = tokens.sum() / steps.sum(0)
    positions = max(int(tokens.sum()), 1)
    keys = [str(g) for g in range(1, steps.shape[1] + 1)]
    return DomainAcceptance(
        n_prompts=int(rows.sum()), n_positions=int(tokens.sum()),
        top1_agreement=float(s.top1_sum[rows].sum() / positions),
        acceptance_rate=float(s.beta_sum[rows].sum() / positions),
        tokens_per_step=dict(zip(keys, point.tolist(), strict=True)),
        ci_low=dict(zip(keys, low.tolist(), strict=True)),
        ci_high=dict(zip(keys, high.tolist(), strict=True)),
    )


@dataclass
class _PerPosition:
    beta: list[np.ndarray]  # per record [C]
    beta_hi: list[np.ndarray]
    top1: list[np.ndarray]
    confidence: list[np.ndarray]  # the drafter's probability of its own argmax


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
                    body: BodyMemo | None = None) -> _PerPosition:

    full_to_head = None
    if subset is not None:
        full_to_head = torch.full((vocab_size,), -1, dtype=torch.long)
        full_to_head[subset] = torch.arange(subset.numel())
    empty = [np.zeros(0)] * len(records)
    out = _PerPosition(list(empty), list(empty), list(empty), list(empty))
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


def _padded(arrays: Sequence[np.ndarray]) -> np.ndarray:
    width = max((len(a) for a in arrays), default=0)
    out = np.zeros((len(arrays), width))
    for i, a in enumerate(arrays):
        out[i, :len(a)] = a
    return out


def _replay(per: _PerPosition, lengths: np.ndarray, max_gamma: int, max_new: int, *,
            greedy: bool) -> _Steps:
    gammas = range(1, max_gamma + 1)
    if greedy:
        steps = np.stack([greedy_steps(per.beta, g, max_new) for g in gammas], 1)  # [N, G]
        steps_hi = steps
    else:
        beta, beta_hi = _padded(per.beta), _padded(per.beta_hi)
        steps = np.stack([expected_steps(beta, lengths, g, max_new) for g in gammas], 1)
        steps_hi = np.stack([expected_steps(beta_hi, lengths, g, max_new) for g in gammas], 1)
    return _Steps(
        tokens=lengths.astype(float), steps=steps, steps_hi=steps_hi,
        beta_sum=np.array([b.sum() for b in per.beta]), beta_hi_sum=np.array([b.sum() for b in per.beta_hi]),
        top1_sum=np.array([b.sum() for b in per.top1]),
    )


def _agreement(drafter_model: Any, traces: Traces, temperature: float, vocab_subset: Any,
               progress: Progress | None, body: BodyMemo | None = None
               ) -> tuple[Traces, _PerPosition, torch.Tensor | None]:
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
    steps = _replay(per, lengths, max_gamma, max_new, greedy=temperature <= 0)
    everything = np.ones(len(lengths), dtype=bool)
    overall = _summarize(steps, everything, n_bootstrap, confidence, seed)
    per_domain = {
        domain: _summarize(steps, np.array([r.info.domain == domain for r in selected.records]),
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
