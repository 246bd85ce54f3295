"""Scoring a candidate: the records a trial stores and the arithmetic that ranks it.

Pure and fast (no torch, no Optuna): latencies read from a latency model, an
acceptance reading (measured or assumed), and the workload's predicted tokens/s at
each batch size's best gamma (Yan et al. 2025, eq. 1-3; `draftnas.core.throughput`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.core.bisection import turning_point
from draftnas.core.errors import InfeasibleCandidateError, InvalidInputError
from draftnas.core.options import option_error
from draftnas.core.placement import Placement
from draftnas.core.registry import Architecture
from draftnas.core.throughput import (
    RequestTerms,
    ThroughputEstimate,
    best_gamma,
    median_request,
    predict_throughput,
    verify_at,
    with_prefill,
)
from draftnas.drafter.heal.heal_records import HealResult
from draftnas.search.records import (
    AcceptanceReading,
    BatchEconomics,
    LatencyPredictor,
    LatencyReading,
    RankedTrial,
    TargetLatency,
    WorkloadPrediction,
)
from draftnas.search.space import GammaRange, Workload

log = logging.getLogger(__name__)


def assumed_acceptance(alpha: float) -> AcceptanceReading:
    if not 0.0 <= alpha <= 1.0:
        raise option_error("acceptance_prior", f"must be in [0, 1], got {alpha:g}")
    return AcceptanceReading(kind="assumed", acceptance_rate=alpha)


def measured_acceptance(estimate: AcceptanceEstimate, heal: HealResult | None = None,
                        evaluate_s: float = 0.0) -> AcceptanceReading:
    """The reading of a drafter estimated on traces (`acceptance.estimate_acceptance`)."""
    return AcceptanceReading(kind="measured", acceptance_rate=float(estimate.acceptance_rate),
                             tokens_per_step={str(k): float(v) for k, v in estimate.tokens_per_step.items()},
                             estimate=estimate, heal=heal, evaluate_s=evaluate_s)


def weights_predictor(predictor: LatencyPredictor, weights: str) -> LatencyPredictor:
    """The latency model pricing drafters whose linear layers run as `weights`: `predictor` for dense
    ones; for int8 ones the host calibration's int8 timings (`CalibratedModel.for_weights`), which no
    profile or spec sheet has."""
    if weights == "dense":
        return predictor
    for_weights = getattr(predictor, "for_weights", None)
    if for_weights is None:
        raise InfeasibleCandidateError(f"{weights} drafters are priced only by a calibration on this host "
                                       "(a CPU search in the static engine)")
    return for_weights(weights)  # type: ignore[no-any-return]


def target_latency(predictor: LatencyPredictor, target: Architecture, workload: Workload,
                   gamma: GammaRange) -> TargetLatency:
    """Target decode ms per batch size, verify ms per (batch size, gamma 0..max), and the prefill of
    `workload.prompt_tokens` per batch size (when the workload has a prompt)."""
    ctx = workload.context_tokens
    decode = tuple(predictor.predict_ms(target, batch_size=b, new_tokens=1, context_tokens=ctx)
                   for b in workload.batch_sizes)
    verify = tuple(
        tuple(predictor.predict_ms(target, batch_size=b, new_tokens=g + 1, context_tokens=ctx)
              for g in range(gamma.max + 1))
        for b in workload.batch_sizes)
    return TargetLatency(decode_ms=decode, verify_ms=verify,
                         prefill_ms=_prefill(predictor, target, workload, workload.batch_sizes))


def _prefill(predictor: LatencyPredictor, arch: Architecture, workload: Workload, batches: Sequence[int],
             head_vocab_size: int | None = None) -> tuple[float, ...]:
    if workload.prompt_tokens < 1:
        return ()
    return tuple(predictor.predict_ms(arch, batch_size=b, new_tokens=workload.prompt_tokens, context_tokens=0,
                                      head_vocab_size=head_vocab_size) for b in batches)


def read_latency(predictor: LatencyPredictor, profile: str, arch: Architecture, workload: Workload,
                 target: TargetLatency,
                 head_vocab_size: int | None = None, *, placement: Placement | None = None,
                 target_arch: Architecture | None = None, target_predictor: LatencyPredictor | None = None
                 ) -> LatencyReading:
    """The candidate's draft latency per batch size beside the (shared) target latencies.

    head_vocab_size: rows of a reduced draft head (None: the full vocabulary). With a `placement`,
    a batch the target and this drafter do not fit in memory together runs speculation at the
    largest batch that fits, and plain decoding at the largest the target alone fits (priced
    there with `target_predictor` on `target_arch`); a drafter that fits at no batch is refused
    with `InfeasibleCandidateError`."""
    ctx = workload.context_tokens
    batches = workload.batch_sizes
    spec, plain, max_batch = batches, batches, None
    if placement is not None:
        max_batch = placement.max_batch_with(arch, head_vocab_size)
        if max_batch < 1:
            need = placement.drafter_bytes(arch, head_vocab_size, 1) / 1e9
            raise InfeasibleCandidateError(
                f"the drafter ({need:.1f} GB with its KV cache) does not fit beside the target on "
                f"{placement.hardware} ({placement.capacity_bytes / 1e9:.1f} GB usable per GPU)")
        spec = tuple(min(b, max_batch) for b in batches)
        plain = tuple(min(b, placement.max_batch) for b in batches)
    draft = tuple(predictor.predict_ms(arch, batch_size=b, new_tokens=1, context_tokens=ctx,
                                       head_vocab_size=head_vocab_size) for b in spec)
    target_ms, verify_ms, target_prefill = target.decode_ms, target.verify_ms, target.prefill_ms
    spec_target_prefill = target_prefill
    capped = spec != batches or plain != batches
    if capped:
        assert target_arch is not None and target_predictor is not None
        n_verify = len(verify_ms[0])
        target_prefill = _prefill(target_predictor, target_arch, workload, plain)
        spec_target_prefill = _prefill(target_predictor, target_arch, workload, spec)
        target_ms = tuple(target_predictor.predict_ms(target_arch, batch_size=b, context_tokens=ctx)
                          for b in plain)
        verify_ms = tuple(tuple(target_predictor.predict_ms(target_arch, batch_size=b, new_tokens=g + 1,
                                                            context_tokens=ctx) for g in range(n_verify))
                          for b in spec)
    catch_up = getattr(predictor, "drafter_batch_ms", None)
    if catch_up is not None:  # llama.cpp, vLLM: each step the drafter also reads the verified tokens at once
        verify_ms = tuple(tuple(v + (catch_up(arch, g + 1, batch_size=b) if g else 0.0)
                                for g, v in enumerate(row))
                          for b, row in zip(spec, verify_ms, strict=True))
    draft_prefill = _prefill(predictor, arch, workload, spec, head_vocab_size) if spec_target_prefill else ()
    return LatencyReading(profile=profile, batch_sizes=batches, context_tokens=workload.context_tokens,
                          draft_ms=draft, target_ms=target_ms, verify_ms=verify_ms,
                          spec_batch_sizes=spec if capped else (), plain_batch_sizes=plain if capped else (),
                          max_batch=max_batch, target_prefill_ms=target_prefill,
                          spec_prefill_ms=tuple(t + d for t, d in zip(spec_target_prefill, draft_prefill,
                                                                      strict=True)))


def estimate_at(latency: LatencyReading, acceptance: AcceptanceReading, index: int,
                gamma: int, p_min: float = 0.0, lockstep_tokens: int = 0) -> ThroughputEstimate | None:
    """Predicted throughput at batch `latency.batch_sizes[index]` and one drafting policy (gamma, p_min);
    None for a confidence stop the acceptance reading has no walk of. Where the reading has the
    estimate's walk, each step drafts its mean drafts and the verify is priced at that mean.
    `lockstep_tokens`: a batch runs in lockstep until each sequence has that many (draftnas's batched
    loop, `core.lockstep`)."""
    policy = acceptance.policy_at(gamma, p_min)
    if p_min > 0 and policy is None:
        return None
    tokens = acceptance.tokens_at(gamma) if policy is None else policy.tokens_per_step
    row = latency.verify_ms[index]
    drafted = None if policy is None else min(policy.drafted_per_step, float(gamma))
    return predict_throughput(
        gamma=gamma, draft_ms=latency.draft_ms[index], target_ms=latency.target_ms[index],
        verify_ms=row[gamma] if drafted is None else verify_at(row, drafted),
        batch_size=latency.spec_batch(index), baseline_batch_size=latency.plain_batch(index),
        acceptance_rate=acceptance.acceptance_rate if tokens is None else None,
        tokens_per_step=None if tokens is None else min(max(tokens, 1.0), gamma + 1.0),
        drafted_per_step=drafted, p_min=p_min, lockstep_tokens=lockstep_tokens,
    )


def _best_at(latency: LatencyReading, acceptance: AcceptanceReading, index: int,
             gamma: GammaRange, lockstep_tokens: int = 0) -> ThroughputEstimate:
    same_batch = latency.spec_batch(index) == latency.plain_batch(index)
    if acceptance.tokens_per_step is None and gamma.min == 0 and same_batch:
        verify = latency.verify_ms[index]
        return best_gamma(acceptance_rate=acceptance.acceptance_rate, draft_ms=latency.draft_ms[index],
                          target_ms=latency.target_ms[index], verify_ms=lambda g: verify[g],
                          max_gamma=gamma.max, batch_size=latency.batch_sizes[index],
                          lockstep_tokens=lockstep_tokens)
    gammas = [g for g in range(gamma.min, gamma.max + 1) if acceptance.tokens_at(g) is not None
              or acceptance.tokens_per_step is None]
    if not gammas:
        raise InvalidInputError(f"acceptance has no tokens per step for gamma {gamma.min}..{gamma.max}")
    estimates = [e for g in gammas for p in (gamma.p_min if g else (0.0,))
                 if (e := estimate_at(latency, acceptance, index, g, p, lockstep_tokens)) is not None]
    return max(estimates, key=lambda e: e.tokens_per_s * (1 - 1e-12 * e.gamma) * (1 - 1e-13 * e.p_min))


def predict_workload(latency: LatencyReading, acceptance: AcceptanceReading, workload: Workload,
                     gamma: GammaRange) -> WorkloadPrediction:
    """Each batch size at its best gamma; the workload's tokens/s is their weighted harmonic mean.

    With a prompt in the workload, each batch size's tokens/s is that of whole requests: the prefill
    (target, plus the drafter when it speculates) and `workload.new_tokens` generated
    (`throughput.with_prefill`); the per-batch estimates stay the steady-state steps."""
    per_batch = tuple(_best_at(latency, acceptance, i, gamma, workload.new_tokens)
                      for i in range(len(latency.batch_sizes)))
    weights = workload.batch_weights
    spec_tps, plain_tps = [e.tokens_per_s for e in per_batch], [e.baseline_tokens_per_s for e in per_batch]
    if latency.target_prefill_ms:  # whole requests: each pays its prompt's prefill once
        n = workload.new_tokens
        for i, e in enumerate(per_batch):
            plain_b = latency.plain_batch(i)
            prefill = latency.spec_prefill_ms[i] if e.gamma > 0 else latency.target_prefill_ms[i]
            spec_tps[i] = with_prefill(e.tokens_per_s, e.batch_size * n, prefill)
            plain_tps[i] = with_prefill(e.baseline_tokens_per_s, plain_b * n, latency.target_prefill_ms[i])
    tps = 1.0 / sum(w / t for w, t in zip(weights, spec_tps, strict=True))
    base = 1.0 / sum(w / t for w, t in zip(weights, plain_tps, strict=True))
    terms = _request_terms(latency, workload, per_batch[0]) if len(per_batch) == 1 else None
    median = _median_request(terms, acceptance, per_batch[0])
    return WorkloadPrediction(per_batch=per_batch, batch_weights=weights, tokens_per_s=tps,
                              baseline_tokens_per_s=base, speedup=tps / base,
                              acceptance_assumed=acceptance.assumed,
                              median_tokens_per_s=None if median is None else median[0],
                              median_speedup=None if median is None else median[1], request=terms)


def _request_terms(latency: LatencyReading, workload: Workload, e: ThroughputEstimate) -> RequestTerms | None:
    """The terms that price whole requests at batch 1 (`throughput.RequestTerms`), from the reading at
    `e`'s batch; None unless that batch is 1."""
    if e.batch_size != 1 or latency.batch_sizes[0] != 1:
        return None
    prefill = bool(latency.target_prefill_ms)
    return RequestTerms(draft_ms=e.draft_ms, target_ms=e.target_ms, verify_ms=tuple(latency.verify_ms[0]),
                        spec_prefill_ms=latency.spec_prefill_ms[0] if prefill else 0.0,
                        target_prefill_ms=latency.target_prefill_ms[0] if prefill else 0.0,
                        new_tokens=workload.new_tokens, baseline_batch_size=latency.plain_batch(0))


