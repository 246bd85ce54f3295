"""vLLM as a latency source: the target's and the drafters' forward passes and vLLM's own work per step, timed
inside vLLM's engine process, and the model the search prices vLLM drafters with.

One speculative step of vLLM's `draft_model` proposer (0.32, read from its forwards as timed here): the
target verifies γ + 1 tokens per sequence in one forward and its head scores all of them; the drafter reads
the verified positions in one forward (γ + 2 tokens per sequence, `catch_up_tokens` = 2), which drafts the
first token, then drafts the rest one forward each (γ forwards in all, each with its head over one row a
sequence). So at batch B a step costs

    overhead_spec(B) + T(B(γ + 1)) + H(B(γ + 1)) + D(B(γ + c)) + (γ - 1) D(B) + γ h(B)

and a plain step overhead_plain(B) + T(B) + H(B), where T(n) and D(n) are the target's and the drafter's
forward over n tokens (vLLM's forward stops at the last hidden states), H(r) and h(r) their heads
(`compute_logits`) over r rows, and the overheads are the rest of a step's wall time (scheduling, sampling,
rejection, bookkeeping), measured per batch size as (a request group's seconds - its forwards) / its steps.

An `ngram` (lookup) step drafts at no model's cost: overhead_ngram(B) + T(B(k + 1)) + H(B(k + 1)) for the k
tokens it found to draft (0 where it found no match).

An `eagle3` head's step is a model drafter's with the head's own parts: its fc over the target's states of
the verified positions F(B(γ + c_h)), its first forward over them E(B(γ + c_h)), γ - 1 one-token forwards
E(B), γ heads h_e(B) over its draft vocabulary, and the head's step overhead. A head is priced from the
shape timed (`head_label`, draft vocabulary `head_rows`) and no other: the calibration times one head, an
untrained one of that shape (acceptance does not change what a forward reads).

The calibration that times these parts inside vLLM is `latency.vllm_timing`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftnas.core.engine_kinds import VLLM
from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.records import CpuIdentity, Record, write_json_file
from draftnas.core.registry import Architecture
from draftnas.latency.llama_cpp import store_path as calibration_path

log = logging.getLogger(__name__)
WIDTHS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")


@dataclass(frozen=True)
class Chain:
    """A request's drafts as any γ meets them (greedy): at each position of its answer (the prefill gives the
    first token), how many of the drafts after it the target takes, up to the most a step drafts; and the
    new tokens it stops at. A drafter whose drafts at a smaller γ are the first of its drafts at a larger
    (a draft model, a head) takes min(γ, run) there, so one chain prices every γ and a γ that changes from
    step to step (a batch-size schedule)."""

    runs: tuple[int, ...]
    end: int

    def accepted(self, position: int, gamma: int) -> int:
        return min(gamma, self.runs[position])

    def walk(self, gamma: int) -> list[tuple[int, int]]:
        """Its steps at a fixed γ, (accepted, drafted) each."""
        steps, t = [], 0
        while t < self.end - 1:
            a = self.accepted(t, gamma)
            steps.append((a, gamma))
            t += a + 1
        return steps


Walk = Sequence[tuple[int, int]] | Chain  # a request's replayed steps at one γ, or its chain


@dataclass(frozen=True)
class VllmCalibration(Record):
    """vLLM timed on this host: ms per forward by the tokens it read (the target's; the base's per depth),
    ms per head by the rows it scored (the target's; the base's, the same at every depth), vLLM's own ms per
    step beyond them by batch size (plain and speculative steps), and how many tokens per sequence beyond γ
    the drafter's first forward of a step reads."""

    engine: str
    version: str
    device: str
    cpu: CpuIdentity
    threads: int
    target: str
    base: str
    gamma: int
    batches: tuple[int, ...]
    prompt_tokens: int
    target_ms: dict[int, float]
    target_head_ms: dict[int, float]
    drafter_ms: dict[int, dict[int, float]]
    drafter_head_ms: dict[int, float]
    plain_overhead_ms: dict[int, float]
    spec_overhead_ms: dict[int, float]
    catch_up_tokens: int
    ngram_overhead_ms: dict[int, float] = field(default_factory=dict)
    head_label: str = ""  # the eagle3 head timed ("" where none was): `HeadShape.label()`
    head_rows: int = 0  # its draft vocabulary
    head_ms: dict[int, float] = field(default_factory=dict)  # its forward by tokens
    head_fc_ms: dict[int, float] = field(default_factory=dict)  # its fc over the target's states, by rows
    head_logits_ms: dict[int, float] = field(default_factory=dict)  # its head by rows
    head_overhead_ms: dict[int, float] = field(default_factory=dict)  # vLLM's own work per step, by batch
    head_catch_up_tokens: int = 0
    forwards: int = 0  # forwards timed in all
    wall_s: float = 0.0
    timed_at: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)


