"""Scoring a candidate: the records a trial stores and the arithmetic that ranks it.

Pure and fast (no torch, no Optuna): latencies read from a latency model, an
acceptance reading (measured or assumed), and the workload's predicted tokens/s at
each batch size's best gamma (Yan et al. 2025, eq. 1-3; `draftnas.throughput`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from draftnas.acceptance import AcceptanceEstimate
from draftnas.candidate import Candidate
from draftnas.distill import HealResult
from draftnas.errors import InvalidInputError
from draftnas.record import Record
from draftnas.registry import Architecture
from draftnas.space import GammaRange, Workload
from draftnas.throughput import ThroughputEstimate, best_gamma, predict_throughput

log = logging.getLogger(__name__)


ASSUMED_NOTE = "acceptance is ASSUMED ({alpha:g} per token, --acceptance-prior), not measured"


class LatencyPredictor(Protocol):
    """What the search needs from `draftnas.latency.LatencyModel`."""

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float: ...


@dataclass(frozen=True)
class LatencyReading(Record):
    """Latencies (ms) one candidate is ranked with, per workload batch size.

    `verify_ms[i][g]` is the target over g + 1 new tokens at `batch_sizes[i]`, g = 0..gamma max.
    """

    profile: str
    batch_sizes: tuple[int, ...]
    context_tokens: int
    draft_ms: tuple[float, ...]
    target_ms: tuple[float, ...]
    verify_ms: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class AcceptanceReading(Record):
    """How well the target accepts a candidate's drafts: measured on traces, or assumed.

    Assumed: `acceptance_rate` is the user's prior alpha (i.i.d. per token).
    Measured: `tokens_per_step[str(gamma)]` from `estimate_acceptance`, `acceptance_rate`
    its mean per-position acceptance (greedy: top-1 agreement); `estimate` and `heal` hold
    the full records.
    """

    kind: str  # "measured" | "assumed"
    acceptance_rate: float
    tokens_per_step: dict[str, float] | None = None
    estimate: AcceptanceEstimate | None = None
    heal: HealResult | None = None
    evaluate_s: float = 0.0

    @property
    def assumed(self) -> bool:
        return self.kind == "assumed"

    def tokens_at(self, gamma: int) -> float | None:
        """Measured E[tokens per step] at gamma (1.0 at gamma 0), None when assumed."""
        if self.tokens_per_step is None:
            return None
        return 1.0 if gamma == 0 else self.tokens_per_step.get(str(gamma))


@dataclass(frozen=True)
class WorkloadPrediction(Record):
    """Predicted throughput of the workload: best gamma per batch size, weighted harmonic mean.

    tokens/s = 1 / sum_b(w_b / tokens_per_s_b), w_b the share of tokens decoded at batch b.
    """

    per_batch: tuple[ThroughputEstimate, ...]
    batch_weights: tuple[float, ...]
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    acceptance_assumed: bool

    def primary(self) -> ThroughputEstimate:
        """The estimate at the workload's largest-share batch size (the first of equal shares)."""
        weights = self.batch_weights
        return self.per_batch[max(range(len(weights)), key=lambda j: (weights[j], -j))]


@dataclass(frozen=True)
class RankedTrial(Record):
    """One completed trial, rebuilt from storage."""

    number: int
    candidate: Candidate
    latency: LatencyReading
    acceptance: AcceptanceReading
    throughput: WorkloadPrediction
    reused_from: int | None = None

    @property
    def primary(self) -> ThroughputEstimate:
        """The estimate at the workload's largest-share batch size."""
        return self.throughput.primary()


def assumed_acceptance(alpha: float) -> AcceptanceReading:
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"--acceptance-prior must be in [0, 1], got {alpha:g}")
    return AcceptanceReading(kind="assumed", acceptance_rate=alpha)


def target_latency(predictor: LatencyPredictor, target: Architecture, workload: Workload,
                   gamma: GammaRange) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """Target decode ms per batch size, and verify ms per (batch size, gamma 0..max)."""
    ctx = workload.context_tokens
    decode = tuple(predictor.predict_ms(target, batch_size=b, new_tokens=1, context_tokens=ctx)
                   for b in workload.batch_sizes)
    verify = tuple(
        tuple(predictor.predict_ms(target, batch_size=b, new_tokens=g + 1, context_tokens=ctx)
              for g in range(gamma.max + 1))
        for b in workload.batch_sizes)
    return decode, verify