def _median_request(terms: RequestTerms | None, acceptance: AcceptanceReading,
                    e: ThroughputEstimate) -> tuple[float, float] | None:
    """(median tokens/s, median speedup) over the traced prompts, as a bench reports them: each prompt's
    walk at `e`'s policy (its gamma and stop) priced alike (`throughput.median_request`); None where the
    acceptance has no per-prompt walks. Priced for the chosen policy only (not for every one `_best_at`
    weighs)."""
    policy = acceptance.policy_at(e.gamma, e.p_min)
    if terms is None or policy is None or not policy.prompt_tokens_per_step:
        return None
    return median_request(terms, e.gamma, policy.prompt_tokens_per_step, policy.prompt_drafted_per_step)


def pareto_front(ranked: Sequence[RankedTrial]) -> tuple[int, ...]:
    """Trial numbers not dominated on (draft ms at the primary batch: lower, acceptance: higher)."""
    points = [(r.number, r.primary.draft_ms, r.acceptance.acceptance_rate) for r in ranked]
    front = [n for n, ms, acc in points
             if not any((m2 <= ms and a2 >= acc) and (m2 < ms or a2 > acc) for _, m2, a2 in points)]
    return tuple(sorted(front, key=lambda n: next(p[1] for p in points if p[0] == n)))


