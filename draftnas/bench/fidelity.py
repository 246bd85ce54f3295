"""Predicted against measured: the arithmetic of `draftnas e2e`'s analysis (pure, no torch).

A `Prediction` is the analytical model's figures for one drafter at one gamma; `Measured`
the bench's medians; `MeasuredTerms` each latency timed alone. `decompose` swaps the
model's terms for measured ones one at a time (each swap re-priced by
`throughput.speculative_speedup`, so the decomposition uses the one throughput formula);
`fidelity` is MAPE and Spearman across drafters.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from draftnas.bench.fidelity_records import (
    Decomposition,
    DrafterRow,
    Fidelity,
    Measured,
    MeasuredTerms,
    Prediction,
)
from draftnas.core.registry import Architecture
from draftnas.core.throughput import predict_throughput, speculative_speedup

if TYPE_CHECKING:
    from draftnas.latency.model import LatencyModel


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None below 3 points or with no spread."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return None if sx == 0 or sy == 0 else cov / (sx * sy)


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error of `predicted` against `measured` (in %)."""
    pairs = [(p, m) for p, m in zip(predicted, measured, strict=True) if m]
    return 100.0 * statistics.fmean(abs(p - m) / abs(m) for p, m in pairs) if pairs else float("nan")


def predict(model: LatencyModel, drafter: Architecture, target: Architecture, tokens_per_step: float,
            gamma: int, context_tokens: int, head_vocab_size: int | None = None) -> Prediction:
    """`head_vocab_size`: rows of the drafter's reduced LM head (None: the full vocabulary)."""
    draft_ms = model.predict_ms(drafter, new_tokens=1, context_tokens=context_tokens,
                                head_vocab_size=head_vocab_size)
    target_ms = model.predict_ms(target, new_tokens=1, context_tokens=context_tokens)
    verify_ms = model.predict_ms(target, new_tokens=gamma + 1, context_tokens=context_tokens)
    est = predict_throughput(gamma=gamma, draft_ms=draft_ms, target_ms=target_ms, verify_ms=verify_ms,
                             tokens_per_step=min(max(tokens_per_step, 1.0), gamma + 1.0))
    return Prediction(gamma=gamma, tokens_per_step=est.tokens_per_step, draft_ms=draft_ms,
                      verify_ms=est.verify_ms, target_ms=target_ms, tokens_per_s=est.tokens_per_s,
                      speedup=est.speedup)


def best_predicted_gamma(model: LatencyModel, drafter: Architecture, target: Architecture,
                         tokens_per_step: dict[str, float], max_gamma: int, context_tokens: int,
                         head_vocab_size: int | None = None) -> int:
    """The gamma >= 1 with the highest predicted tokens/s (gamma 0 is the target alone, benched anyway)."""
    def tokens_per_s(g: int) -> float:
        return predict(model, drafter, target, tokens_per_step[str(g)], g, context_tokens,
                       head_vocab_size).tokens_per_s

    return max(range(1, max_gamma + 1), key=tokens_per_s)


def decompose(pred: Prediction, meas: Measured, terms: MeasuredTerms) -> Decomposition:
    """Swap the model's terms for measured ones in order acceptance, draft, verify, target.

    The acceptance swap also uses the loop's real drafts per step (fewer than gamma at the
    end of a budget or after an end-of-sequence token). What is left is overhead the model
    omits: prefill and per-step Python/cache work (`loop_overhead_ms_per_step`, from the
    loop's measured step time minus its measured forwards).
    """
    g, d = pred.gamma, meas.drafted_per_step
    verify = terms.verify_ms.get(str(g), pred.verify_ms)
    s0 = pred.speedup
    s1 = speculative_speedup(meas.tokens_per_step, d, pred.draft_ms, pred.verify_ms, pred.target_ms)
    s2 = speculative_speedup(meas.tokens_per_step, d, terms.draft_ms, pred.verify_ms, pred.target_ms)
    s3 = speculative_speedup(meas.tokens_per_step, d, terms.draft_ms, verify, pred.target_ms)
    s4 = speculative_speedup(meas.tokens_per_step, d, terms.draft_ms, verify, terms.target_ms)
    deltas = {"acceptance": s1 - s0, "draft latency": s2 - s1, "verify latency": s3 - s2,
              "target latency": s4 - s3, "loop overheads": meas.speedup - s4}
    return Decomposition(
        gamma=g, predicted=s0, with_acceptance=s1, with_draft=s2, with_verify=s3, with_target=s4,
        measured=meas.speedup, delta_acceptance=deltas["acceptance"], delta_draft=deltas["draft latency"],
        delta_verify=deltas["verify latency"], delta_target=deltas["target latency"],
        delta_overhead=deltas["loop overheads"],
        loop_overhead_ms_per_step=meas.step_ms - (d * terms.draft_ms + verify),
        target_overhead_ms_per_token=meas.target_token_ms - terms.target_ms,
        worst_term=max(deltas, key=lambda k: abs(deltas[k])))


def fidelity(rows: Sequence[DrafterRow], fixed_gamma: int) -> Fidelity:
    """MAPE and Spearman of predicted vs measured speedup at the fixed and the best gamma."""
    distinct = [r for r in rows if r.same_as is None and r.measured]
    out: dict[str, Any] = {}
    worst: dict[str, str] = {}
    for key, pick in (("fixed", lambda r: str(fixed_gamma)), ("best", lambda r: str(r.predicted_best_gamma))):
        pred = [r.predicted[pick(r)].speedup for r in distinct]
        meas = [r.measured[pick(r)].speedup for r in distinct]
        out[f"mape_{key}_gamma"] = mape(pred, meas) if distinct else float("nan")
        out[f"spearman_{key}_gamma"] = spearman(pred, meas)
        for r in distinct:
            dec = r.decomposition.get(pick(r))
            if dec is not None and abs(dec.predicted - dec.measured) > 0.10 * abs(dec.measured):
                worst[f"{r.role}@{pick(r)}"] = dec.worst_term
    return Fidelity(n_drafters=len(distinct), worst_terms=worst, **out)
