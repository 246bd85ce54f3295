"""A search's predictions (`search.predictions`) beside what a bench measured, arm by arm."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftnas.bench.arms import MAIN, REFERENCE
from draftnas.bench.records import ArmResult, BenchResult, PredictionCheck
from draftnas.bench.stats import relative_error
from draftnas.core.throughput import median_request
from draftnas.search.predictions import ArmPrediction, SearchPredictions
from draftnas.search.records import WorkloadPrediction


def exported_prediction(record: dict[str, Any] | None) -> WorkloadPrediction | None:
    """The winner's prediction as its export re-priced it (draftnas.json), if the folder has one."""
    data = (record or {}).get("prediction")
    return WorkloadPrediction.from_dict(data) if isinstance(data, dict) else None


def bench_median(p: ArmPrediction, measured: ArmResult, new_tokens: int) -> tuple[float, float] | None:
    """`p`'s latencies priced on the bench's own prompts: the estimator's walk of each at the arm's policy,
    requests of the bench's `new_tokens` (`throughput.median_request`); None without both."""
    walk, gamma = measured.predicted_prompt_tokens_per_step, measured.gamma
    if p.request is None or not walk or gamma is None or not 1 <= gamma < len(p.request.verify_ms):
        return None
    return median_request(replace(p.request, new_tokens=new_tokens), gamma, walk,
                          measured.predicted_prompt_drafted_per_step)


def _check(result: BenchResult, arm: str, p: ArmPrediction, source: str = "search") -> PredictionCheck | None:
    if not result.has(arm):
        return None
    measured = result.arm(arm)
    here = bench_median(p, measured, result.max_new_tokens)
    median_tps = here[0] if here else p.median_tokens_per_s or p.tokens_per_s
    median_speedup = here[1] if here else p.median_speedup or p.speedup
    error = relative_error(median_tps, measured.tokens_per_s)
    assert error is not None
    pooled = measured.pooled_tokens_per_s
    base = result.arm(measured.baseline).pooled_tokens_per_s if measured.baseline else None
    pooled_speedup = pooled / base if pooled and base else None
    return PredictionCheck(arm=arm, role=p.role, name=p.name, predicted_tokens_per_s=p.tokens_per_s,
                           measured_tokens_per_s=measured.tokens_per_s, tokens_per_s_error=error,
                           predicted_speedup=p.speedup, measured_speedup=measured.speedup,
                           speedup_error=relative_error(median_speedup, measured.speedup),
                           held_out=p.held_out,
                           predicted_median_tokens_per_s=p.median_tokens_per_s,
                           predicted_median_speedup=p.median_speedup,
                           source=source, pooled_tokens_per_s=pooled,
                           pooled_tokens_per_s_error=relative_error(p.tokens_per_s, pooled),
                           pooled_speedup=pooled_speedup,
                           pooled_speedup_error=relative_error(p.speedup, pooled_speedup),
                           predicted_bench_median_tokens_per_s=here[0] if here else None,
                           predicted_bench_median_speedup=here[1] if here else None)


def _exported_arm(role: str, name: str, exported: WorkloadPrediction) -> ArmPrediction:
    e = exported.primary()
    return ArmPrediction(role=role, name=name, tokens_per_s=exported.tokens_per_s, speedup=exported.speedup,
                         gamma=e.gamma, tokens_per_step=e.tokens_per_step, draft_ms=e.draft_ms,
                         verify_ms=e.verify_ms, target_ms=e.target_ms, p_min=e.p_min,
                         median_tokens_per_s=exported.median_tokens_per_s,
                         median_speedup=exported.median_speedup, request=exported.request)


def check_predictions(result: BenchResult, predictions: SearchPredictions,
                      exported: WorkloadPrediction | None = None,
                      references: Mapping[str, WorkloadPrediction] | None = None
                      ) -> tuple[PredictionCheck, ...]:
    """The target alone, the winner (as exported when its folder says), and each reference: an exported
    folder (`references`: label -> the prediction its draftnas.json records; the search's hand-made best
    as its export priced it), else a reference the search priced under that name, then held out."""
    rows: list[PredictionCheck | None] = []
    target = predictions.get("target")
    if target is not None:
        rows.append(_check(result, "target", target))
    winner = predictions.get("winner")
    main = result.drafters.get(MAIN, "")
    if winner is not None and exported is None and Path(main).name != winner.name:
        winner = None  # the drafter benched is not the search's winner: priced below if it is a reference
    if winner is not None and exported is not None:
        winner = _exported_arm("winner", winner.name, exported)
    if winner is not None:
        rows.append(_check(result, MAIN, winner, "export" if exported is not None else "search"))
    for label, spec in ((k, v) for k, v in result.drafters.items() if k != MAIN or winner is None):
        own = (references or {}).get(label)
        if own is not None:
            rows.append(_check(result, label, _exported_arm(REFERENCE, spec, own), "export"))
            continue
        for held_out in (False, True):
            ref = predictions.get(REFERENCE, held_out, spec)
            if ref is not None:
                rows.append(_check(result, label, ref))
    return tuple(r for r in rows if r is not None)
