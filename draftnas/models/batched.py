"""Speculative decoding of a batch: B sequences drafted and verified together over static caches.

Each sequence keeps its own length (prompts differ, and each step accepts a different number of
drafts per sequence), so every step reads at [B, T] positions, one row per sequence: the rollback
is ragged and costs nothing, as in `models.speculative` (the next step overwrites a sequence's
stale slots, which are masked until then). Greedy only; each sequence's output equals the target's
own greedy output for it.

What stays on the device: the drafted tokens (each draft step reads the previous one's argmax),
the verify input, the acceptance (the longest prefix of drafts equal to the target's argmax,
per sequence), the next positions and the last two tokens of each sequence. The host reads one
tensor per step (accepted counts, the target's next tokens and the drafts, in one copy) to
emit tokens and stop finished sequences; `BatchedOutput.host_reads` counts those reads.

A step always feeds the drafter the last two tokens of each sequence: a sequence that accepted
every draft needs both (the drafter never read its last draft), one that did not needs only the
last, and reading the one before again writes the same keys and values to the same slot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.models.decoder import KVCache, StaticDecoder
from draftnas.models.static_step import StaticStep


@dataclass
class BatchedOutput:
    """Tokens of each sequence (prompt excluded, cut at the budget or after an end-of-sequence
    token), drafts accepted per step and sequence (while it was running), and timing."""

    tokens: list[list[int]]
    accepted: list[list[int]] = field(default_factory=list)
    steps: int = 0
    drafts: int = 0  # tokens each sequence drafted, summed over steps (a step near the budget drafts fewer)
    host_reads: int = 0
    elapsed_s: float = 0.0
    # where the time went (speculative loop; seconds): "prefill", "draft" (the drafter's steps), "verify"
    # (the target's step and the acceptance on the device), "read" (the step's one host read: on CUDA it
    # waits for the queued work, so there draft and verify read low and read high), "bookkeeping" (the
    # per-sequence work on the host); `idle_rows`: rows the target verified for sequences already done
    split_s: dict[str, float] = field(default_factory=dict)
    idle_rows: int = 0
    rows: int = 0

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens over the time after the prompts' prefill (the steps alone)."""
        decode = self.elapsed_s - self.split_s.get("prefill", 0.0)
        return self.new_tokens / decode if decode > 0 else 0.0

    def step_ms(self) -> dict[str, float]:
        """Milliseconds per step of the whole batch, after the prefill: "draft" (one drafter step), "verify"
        (the target's verify of a step's drafts), or for plain decoding "decode" (the target's step)."""
        if not self.steps:
            return {}
        if not self.accepted:
            return {"decode": (self.elapsed_s - self.split_s.get("prefill", 0.0)) * 1e3 / self.steps}
        return {"draft": self.split_s.get("draft", 0.0) * 1e3 / max(self.drafts, 1),
                "verify": self.split_s.get("verify", 0.0) * 1e3 / self.steps}

    @property
    def tokens_per_step(self) -> float:
        """Tokens a sequence gains per speculative step, over every sequence's steps."""
        steps = sum(len(a) for a in self.accepted)
        return sum(sum(a) + len(a) for a in self.accepted) / steps if steps else 0.0


class BatchedStatic:
    """A `StaticDecoder` over a KV cache of `batch_size` rows and `slots` positions.

    `step(ids, positions)` reads [B, T] tokens at [B, T] positions and returns logits [B, T, V];
    with `capture` (CUDA) each step width is captured once as a CUDA graph whose input buffers are
    filled on the device (no host copy). Prompts are read one sequence at a time (`prefill`).
    """

    def __init__(self, decoder: StaticDecoder, batch_size: int, slots: int, *, capture: bool = False) -> None:
        self.decoder, self.batch_size, self.capture = decoder, batch_size, capture
        self.cache = decoder.new_cache(batch_size, slots)
        self.device = decoder.device
        self.steps: dict[int, StaticStep] = {}

    @property
    def slots(self) -> int:
        return self.cache.slots

    def prefill(self, row: int, tokens: Sequence[int]) -> None:
        """Read one sequence's `tokens` at positions 0.. into its row of the cache."""
        if not tokens:
            return
        view = KVCache(self.cache.keys[:, row:row + 1], self.cache.values[:, row:row + 1])
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        positions = torch.arange(len(tokens), device=self.device)
        self.decoder(ids, positions, view, keep=1, slots=len(tokens))

    def step(self, ids: torch.Tensor, positions: torch.Tensor, slots: int) -> torch.Tensor:
        """ids, positions: [B, T] on the device; `slots`: attend over the first `slots` slots (eager
        only; a captured step attends over the whole cache) -> logits [B, T, V]."""
        if not self.capture:
            return self.decoder(ids, positions, self.cache, slots=slots)
        width = int(ids.shape[1])
        step = self.steps.get(width)
        if step is None:
            step = self.steps[width] = StaticStep(self.decoder, self.cache, ids.clone(), positions.clone(),
                                                  capture=True)
        step.input_ids.copy_(ids)
        step.positions.copy_(positions)
        return step()