SWEEP_MAX_BATCH = 256


def _speculating(gamma: GammaRange) -> GammaRange:
    return GammaRange(min=max(1, gamma.min), max=max(1, gamma.max))


def break_even_alpha(latency: LatencyReading, index: int, gamma: GammaRange,
                     lockstep_tokens: int = 0) -> float | None:
    """The acceptance at which the best gamma >= 1 at batch `latency.batch_sizes[index]` ties plain
    decoding (bisection: the speedup rises with acceptance); None if acceptance 1 does not pay."""
    spec = _speculating(gamma)

    def speedup(alpha: float) -> float:
        return _best_at(latency, assumed_acceptance(alpha), index, spec, lockstep_tokens).speedup

    if speedup(1.0) <= 1.0:
        return None
    if speedup(0.0) >= 1.0:
        return 0.0
    lo, hi = turning_point(lambda alpha: speedup(alpha) >= 1.0, 0.0, 1.0, steps=40)
    return (lo + hi) / 2


def batch_economics(predictor: LatencyPredictor, target_predictor: LatencyPredictor, profile: str,
                    arch: Architecture, target: Architecture, workload: Workload, gamma: GammaRange,
                    acceptance: AcceptanceReading, head_vocab_size: int | None = None,
                    placement: Placement | None = None) -> BatchEconomics:
    """Break-even acceptance at batch 1 and the workload's largest batch, and the predicted
    speedup (gamma >= 1) over batch sizes 1, 2, 4, ... up to 256 or the largest batch that fits
    (which is swept too)."""
    limit = SWEEP_MAX_BATCH if placement is None else min(SWEEP_MAX_BATCH, placement.max_batch_with(
        arch, head_vocab_size))
    largest = max(workload.batch_sizes)
    batches = sorted({b for b in (*(2 ** k for k in range(9)), largest, limit) if 1 <= b <= max(limit, 1)})
    sweep = Workload(batch_sizes=tuple(batches), batch_weights=tuple(1.0 / len(batches) for _ in batches),
                     temperature=workload.temperature, context_tokens=workload.context_tokens,
                     prompt_set=workload.prompt_set, domain=workload.domain)
    spec = _speculating(gamma)
    target_ms = target_latency(target_predictor, target, sweep, spec)
    reading = read_latency(predictor, profile, arch, sweep, target_ms, head_vocab_size, placement=placement,
                           target_arch=target, target_predictor=target_predictor)
    n = workload.new_tokens  # draftnas's batched loop runs a batch in lockstep (`core.lockstep`)
    best = [_best_at(reading, acceptance, i, spec, n) for i in range(len(batches))]
    speedups = tuple(e.speedup for e in best)
    crossover = next((b for b, s in zip(batches, speedups, strict=True) if s <= 1.0), None)
    at_largest = batches.index(largest) if largest in batches else len(batches) - 1
    return BatchEconomics(alpha=acceptance.acceptance_rate, largest_batch=batches[at_largest],
                          break_even_alpha_batch1=break_even_alpha(reading, 0, spec, n),
                          break_even_alpha_largest=break_even_alpha(reading, at_largest, spec, n),
                          crossover_batch=crossover, sweep_batches=tuple(batches), sweep_speedup=speedups,
                          timed_batches=tuple(getattr(predictor, "timed_batches", tuple)()),
                          lockstep_tokens=n, sweep_gamma=tuple(e.gamma for e in best))