def piecewise(points: dict[int, float], x: float) -> float:
    """`points` joined by straight lines, extended past the last two (and held below the first)."""
    xs = sorted(points)
    if len(xs) == 1 or x <= xs[0]:
        return points[xs[0]]
    if x <= xs[-1]:
        return float(np.interp(x, xs, [points[k] for k in xs]))
    a, b = xs[-2], xs[-1]
    return points[b] + (points[b] - points[a]) / (b - a) * (x - b)


def store_path(request: dict[str, object]) -> Path:
    """Where the vLLM calibration for `request` (host, vLLM, files, batches, γ) is kept."""
    return calibration_path(request, VLLM)


def stored_or_calibrated(path: Path, calibrate: Callable[[], VllmCalibration]) -> tuple[VllmCalibration, str]:
    """The calibration stored at `path` (same host, vLLM, files and settings), else a new one stored there.
    Returns it and where it came from."""
    if path.is_file():
        try:
            stored = VllmCalibration.from_dict(json.loads(path.read_text()))
            return stored, (f"stored vLLM calibration {path} reused (timed {stored.timed_at}; delete it to "
                            "time again)")
        except (ValueError, KeyError, TypeError):
            log.info("stored vLLM calibration %s unreadable; timing again", path)
    calibration = calibrate()
    write_json_file(path, calibration.to_dict())
    return calibration, f"vLLM calibration stored in {path}"