def _check(prompts: Sequence[Sequence[int]], engines: Sequence[BatchedStatic], max_new_tokens: int,
           extra: int, least: int) -> None:
    if max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    short = [i for i, p in enumerate(prompts) if len(p) < least]
    if short:
        raise InvalidInputError(f"prompts {short} have fewer than {least} tokens (a batched loop needs "
                                f"at least {least})")
    for engine in engines:
        if engine.batch_size != len(prompts):
            raise InvalidInputError(f"{len(prompts)} prompts for an engine of batch {engine.batch_size}")
        longest = max(len(p) for p in prompts) + max_new_tokens + extra
        if longest > engine.slots:
            raise InvalidInputError(f"sequences of up to {longest} tokens are longer than the engine's "
                                    f"cache ({engine.slots} slots)")


def _emit(tokens: list[int], new: list[int], budget: int, eos: set[int]) -> bool:
    """Append `new` to `tokens` up to the budget and an end-of-sequence token; True when done."""
    for tok in new:
        if len(tokens) >= budget:
            return True
        tokens.append(tok)
        if tok in eos:
            return True
    return len(tokens) >= budget


def batched_greedy(target: BatchedStatic, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                   eos_token_ids: Sequence[int] = (), budgets: Sequence[int] | None = None) -> BatchedOutput:
    """Plain greedy decoding of every prompt together: one [B, 1] step per token (the baseline).
    `budgets`: per sequence, its own token budget (default `max_new_tokens` for each)."""
    _check(prompts, [target], max_new_tokens, 1, 1)
    started = time.perf_counter()
    device, eos = target.device, set(eos_token_ids)
    out = BatchedOutput(tokens=[[] for _ in prompts])
    budget = list(budgets) if budgets is not None else [max_new_tokens] * len(prompts)
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            target.prefill(row, prompt[:-1])
        out.split_s = {"prefill": time.perf_counter() - started}  # one sequence at a time, as the loop's
        last = torch.tensor([[p[-1]] for p in prompts], dtype=torch.long, device=device)  # [B, 1]
        position = torch.tensor([[len(p) - 1] for p in prompts], dtype=torch.long, device=device)
        longest, done = max(len(p) for p in prompts), [False] * len(prompts)
        while not all(done):
            logits = target.step(last, position, longest + out.steps)
            last = logits[:, -1].argmax(-1, keepdim=True)
            position = position + 1
            out.steps += 1
            read = last[:, 0].tolist()
            out.host_reads += 1
            for row, tok in enumerate(read):
                if not done[row]:
                    done[row] = _emit(out.tokens[row], [tok], budget[row], eos)
    out.elapsed_s = time.perf_counter() - started
    return out


