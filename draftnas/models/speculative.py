"""Speculative decoding: a drafter proposes gamma tokens, the target verifies them in one pass.

One sequence at a time (batch 1). Each model runs behind an engine that reads tokens
at a given start position and returns logits:

- `HFEngine`: a transformers model over a DynamicCache; rejected tokens are rolled
  back with ``DynamicCache.crop`` (which takes a negative count of tokens to drop).
- `StaticEngine`: `draftnas.models.decoder.StaticDecoder` over a KV cache allocated once;
  rollback is moving the position (the next step overwrites the stale slots, which
  are masked out until then). On CUDA each step size (the 1-2 token draft step, the
  gamma + 1 token verify) is captured once as a CUDA graph and replayed, the way
  serving engines run them; the prompt's prefill runs eagerly.

Acceptance rule (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", alg. 1; Chen et al. 2023):

- greedy (temperature 0): accept drafted tokens while each equals the target's
  argmax; the step then emits the target's argmax at the first mismatch (or the
  bonus token after gamma accepted drafts). The output equals the target's own
  greedy output token for token.
- sampling: accept drafted x with probability min(1, p(x) / q(x)); at the first
  rejection emit a sample of norm(max(0, p - q)); after gamma accepted drafts emit
  a sample of p. Each emitted token is distributed exactly as p (lossless).

p and q are the temperature-T softmax of target and drafter. With `vocab_subset`
the drafter's head covers only those full-vocabulary ids; q is zero elsewhere.

A step drafts g = min(gamma, max_new_tokens - generated - 1) tokens (so the step
never overshoots the budget). Greedy steps keep everything on the device: each drafted
token is the argmax the next draft forward reads, the verify input is the known tokens
followed by the drafts, and the accepted count is computed there; the host reads one
tensor per step (accepted count, the target's argmaxes and the drafts) to emit tokens,
cutting after an end-of-sequence token (`SpeculativeOutput.host_reads` counts the reads).
Sampling steps draw on the host and stop drafting after an end-of-sequence token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.models.engines import Engine, EngineLike, as_engine, token_ids
from draftnas.models.proposers import ModelProposer, Proposal, Proposer, sample_token, token_probs


@dataclass
class SpeculativeOutput:
    """Result of one speculative generation (not a record: per-call detail).

    tokens: the new tokens (prompt excluded); accepted: drafts accepted per step;
    drafted: drafts proposed per step.
    """

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    draft_s: float = 0.0  # time spent in the drafter (all steps)
    host_reads: int = 0  # reads of device results by the host (greedy: one per step)
    # to the end of the first step: both models' prefill of the prompt, its first drafts and their verify,
    # and the tokens it emitted (what a decode-only figure leaves out, as a server's timings do)
    first_step_s: float = 0.0
    first_step_tokens: int = 0

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / max(self.steps, 1)


class _Clock:
    """Elapsed time of a stretch of work that may still be running on a GPU: CUDA events there (read
    after the step's one synchronization), the host's clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.begin.record()
        self.started, self.stopped = time.perf_counter(), 0.0

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        self.stopped = time.perf_counter()

    def seconds(self) -> float:
        """Call after the work has finished (the host has read its result)."""
        return self.begin.elapsed_time(self.end) / 1e3 if self.cuda else self.stopped - self.started


def _verify(target: Engine, proposer: Proposer, ids: torch.Tensor, cached: int, keep: int) -> torch.Tensor:
    """The target's logits [keep, V] over `ids` read at `cached`; a proposer that reads the target's hidden
    states gets them for those rows."""
    if not proposer.hidden_layers:
        return target.forward(ids, cached, keep)
    forward_hidden = getattr(target, "forward_hidden", None)
    if forward_hidden is None:
        raise InvalidInputError(f"the drafter reads the target's hidden states, which a "
                                f"{type(target).__name__} does not return (HFEngine and StaticEngine do)")
    logits, hidden = forward_hidden(ids, cached, keep, proposer.hidden_layers)
    proposer.observe(hidden)
    return logits


def _greedy_step(target: Engine, proposer: Proposer, seq: list[int], cached: int, g: int,
                 forced: int | None = None) -> tuple[list[int], int, int, Proposal]:
    """One greedy step, read once by the host: (drafts, accepted count k, the target's next token, the
    proposal). The target reads seq[cached:] and the drafts; `forced`: a replay's count, taken for k after
    the same work and read (the next token is the target's at that k)."""
    clock = _Clock(target.device)
    proposal = proposer.propose(seq, g)
    clock.stop()
    device = target.device
    drafted = proposal.tokens.to(device)
    g = len(proposal)
    ids = torch.cat((token_ids(seq[cached:], device)[0], drafted))
    logits = _verify(target, proposer, ids, cached, g + 1)
    best = logits.argmax(-1)  # [g + 1]
    k = (drafted == best[:g]).long().cumprod(0).sum().reshape(1)
    read = torch.cat((k, best, drafted)).tolist()  # the step's one read by the host
    k_ = int(read[0]) if forced is None else min(forced, g)
    proposal.seconds = clock.seconds()
    return [int(t) for t in read[g + 2:]], k_, int(read[1 + k_]), proposal


def _accept(target_logits: torch.Tensor, drafts: list[int], qs: Sequence[torch.Tensor | None],
            temperature: float, generator: torch.Generator | None) -> tuple[int, int]:
    """(accepted count k, the target's next token). target_logits: [len(drafts) + 1, V]; qs: the
    distribution each draft was drawn from (`None`: a point mass on it, as a lookup draft)."""

    if temperature <= 0:
        best = target_logits.argmax(-1).tolist()
        k = 0
        while k < len(drafts) and drafts[k] == best[k]:
            k += 1
        return k, int(best[k])
    p = token_probs(target_logits, temperature).cpu()  # [g+1, V]
    for k, tok in enumerate(drafts):
        q = qs[k] if k < len(qs) else None
        if q is None:  # a point mass: accept with p(x), else draw from p with x removed
            q = torch.zeros_like(p[k])
            q[tok] = 1.0
        q = q.cpu()
        ratio = float(p[k, tok]) / max(float(q[tok]), 1e-30)
        if float(torch.rand(1, generator=generator)) < min(1.0, ratio):
            continue
        residual = (p[k] - q).clamp(min=0.0)
        mass = float(residual.sum())
        return k, sample_token(residual / mass if mass > 0 else p[k], generator)
    return len(drafts), sample_token(p[len(drafts)], generator)


def speculate(
    target: EngineLike,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    gamma: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    eos_token_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    replay: Sequence[tuple[int, int]] | None = None,
) -> SpeculativeOutput:
    """The speculative loop every drafter family runs through: each step asks `proposer` for up to
    g = min(gamma, max_new_tokens - generated - 1) drafts (a proposer may return fewer, or none: the step
    is then a plain decode), the target verifies them in one pass, and the step emits the accepted drafts
    and the target's next token (Leviathan et al. 2023, alg. 1; lossless greedy and sampled).

    A proposer that does not draft at the prefill (`Proposer.drafts_at_prefill`: lookup waits for the
    target's first token) gets a first step that reads the prompt alone and emits that token; it is not
    counted as a speculative step.
    `replay`: (drafted, accepted) per step of a recorded run (greedy): each step proposes the recorded
    count and verifies as usual, then accepts the recorded count; the run stops after the last recorded
    step (`draftnas bench --replay` times a recorded run over random weights of its models' shapes).
    """
    if replay is not None and temperature > 0:
        raise InvalidInputError("a replay of recorded accepted counts is greedy: temperature 0")
    if gamma < 0 or max_new_tokens < 1 or temperature < 0:
        raise InvalidInputError(f"need gamma >= 0, max_new_tokens >= 1, temperature >= 0; got "
                                f"{gamma}, {max_new_tokens}, {temperature:g}")
    started = time.perf_counter()
    engine = as_engine(target)
    engine.reset()
    proposer.reset(prompt_ids)
    cached, seq, eos = 0, list(prompt_ids), set(eos_token_ids)
    out = SpeculativeOutput(tokens=[])
    with torch.inference_mode():
        if not proposer.drafts_at_prefill:  # the prompt's prefill alone emits the first token
            first = int(_verify(engine, proposer, token_ids(seq, engine.device)[0], 0, 1)[-1].argmax())
            seq.append(first)
            out.tokens.append(first)
            cached = len(prompt_ids)
            proposer.rollback(cached)
        while len(out.tokens) < max_new_tokens and (replay is None or out.steps < len(replay)) \
                and not (out.tokens and out.tokens[-1] in eos):
            base = len(seq)
            g, forced = max(0, min(gamma, max_new_tokens - len(out.tokens) - 1)), None
            if replay is not None:
                g, forced = replay[out.steps]
            if temperature > 0:
                proposal = proposer.propose(seq, g, temperature=temperature, generator=generator)
                drafts = proposal.tokens.tolist()
                logits = _verify(engine, proposer, token_ids(seq[cached:] + drafts, engine.device)[0], cached,
                                 len(drafts) + 1)  # [g+1, V]
                k, nxt = _accept(logits, drafts, proposal.qs, temperature, generator)
                out.host_reads += len(drafts) + 1
            else:
                drafts, k, nxt, proposal = _greedy_step(engine, proposer, seq, cached, g, forced)
                out.host_reads += 1
            out.draft_s += proposal.seconds
            out.host_reads += proposal.host_reads
            stopped = emit_step(out, seq, drafts[:k] + [nxt], len(drafts), k, eos, max_new_tokens)
            if out.steps == 1:
                out.first_step_s, out.first_step_tokens = time.perf_counter() - started, len(out.tokens)
            cached = base + k  # the target read seq + all drafts; keep the accepted ones
            proposer.rollback(base + k)
            if stopped:
                break
    out.elapsed_s = time.perf_counter() - started
    return out


def drafter_proposer(drafter: EngineLike, vocab_size: int, vocab_subset: Any = None, *, p_min: float = 0.0,
                     eos: Sequence[int] = ()) -> ModelProposer:
    """The model-drafter family's proposer for a transformers model or an engine; `vocab_subset`: the
    full-vocabulary ids of a reduced draft head's rows (default: the subset
    `draftnas.drafter.vocab.apply_vocab_subset` attached to the drafter model, if any)."""
    if vocab_subset is None:
        vocab_subset = getattr(drafter, "draft_vocab_subset", None)
    if vocab_subset is not None and hasattr(vocab_subset, "ids"):
        vocab_subset = list(vocab_subset.ids)
    subset = None if vocab_subset is None else torch.as_tensor(vocab_subset, dtype=torch.long)
    return ModelProposer(as_engine(drafter), vocab_size, subset, p_min=p_min, eos=eos)


def speculative_generate(
    target: EngineLike,
    drafter: EngineLike,
    prompt_ids: Sequence[int],
    *,
    gamma: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    eos_token_ids: Sequence[int] = (),
    vocab_subset: Any = None,
    generator: torch.Generator | None = None,
    replay: Sequence[tuple[int, int]] | None = None,
    p_min: float = 0.0,
) -> SpeculativeOutput:
    """Generate up to `max_new_tokens` new tokens after `prompt_ids`, `drafter` proposing (`speculate`
    with the model-drafter family's proposer).

    target, drafter: causal LMs sharing a tokenizer (drafter's input vocabulary = target's),
    as transformers models or engines (`HFEngine`, `StaticEngine`; an engine is reset and
    reused across calls). Stops after an end-of-sequence token (included in the output).
    `vocab_subset`: see `drafter_proposer`. `replay`: see `speculate`.
    `p_min` (greedy): a confidence stop; each step drafts up to gamma tokens and stops after the first
    whose drafter probability is below p_min (the rule of transformers' `assistant_confidence_threshold`).
    """

    if p_min > 0 and temperature > 0 or not 0 <= p_min < 1:
        raise InvalidInputError(f"a confidence stop p_min must be in [0, 1) and runs greedy (temperature 0); "
                                f"got p_min {p_min:g} at temperature {temperature:g}")
    proposer = drafter_proposer(drafter, as_engine(target).vocab_size, vocab_subset,
                                p_min=p_min if replay is None else 0.0, eos=eos_token_ids)
    return speculate(target, proposer, prompt_ids, gamma=gamma, max_new_tokens=max_new_tokens,
                     temperature=temperature, eos_token_ids=eos_token_ids, generator=generator, replay=replay)


def emit_step(out: SpeculativeOutput, seq: list[int], emitted: list[int], drafted: int, k: int, eos: set[int],
              max_new_tokens: int) -> bool:
    """Append one step's tokens to `seq` and `out` (cut after an end-of-sequence token and at the budget),
    with its accepted and drafted counts; whether an end-of-sequence token stopped it."""
    stop = next((j for j, t in enumerate(emitted) if t in eos), None)
    if stop is not None:
        emitted = emitted[:stop + 1]
    emitted = emitted[:max_new_tokens - len(out.tokens)]
    seq += emitted
    out.tokens += emitted
    out.accepted.append(k)
    out.drafted.append(drafted)
    return stop is not None


@dataclass
class GreedyOutput:
    """Plain greedy decoding: tokens, and per token the logit margin top-1 minus top-2."""

    tokens: list[int]
    margins: list[float]
    elapsed_s: float
    first_step_s: float = 0.0  # the prompt's prefill and the first token


def greedy_decode(model: EngineLike, prompt_ids: Sequence[int], *, max_new_tokens: int,
                  eos_token_ids: Sequence[int] = ()) -> GreedyOutput:
    """Plain greedy decoding with a KV cache (the reference speculative greedy must reproduce).

    `model`: a transformers model or an engine. The margins tell a numerical near-tie (a
    speculative run may pick the other token in bf16) from a real divergence.
    """

    engine = as_engine(model)
    engine.reset()
    eos, tokens, margins = set(eos_token_ids), [], []
    feed, start = list(prompt_ids), 0
    started, first = time.perf_counter(), 0.0
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = engine.forward(feed, start, 1)[-1]
            start += len(feed)
            tokens.append(int(logits.argmax()))  # argmax, as the speculative loop picks
            first = first or time.perf_counter() - started
            top2 = logits.float().topk(2).values.tolist()
            margins.append(top2[0] - top2[1])
            if tokens[-1] in eos:
                break
            feed = [tokens[-1]]
    return GreedyOutput(tokens=tokens, margins=margins, elapsed_s=time.perf_counter() - started,
                        first_step_s=first)


def greedy_generate(model: EngineLike, prompt_ids: Sequence[int], *, max_new_tokens: int,
                    eos_token_ids: Sequence[int] = ()) -> list[int]:
    """`greedy_decode`'s tokens."""
    return greedy_decode(model, prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids).tokens
