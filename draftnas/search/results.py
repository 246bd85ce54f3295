"""A study's results read back from storage alone: the ranking and counts, and the most any
drafter of it could give.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.trial import TrialState

from draftnas.search.records import RankedTrial, SearchResult, StudyInfo, WorkloadPrediction
from draftnas.search.run_options import SearchOptions
from draftnas.search.scoring import assumed_acceptance, pareto_front, predict_workload
from draftnas.search.storage import load_study, normalize_storage, ranked_trials, redact, study_info


def acceptance_ceiling(result: SearchResult) -> tuple[RankedTrial, WorkloadPrediction] | None:
    """The ranked drafter whose prediction is highest if every drafted token were accepted, and
    that prediction: the most any drafter of the study can give on this machine's latencies."""
    space = result.info.space
    bounds = [(r, predict_workload(r.latency, assumed_acceptance(1.0), space.workload, space.gamma))
              for r in result.ranked]
    return max(bounds, key=lambda rb: rb[1].speedup) if bounds else None


def collect_result(study: optuna.Study, storage_url: str, options: SearchOptions | None,
                   info: StudyInfo, told: Sequence[int], interrupted: bool, wall_s: float) -> SearchResult:
    """Rebuild the ranking and counts from storage."""
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    kinds = [t.user_attrs.get("pruned_kind") for t in trials if t.state == TrialState.PRUNED]
    ranked = ranked_trials(study)
    baseline = ranked[0].throughput.baseline_tokens_per_s if ranked else math.nan
    stored = StudyInfo.from_dict(study.user_attrs["draftnas"]) if "draftnas" in study.user_attrs else info
    return SearchResult(
        study_name=study.study_name, storage=redact(storage_url),
        run_dir=str(Path(options.study.run_dir if options else "runs") / study.study_name), info=stored,
        sampler=options.study.sampler if options else "",
        n_trials=options.study.n_trials if options else len(trials),
        ranked=ranked, pareto=pareto_front(ranked), counts={k: v for k, v in counts.items() if v},
        pruned_by_upper_bound=kinds.count("upper_bound"), pruned_infeasible=kinds.count("infeasible"),
        reused=sum("reused_from" in t.user_attrs for t in trials), told_here=tuple(told),
        interrupted=interrupted, wall_s=wall_s, baseline_tokens_per_s=baseline,
        profile_note=options.profile_note if options else None,
    )


def load_results(study_name: str, storage: str | None, run_dir: str | Path = "runs") -> SearchResult:
    """A study's ranking and counts, from storage alone."""
    study = load_study(study_name, storage, run_dir)
    info = study_info(study)
    url = normalize_storage(storage, study_name, run_dir)
    return collect_result(study, url, None, info, (), False, 0.0)
