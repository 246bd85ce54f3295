"""Trained shapes priced at a training budget: each curve's shape (k layers of its base at full width, a
reduced head) gets the search's latency, an acceptance read off its fitted curve at `--train-tokens`
(`distill_records.TrainingCurve`), and the workload's best gamma, as any trial does; and the budget it
needs to beat the hand-made best. Pure: no torch.

The curve gives greedy tokens per step at its own gamma; the acceptance rate that makes that many
(`throughput.acceptance_rate_from_tokens_per_step`, i.i.d. per token) prices the other gammas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from draftnas.core.bisection import turning_point
from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.registry import Architecture
from draftnas.core.throughput import acceptance_rate_from_tokens_per_step
from draftnas.drafter.head.shape import priced_arch
from draftnas.drafter.training.distill_records import CurveSet, TrainedPrice, TrainingCurve
from draftnas.search.records import AcceptanceReading, LatencyReading, WorkloadPrediction
from draftnas.search.scoring import predict_workload
from draftnas.search.space import GammaRange, Workload

#: the largest budget the search looks for a shape's break-even within (tokens)
MAX_BUDGET = 1e13
#: what a GPU plan's hours assume the trainer sustains: fp32 (draftnas trains heads in fp32) on an H100,
#: whose fp32 peak is 67 TFLOP/s. An assumption, not a measurement: decode's memory-bound steps while making
#: data run slower than their FLOPs say, so the hours are a lower bound.
ASSUMED_GPU_FLOPS = 30e12

log = logging.getLogger(__name__)


def curve_arch(curve: TrainingCurve, base_arch: Architecture) -> Architecture:
    """The trained shape: `len(layers)` layers of `base_arch` at full width; a head on `base_arch` (its
    target) as one layer of equal weights (`head.shape.priced_arch`), the shape vLLM's model prices from the
    head of that shape its calibration timed (`latency.vllm.VllmModel.is_head`)."""
    if curve.family == "head":
        return priced_arch(base_arch, len(curve.layers), curve.ffn, curve.label)
    return base_arch.with_shape(name=f"{base_arch.name}:{curve.label}", num_hidden_layers=len(curve.layers))


def head_flops_per_token(curve: TrainingCurve, target: Architecture) -> float:
    """FLOPs to make one trained position of a head's data and train on it: the target reads it twice (making
    the data; its hidden states, stored once) and the head runs forward and backward once per unrolled
    draft step (2 + 4 FLOPs a weight)."""
    matmul = target.non_embedding_parameters() + target.vocab_size * target.hidden_size  # its output rows
    head = priced_arch(target, len(curve.layers), curve.ffn, curve.label).layer_parameters() + \
        curve.head_rows * target.hidden_size
    return 2 * 2.0 * matmul + 6.0 * head * curve.unroll


def head_plan(curve: TrainingCurve, target: str, tokens: float) -> str:
    """The commands that make a head's data and train it to `tokens` on a GPU (folders named for the user to
    change)."""
    budget, layers = int(math.ceil(tokens)), ",".join(map(str, curve.layers))
    return (f"draftnas distill data runs/head-data --target {target} --tokens {budget} --device cuda && "
            f"draftnas distill head runs/head-data --out runs/head --layers {layers} "
            f"--draft-vocab {curve.head_rows} --ffn {curve.ffn} --unroll {curve.unroll} --tokens {budget} "
            "--features store --device cuda")


def _prediction(curve: TrainingCurve, tokens: float, latency: LatencyReading, workload: Workload,
                gamma: GammaRange) -> tuple[WorkloadPrediction, float, float]:
    tps = curve.predict(tokens)
    alpha = acceptance_rate_from_tokens_per_step(tps, curve.gamma)
    reading = AcceptanceReading(kind="fitted", acceptance_rate=alpha)
    return predict_workload(latency, reading, workload, gamma), tps, alpha


def tokens_to_beat(curve: TrainingCurve, bar_tps: float, latency: LatencyReading, workload: Workload,
                   gamma: GammaRange) -> float | None:
    """The least budget (tokens) at which the shape's predicted tokens/s exceeds `bar_tps` (bisection on
    ln T: the curve never falls), 0 where the untrained shape already does; None past MAX_BUDGET."""

    def beats(tokens: float) -> bool:
        return _prediction(curve, tokens, latency, workload, gamma)[0].tokens_per_s > bar_tps

    if beats(0.0):
        return 0.0
    if not beats(MAX_BUDGET):
        return None
    _, hi = turning_point(lambda log_tokens: beats(math.exp(log_tokens)), 0.0, math.log(MAX_BUDGET))
    return math.exp(hi)


def price_trained(curves: CurveSet, budget_tokens: int | None, read: Callable[[Architecture, int | None],
                                                                              LatencyReading],
                  arch_of: Callable[[str], Architecture], workload: Workload, gamma: GammaRange,
                  bar_tps: float | None, *, heads_run: bool = True) -> tuple[TrainedPrice, ...]:
    """Each curve's shape priced at `budget_tokens` (None: the largest budget its curve measured;
    `read(arch, head_rows)` is the search's latency), best first; heads' curves only where the engine
    priced runs heads (`heads_run`), each left out in a line otherwise."""
    out = []
    for curve in curves.curves:
        if curve.family == "head" and not heads_run:
            log.warning("head %s not priced: this search's engine does not run heads (they run in "
                        "draftnas's loop and vLLM)", curve.label)
            continue
        budget = budget_tokens if budget_tokens is not None else curve.measured_max()
        arch = curve_arch(curve, arch_of(curve.base))
        try:
            latency = read(arch, curve.head_rows or None)
        except InfeasibleCandidateError as e:  # a shape the engine does not run (llama.cpp, vLLM: base width)
            log.warning("trained shape %s not priced: %s", curve.label, e)
            continue
        prediction, tps, alpha = _prediction(curve, budget, latency, workload, gamma)
        is_head = curve.family == "head"
        needed = None if bar_tps is None or not curve.measurable_slope \
            else tokens_to_beat(curve, bar_tps, latency, workload, gamma)
        primary = prediction.per_batch[0]
        out.append(TrainedPrice(
            label=curve.label, base=curve.base, layers=curve.layers, head_rows=curve.head_rows,
            budget_tokens=budget, draft_ms=latency.draft_ms[0], curve_gamma=curve.gamma,
            tokens_per_step=tps, acceptance_rate=alpha, best_gamma=primary.gamma,
            tokens_per_s=prediction.tokens_per_s, speedup=prediction.speedup,
            measured_to_tokens=curve.measured_max(), extrapolated=budget > curve.measured_max(),
            check_error=curve.check.error if curve.check else None,
            tokens_to_beat_bar=needed,
            bar_tokens_per_s=bar_tps, curve_host=curve.host, slope_interval=curve.slope_interval() or (),
            measurable_slope=curve.measurable_slope, family=curve.family,
            flops_per_token=head_flops_per_token(curve, arch_of(curve.base)) if is_head else 0.0,
            plan=head_plan(curve, curve.base, needed) if is_head and needed else ""))
    return tuple(sorted(out, key=lambda p: -p.tokens_per_s))