def read_latency(predictor: LatencyPredictor, profile: str, arch: Architecture, workload: Workload,
                 target: tuple[tuple[float, ...], tuple[tuple[float, ...], ...]],
                 head_vocab_size: int | None = None) -> LatencyReading:
    """The candidate's draft latency per batch size beside the (shared) target latencies.

    head_vocab_size: rows of a reduced draft head (None: the full vocabulary)."""
    ctx = workload.context_tokens
    draft = tuple(predictor.predict_ms(arch, batch_size=b, new_tokens=1, context_tokens=ctx,
                                       head_vocab_size=head_vocab_size)
                  for b in workload.batch_sizes)
    return LatencyReading(profile=profile, batch_sizes=workload.batch_sizes,
                          context_tokens=workload.context_tokens, draft_ms=draft,
                          target_ms=target[0], verify_ms=target[1])


def estimate_at(latency: LatencyReading, acceptance: AcceptanceReading, index: int,
                gamma: int) -> ThroughputEstimate:
    """Predicted throughput at batch `latency.batch_sizes[index]` and one gamma."""
    tokens = acceptance.tokens_at(gamma)
    return predict_throughput(
        gamma=gamma, draft_ms=latency.draft_ms[index], target_ms=latency.target_ms[index],
        verify_ms=latency.verify_ms[index][gamma], batch_size=latency.batch_sizes[index],
        acceptance_rate=acceptance.acceptance_rate if tokens is None else None,
        tokens_per_step=None if tokens is None else min(max(tokens, 1.0), gamma + 1.0),
    )


def _best_at(latency: LatencyReading, acceptance: AcceptanceReading, index: int,
             gamma: GammaRange) -> ThroughputEstimate:
    if acceptance.tokens_per_step is None and gamma.min == 0:
        verify = latency.verify_ms[index]
        return best_gamma(acceptance_rate=acceptance.acceptance_rate, draft_ms=latency.draft_ms[index],
                          target_ms=latency.target_ms[index], verify_ms=lambda g: verify[g],
                          max_gamma=gamma.max, batch_size=latency.batch_sizes[index])
    gammas = [g for g in range(gamma.min, gamma.max + 1) if acceptance.tokens_at(g) is not None
              or acceptance.tokens_per_step is None]
    if not gammas:
        raise InvalidInputError(f"acceptance has no tokens per step for gamma {gamma.min}..{gamma.max}")
    estimates = [estimate_at(latency, acceptance, index, g) for g in gammas]
    return max(estimates, key=lambda e: e.tokens_per_s * (1 - 1e-12 * e.gamma))


def predict_workload(latency: LatencyReading, acceptance: AcceptanceReading, workload: Workload,
                     gamma: GammaRange) -> WorkloadPrediction:
    """Each batch size at its best gamma; the workload's tokens/s is their weighted harmonic mean."""
    per_batch = tuple(_best_at(latency, acceptance, i, gamma) for i in range(len(latency.batch_sizes)))
    weights = workload.batch_weights
    tps = 1.0 / sum(w / e.tokens_per_s for w, e in zip(weights, per_batch, strict=True))
    base = 1.0 / sum(w / e.baseline_tokens_per_s for w, e in zip(weights, per_batch, strict=True))
    return WorkloadPrediction(per_batch=per_batch, batch_weights=weights, tokens_per_s=tps,
                              baseline_tokens_per_s=base, speedup=tps / base,
                              acceptance_assumed=acceptance.assumed)


def pareto_front(ranked: Sequence[RankedTrial]) -> tuple[int, ...]:
    """Trial numbers not dominated on (draft ms at the primary batch: lower, acceptance: higher)."""
    points = [(r.number, r.primary.draft_ms, r.acceptance.acceptance_rate) for r in ranked]
    front = [n for n, ms, acc in points
             if not any((m2 <= ms and a2 >= acc) and (m2 < ms or a2 > acc) for _, m2, a2 in points)]
    return tuple(sorted(front, key=lambda n: next(p[1] for p in points if p[0] == n)))
