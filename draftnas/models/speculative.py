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


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


class _Drafter:
    """The drafter's engine and how many positions it holds; maps its head (maybe a vocabulary
    subset) to full ids."""

    def __init__(self, engine: Engine, vocab_size: int, vocab_subset: torch.Tensor | None) -> None:
        self.engine, self.cached = engine, 0
        self.vocab_size, self.subset = vocab_size, vocab_subset
        self.table = None if vocab_subset is None else vocab_subset.to(engine.device)  # copied once

    def next_logits(self, feed: list[int] | torch.Tensor) -> torch.Tensor:
        """Logits over the head [V_head] after reading `feed` (after the cached positions)."""
        logits = self.engine.forward(feed, self.cached, 1)[-1]
        self.cached += len(feed)
        if self.table is not None and logits.shape[-1] != self.table.numel():
            logits = logits[self.table.to(logits.device)]
        return logits

    def next_token(self, feed: list[int] | torch.Tensor, p_min: float = 0.0) -> tuple[torch.Tensor, bool]:
        """The greedy draft after reading `feed`, a full-vocabulary id [1] left on the device, and whether
        drafting goes on: with `p_min` > 0 the host reads the drafter's probability of that draft (over
        its head) and stops below it."""
        logits = self.next_logits(feed)
        index = logits.argmax().reshape(1)
        go_on = p_min <= 0 or float(torch.softmax(logits.float(), dim=-1).amax()) >= p_min
        return (index if self.table is None else self.table.to(index.device)[index]), go_on

    def to_full(self, head_index: int) -> int:
        return int(self.subset[head_index]) if self.subset is not None else head_index

    def full_probs(self, head_probs: torch.Tensor) -> torch.Tensor:
        """q over the full vocabulary [V] (zero outside the subset)."""

        if self.subset is None:
            return head_probs
        full = torch.zeros(self.vocab_size, dtype=head_probs.dtype, device=head_probs.device)
        full[self.subset.to(head_probs.device)] = head_probs
        return full

    def rollback(self, length: int) -> None:
        self.cached = min(self.cached, length)


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _draft(drafter: _Drafter, seq: list[int], g: int, temperature: float, eos: set[int],
           generator: torch.Generator | None) -> tuple[list[int], list[torch.Tensor]]:
    """Sampling: g drafted tokens (fewer after an EOS) and q over the full vocabulary for each."""
    drafts: list[int] = []
    qs: list[torch.Tensor] = []
    feed = seq[drafter.cached:]
    for _ in range(g):
        q = _probs(drafter.next_logits(feed), temperature)
        tok = drafter.to_full(_sample(q, generator))
        qs.append(drafter.full_probs(q))
        drafts.append(tok)
        feed = [tok]
        if tok in eos:
            break
    return drafts, qs


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


def _greedy_step(draft: _Drafter, target: Engine, seq: list[int], cached: int, g: int,
                 forced: int | None = None, p_min: float = 0.0) -> tuple[list[int], int, int, float]:
    """One greedy step on the device, read once: (drafts, accepted count k, the target's next token,
    seconds spent drafting). The target reads seq[cached:] and the drafts: g of them, or with `p_min` up
    to the first the drafter gives less than p_min (one more host read per draft). `forced`: a replay's
    count, taken for k after the same work and read (the next token is the target's at that k)."""
    clock = _Clock(draft.engine.device)
    feed: list[int] | torch.Tensor = seq[draft.cached:]
    drafts: list[torch.Tensor] = []
    for _ in range(g):
        token, go_on = draft.next_token(feed, p_min)
        drafts.append(token)
        feed = token
        if not go_on:
            break
    g = len(drafts)
    clock.stop()
    device = target.device
    drafted = torch.cat(drafts).to(device) if drafts else torch.empty(0, dtype=torch.long, device=device)
    logits = target.forward(torch.cat((token_ids(seq[cached:], device)[0], drafted)), cached, g + 1)
    best = logits.argmax(-1)  # [g + 1]
    k = (drafted == best[:g]).long().cumprod(0).sum().reshape(1)
    read = torch.cat((k, best, drafted)).tolist()  # the step's one read by the host
    k_ = int(read[0]) if forced is None else min(forced, g)
    return [int(t) for t in read[g + 2:]], k_, int(read[1 + k_]), clock.seconds()