def batched_speculative_generate(target: BatchedStatic, drafter: BatchedStatic,
                                 prompts: Sequence[Sequence[int]], *, gamma: int, max_new_tokens: int,
                                 eos_token_ids: Sequence[int] = (),
                                 head_ids: torch.Tensor | None = None,
                                 replay: Sequence[Sequence[int]] | None = None,
                                 budgets: Sequence[int] | None = None) -> BatchedOutput:
    """Greedy speculative decoding of every prompt together (each sequence lossless).

    `head_ids`: the full-vocabulary id of each row of the drafter's reduced head (None: a full head).
    Each step drafts g = min(gamma, the largest remaining budget - 1) tokens for every sequence; a
    finished sequence keeps its row (its tokens are no longer emitted) until all are done.
    `replay`: per sequence, the accepted count of each step of a recorded run: every step does the
    same work, then accepts min(recorded, g) on the device; a sequence is done after its last recorded
    step. `budgets`: per sequence, its own token budget (default `max_new_tokens` for each).
    """
    if gamma < 1:
        raise InvalidInputError(f"gamma must be >= 1, got {gamma}")
    _check(prompts, [target, drafter], max_new_tokens, gamma + 1, 3)
    started = time.perf_counter()
    device, eos = target.device, set(eos_token_ids)
    table = None if head_ids is None else head_ids.to(device=device, dtype=torch.long)
    out = BatchedOutput(tokens=[[] for _ in prompts], accepted=[[] for _ in prompts])
    budget = list(budgets) if budgets is not None else [max_new_tokens] * len(prompts)
    forced = None
    if replay is not None:  # [steps, B] on the device, zero past a sequence's last step
        forced = torch.zeros((max(map(len, replay)), len(prompts)), dtype=torch.long)
        for row, counts in enumerate(replay):
            forced[:len(counts), row] = torch.tensor(list(counts), dtype=torch.long)
        forced = forced.to(device)
    split = dict.fromkeys(("prefill", "draft", "verify", "read", "bookkeeping"), 0.0)
    clock = time.perf_counter
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):  # the target holds all but the last token, the drafter
            target.prefill(row, prompt[:-1])   # all but the last two
            drafter.prefill(row, prompt[:-2])
        split["prefill"] = clock() - started
        last2 = torch.tensor([list(p[-2:]) for p in prompts], dtype=torch.long, device=device)  # [B, 2]
        length = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)  # [B]
        lengths, done = [len(p) for p in prompts], [False] * len(prompts)
        running = torch.ones(len(prompts), dtype=torch.bool, device=device)
        while not all(done):
            remaining = max(b - len(t) for t, b, d in zip(out.tokens, budget, done, strict=True) if not d)
            g = max(1, min(gamma, remaining - 1))
            span = max(lengths) + g  # slots the step reads: every position it writes lies below
            t0 = clock()
            feed, at = last2, torch.stack((length - 2, length - 1), dim=1)
            drafts = []
            for i in range(g):
                logits = drafter.step(feed, at, span)[:, -1]
                tok = logits.argmax(-1)
                if table is not None:
                    tok = table[tok]
                drafts.append(tok)
                feed, at = tok[:, None], (length + i)[:, None]
            drafted = torch.stack(drafts, dim=1)  # [B, g]
            t1 = clock()
            verify_at = length[:, None] - 1 + torch.arange(g + 1, device=device)
            best = target.step(torch.cat((last2[:, 1:], drafted), dim=1), verify_at, span).argmax(-1)
            k = (drafted == best[:, :g]).long().cumprod(dim=1).sum(dim=1)  # [B] drafts accepted
            if forced is not None:
                k = forced[out.steps].clamp(max=g)
            nxt = best.gather(1, k[:, None])[:, 0]
            t2 = clock()
            read = torch.cat((k, nxt, drafted.flatten())).tolist()  # the step's one read by the host
            t3 = clock()
            out.rows += len(prompts) * (g + 1)
            out.idle_rows += sum(done) * (g + 1)
            out.host_reads += 1
            out.steps += 1
            out.drafts += g
            n, finished = len(prompts), False
            for row in range(n):
                if done[row]:
                    continue
                accepted = read[row]
                lengths[row] += accepted + 1
                out.accepted[row].append(accepted)
                own = read[2 * n + row * g: 2 * n + row * g + accepted]
                done[row] = _emit(out.tokens[row], [*own, read[n + row]], budget[row], eos) or (
                    replay is not None and out.steps >= len(replay[row]))
                finished |= done[row]
            if finished:  # a finished sequence stays where it is (a copy to the device only then)
                running = torch.tensor([not d for d in done], device=device)
            before = torch.where(k > 0, drafted.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0], last2[:, 1])
            last2 = torch.where(running[:, None], torch.stack((before, nxt), dim=1), last2)
            length = torch.where(running, length + k + 1, length)
            t4 = clock()
            for key, spent in (("draft", t1 - t0), ("verify", t2 - t1), ("read", t3 - t2),
                               ("bookkeeping", t4 - t3)):
                split[key] += spent
    out.elapsed_s = time.perf_counter() - started
    out.split_s = split
    return out


def engines_for(target: StaticDecoder, drafter: StaticDecoder, prompts: Sequence[Sequence[int]],
                max_new_tokens: int, gamma: int, *,
                capture: bool = False) -> tuple[BatchedStatic, BatchedStatic]:
    """A target and a drafter engine sized for these prompts."""
    slots = max(len(p) for p in prompts) + max_new_tokens + gamma + 2
    return (BatchedStatic(target, len(prompts), slots, capture=capture),
            BatchedStatic(drafter, len(prompts), slots, capture=capture))