class VllmModel:
    """Prices shapes in vLLM from a `VllmCalibration`; `predict_ms` has `LatencyModel`'s signature. The
    target's shape reads the target's forwards; any other is a drafter of the base's width, priced from the
    line through the depths timed. A reduced draft head is priced at the full vocabulary: vLLM loads the
    export's full-head copy (`export --full-head`), not its custom head. `head` is the shape the search
    prices the calibration's timed eagle3 head as (`drafter.head.shape.priced_arch`): that shape with the
    head's draft vocabulary is priced from the head's own timings."""

    def __init__(self, calibration: VllmCalibration, target: Architecture, base: Architecture,
                 head: Architecture | None = None) -> None:
        self.calibration, self.target, self.base = calibration, target, base
        self.head = head if calibration.head_label else None

    def is_head(self, arch: Architecture | None, head_vocab_size: int | None = None) -> bool:
        """Whether `arch` (with `head_vocab_size` rows, where given) is the eagle3 head this calibration
        timed."""
        return (self.head is not None and arch is not None
                and arch.with_shape(name="") == self.head.with_shape(name="")
                and head_vocab_size in (None, self.calibration.head_rows))

    def _head_check(self, arch: Architecture | None) -> None:
        if not self.is_head(arch):
            timed = self.calibration.head_label or "none"
            raise InfeasibleCandidateError(f"vLLM timed one eagle3 head here ({timed}); "
                                           f"{arch.name if arch else 'this head'} is not it")

    @property
    def max_batch_size(self) -> int:
        return max(self.calibration.batches)

    def timed_batches(self) -> tuple[int, ...]:
        return tuple(b for b in self.calibration.batches if b > 1)

    def for_weights(self, weights: str) -> VllmModel:
        if weights != "dense":
            raise InfeasibleCandidateError(f"{weights} drafters: vLLM runs draft models dense (fp32 here)")
        return self

    def _drafter_ms(self, arch: Architecture, tokens: float) -> float:
        if any(getattr(arch, w) != getattr(self.base, w) for w in WIDTHS):
            raise InfeasibleCandidateError(f"vLLM was timed here with drafters of {self.base.name}'s full "
                                           f"width and vocabulary only; {arch.name} differs")
        at = {depth: piecewise(points, tokens) for depth, points in self.calibration.drafter_ms.items()}
        if len(at) == 1:
            return next(iter(at.values()))
        (d0, m0), (d1, m1) = sorted(at.items())[0], sorted(at.items())[-1]
        return m0 + (m1 - m0) / (d1 - d0) * (arch.num_hidden_layers - d0)

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        """The target: a step's forward, its head and vLLM's own work for that step (a verify of k > 1
        tokens a sequence scores every one and carries the speculative step's work; a prefill,
        `context_tokens` 0, scores one row a sequence and carries the plain step's). A drafter: its one-token
        forward and head over the batch."""
        c = self.calibration
        tokens = batch_size * new_tokens
        if arch.with_shape(name="") == self.target.with_shape(name=""):
            spec = new_tokens > 1 and context_tokens > 0
            overhead = piecewise(c.spec_overhead_ms if spec else c.plain_overhead_ms, batch_size)
            head = piecewise(c.target_head_ms, tokens if spec else batch_size)
            return piecewise(c.target_ms, tokens) + head + overhead
        if self.is_head(arch, head_vocab_size):
            return piecewise(c.head_ms, tokens) + piecewise(c.head_logits_ms, batch_size)
        return self._drafter_ms(arch, tokens) + piecewise(c.drafter_head_ms, batch_size)

    def drafter_batch_ms(self, arch: Architecture, tokens: int, batch_size: int = 1) -> float:
        """What the drafter's first forward of a step costs beyond a one-token one: it reads the `tokens` the
        target verified and `catch_up_tokens` - 1 more per sequence (its head still scores one row each). A
        head's also carries its fc over those rows and the difference between its step's overhead and a
        model drafter's (which the target's verify carries)."""
        c = self.calibration
        if self.is_head(arch):
            rows = batch_size * (tokens - 1 + c.head_catch_up_tokens)
            return (self._first_ms("head", arch, rows) - piecewise(c.head_ms, batch_size)
                    + piecewise(c.head_overhead_ms, batch_size) - piecewise(c.spec_overhead_ms, batch_size))
        first = self._drafter_ms(arch, batch_size * (tokens - 1 + c.catch_up_tokens))
        return first - self._drafter_ms(arch, batch_size)

    def _first_ms(self, kind: str, drafter: Architecture, tokens: float) -> float:
        """A drafter's first forward of a step over `tokens` (a head's with its fc over them)."""
        c = self.calibration
        if kind == "head":
            self._head_check(drafter)
            return piecewise(c.head_ms, tokens) + piecewise(c.head_fc_ms, tokens)
        return self._drafter_ms(drafter, tokens)

    def group_ms(self, kind: str, drafter: Architecture | None, gamma: int | Callable[[int], int],
                 prompt_tokens: Sequence[int], walks: Sequence[Walk]) -> float:
        """Requests submitted together and run in lockstep, as vLLM's continuous batching runs requests that
        arrive at once: one prefill of every prompt (which gives each its first token), then a step per
        round over the sequences not yet finished, each step priced at the batch still running. `walks`
        holds each request's steps after its prefill, (accepted, drafted) each, or its `Chain`: `kind`
        "target" (the target alone, a token a step: drafted 0), "model" or "head" (a drafter at `gamma`:
        each step verifies what the step before drafted and one more a sequence, the drafter catches up
        and drafts γ) or "lookup" (each step verifies what it drafted and one more). `gamma` may follow the
        batch, as a schedule's does in vLLM: each step drafts the γ of the sequences it ran (the last
        step's drafts too, which no step verifies), and a chain takes what the next step verifies of them.
        A single request is a group of one."""
        c = self.calibration
        overheads = {"target": c.plain_overhead_ms, "model": c.spec_overhead_ms,
                     "lookup": c.ngram_overhead_ms or c.spec_overhead_ms, "head": c.head_overhead_ms}
        if not overheads.get(kind):
            raise InfeasibleCandidateError(f"a {kind} drafter's steps are not in this vLLM calibration")
        gamma_at = gamma if callable(gamma) else (lambda _: gamma)
        overhead = overheads[kind]
        batch = len(prompt_tokens)
        total = (piecewise(c.target_ms, sum(prompt_tokens)) + piecewise(c.target_head_ms, batch)
                 + piecewise(overhead, batch))
        drafts = kind in ("model", "head")
        catch_up = c.head_catch_up_tokens if kind == "head" else c.catch_up_tokens
        drafted = gamma_at(batch)  # what the prefill's step drafted, which the first step verifies
        if drafts:
            assert drafter is not None
            total += (self._first_ms(kind, drafter, sum(p + 1 for p in prompt_tokens))
                      + self._drafts(kind, drafter, drafted, batch))
        at = [0] * len(walks)  # each request's step (a list) or position in its answer (a chain)
        while running := [i for i, w in enumerate(walks) if at[i] < (w.end - 1 if isinstance(w, Chain)
                                                                      else len(w))]:
            b = len(running)
            steps = []
            for i in running:
                w = walks[i]
                step = (w.accepted(at[i], drafted), drafted) if isinstance(w, Chain) else w[at[i]]
                at[i] += step[0] + 1 if isinstance(w, Chain) else 1
                steps.append(step)
            verified = b * (drafted + 1) if drafts else sum(1 + d for _, d in steps)
            total += (piecewise(c.target_ms, verified) + piecewise(c.target_head_ms, verified)
                      + piecewise(overhead, b))
            if drafts:
                assert drafter is not None
                total += self._first_ms(kind, drafter, b * (drafted + catch_up))
                drafted = gamma_at(b)
                total += self._drafts(kind, drafter, drafted, b)
        return total

    def _drafts(self, kind: str, drafter: Architecture, gamma: int, batch: int) -> float:
        """The drafts after a drafter's first forward of a step: γ - 1 one-token forwards over the batch and
        γ heads (the first forward drafts the first token); none at γ 0, where a batch schedule drafts
        nothing and vLLM still runs that first forward (to keep the drafter's cache) but no head."""
        c = self.calibration
        one = piecewise(c.head_ms, batch) if kind == "head" else self._drafter_ms(drafter, batch)
        head = c.head_logits_ms if kind == "head" else c.drafter_head_ms
        return max(gamma - 1, 0) * one + gamma * piecewise(head, batch)

    def summary(self) -> str:
        c = self.calibration
        decode = piecewise(c.target_ms, 1) + piecewise(c.target_head_ms, 1)
        verify = piecewise(c.target_ms, c.gamma + 1) + piecewise(c.target_head_ms, c.gamma + 1)
        head = piecewise(c.drafter_head_ms, 1)
        drafts = ", ".join(f"{d}L {piecewise(p, 1) + head:.1f}" for d, p in sorted(c.drafter_ms.items()))
        return (f"vLLM {c.version} ({c.device}) timed here, {c.threads} threads, batches "
                f"{', '.join(map(str, c.batches))}: target forward and head {decode:.1f} ms, a verify of "
                f"{c.gamma + 1} {verify:.1f} ms; vLLM's own work per step "
                f"{piecewise(c.plain_overhead_ms, 1):.1f} ms plain, "
                f"{piecewise(c.spec_overhead_ms, 1):.1f} ms drafting with a model"
                + (f", {piecewise(c.ngram_overhead_ms, 1):.1f} ms with n-gram lookup"
                   if c.ngram_overhead_ms else "")
                + f"; {c.base} drafter forward and "
                f"head {drafts} ms (its head {head:.1f}; batch 1)"
                + (f"; eagle3 {c.head_label} forward and head "
                   f"{piecewise(c.head_ms, 1) + piecewise(c.head_logits_ms, 1):.1f} ms, its fc "
                   f"{piecewise(c.head_fc_ms, c.gamma + 1):.1f} ms over {c.gamma + 1} rows, its step's own "
                   f"work {piecewise(c.head_overhead_ms, 1):.1f} ms" if c.head_label else ""))