def _accept(target_logits: torch.Tensor, drafts: list[int], qs: list[torch.Tensor], temperature: float,
            generator: torch.Generator | None) -> tuple[int, int]:
    """(accepted count k, the target's next token). target_logits: [len(drafts) + 1, V]."""

    if temperature <= 0:
        best = target_logits.argmax(-1).tolist()
        k = 0
        while k < len(drafts) and drafts[k] == best[k]:
            k += 1
        return k, int(best[k])
    p = _probs(target_logits, temperature).cpu()  # [g+1, V]
    qs = [q.cpu() for q in qs]
    for k, tok in enumerate(drafts):
        ratio = float(p[k, tok]) / max(float(qs[k][tok]), 1e-30)
        if float(torch.rand(1, generator=generator)) < min(1.0, ratio):
            continue
        residual = (p[k] - qs[k]).clamp(min=0.0)
        mass = float(residual.sum())
        return k, _sample(residual / mass if mass > 0 else p[k], generator)
    return len(drafts), _sample(p[len(drafts)], generator)


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
    """Generate up to `max_new_tokens` new tokens after `prompt_ids` with speculative decoding.

    target, drafter: causal LMs sharing a tokenizer (drafter's input vocabulary = target's),
    as transformers models or engines (`HFEngine`, `StaticEngine`; an engine is reset and
    reused across calls). Stops after an end-of-sequence token (included in the output).
    `vocab_subset`: the full-vocabulary ids of a reduced draft head's rows (default: the
    subset `draftnas.drafter.vocab.apply_vocab_subset` attached to the drafter model, if any).
    `replay`: (drafted, accepted) per step of a recorded run (greedy): each step drafts and verifies as
    usual, then accepts the recorded count; the run stops after the last recorded step (a replay over
    random weights of the recorded models' shapes times the recorded run, `draftnas bench --replay`).
    `p_min` (greedy): a confidence stop; each step drafts up to gamma tokens and stops after the first
    whose drafter probability is below p_min (the rule of transformers' `assistant_confidence_threshold`).
    """

    if replay is not None and temperature > 0:
        raise InvalidInputError("a replay of recorded accepted counts is greedy: temperature 0")
    if p_min > 0 and temperature > 0 or not 0 <= p_min < 1:
        raise InvalidInputError(f"a confidence stop p_min must be in [0, 1) and runs greedy (temperature 0); "
                                f"got p_min {p_min:g} at temperature {temperature:g}")
    if gamma < 0 or max_new_tokens < 1 or temperature < 0:
        raise InvalidInputError(f"need gamma >= 0, max_new_tokens >= 1, temperature >= 0; got "
                                f"{gamma}, {max_new_tokens}, {temperature:g}")
    started = time.perf_counter()
    if vocab_subset is None:  # a drafter given a reduced head by draftnas.drafter.vocab.apply_vocab_subset
        vocab_subset = getattr(drafter, "draft_vocab_subset", None)
    if vocab_subset is not None and hasattr(vocab_subset, "ids"):
        vocab_subset = list(vocab_subset.ids)
    subset = None if vocab_subset is None else torch.as_tensor(vocab_subset, dtype=torch.long)
    target_engine, draft_engine = as_engine(target), as_engine(drafter)
    target_engine.reset()
    draft_engine.reset()
    vocab_size = target_engine.vocab_size
    draft = _Drafter(draft_engine, vocab_size, subset)
    cached = 0
    seq, eos = list(prompt_ids), set(eos_token_ids)
    out = SpeculativeOutput(tokens=[])
    with torch.inference_mode():
        while len(out.tokens) < max_new_tokens and (replay is None or out.steps < len(replay)):
            base = len(seq)
            g = max(0, min(gamma, max_new_tokens - len(out.tokens) - 1))
            forced = None
            if replay is not None:
                g, forced = replay[out.steps]
            if temperature > 0:
                t0 = time.perf_counter()
                drafts, qs = _draft(draft, seq, g, temperature, eos, generator)
                out.draft_s += time.perf_counter() - t0
                logits = target_engine.forward(seq[cached:] + drafts, cached, len(drafts) + 1)  # [g+1, V]
                k, nxt = _accept(logits, drafts, qs, temperature, generator)
                out.host_reads += len(drafts) + 1
            else:
                drafts, k, nxt, draft_s = _greedy_step(draft, target_engine, seq, cached, g, forced,
                                                       p_min if replay is None else 0.0)
                out.draft_s += draft_s
                out.host_reads += 1 + (len(drafts) if p_min > 0 and replay is None else 0)
            stopped = emit_step(out, seq, drafts[:k] + [nxt], len(drafts), k, eos, max_new_tokens)
            if out.steps == 1:
                out.first_step_s, out.first_step_tokens = time.perf_counter() - started, len(out.tokens)
            cached = base + k  # the target read seq + all drafts; keep the accepted ones
            draft.rollback(base + min(k, max(len(drafts) - 1, 0)) if drafts else draft.cached)
            if stopped:
                break
    out.elapsed_s = time.perf_counter() - started
    return out


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
