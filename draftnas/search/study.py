"""A study's setup: the Optuna distributions of a search space's knobs, the sampler, the objectives, and
the study opened (created, or loaded to resume when it was made for the same search)."""

from __future__ import annotations

import warnings

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from draftnas.core.options import option_error
from draftnas.search.records import StudyInfo
from draftnas.search.run_options import SearchOptions
from draftnas.search.space import SearchSpace
from draftnas.search.storage import open_storage, redact


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions of the space's knobs (a knob with one value is not searched)."""
    out: dict[str, BaseDistribution] = {}
    d = space.depth
    if d.max > d.min:
        out["depth"] = IntDistribution(d.min, d.max - (d.max - d.min) % d.step, step=d.step)
    w = space.width
    for name, values in (("layer_selection", space.layer_selection), ("kv_head_ratio", w.kv_head_ratios),
                         ("query_head_ratio", w.query_head_ratios), ("mlp_ratio", w.mlp_ratios),
                         ("hidden_ratio", w.hidden_ratios), ("vocab_size", space.vocab_sizes),
                         ("weights", space.weights)):
        if len(values) > 1:
            out[name] = CategoricalDistribution(list(values))
    return out


def make_sampler(name: str, seed: int | None, n_trials: int) -> optuna.samplers.BaseSampler:
    """TPE (default; multivariate, constant liar for parallel workers), NSGA-II or random."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, min(10, n_trials // 3)),
                                              multivariate=True, constant_liar=True)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, min(50, n_trials // 5)))
    return optuna.samplers.RandomSampler(seed=seed)


def objectives(sampler: str) -> tuple[str, list[optuna.study.StudyDirection]]:
    up, down = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    if sampler == "nsga2":
        return "latency,acceptance", [down, up]
    return "throughput", [up]


def open_study(options: SearchOptions, info: StudyInfo, storage_url: str) -> optuna.Study:
    """Create the study or load it (several workers, resume); refuse a study made for another search."""
    _, directions = objectives(options.study.sampler)
    storage = open_storage(storage_url)
    name = options.study_name
    study = optuna.create_study(study_name=name, storage=storage, directions=directions,
                                load_if_exists=True)
    stored = study.user_attrs.get("draftnas")
    if stored is None:
        study.set_user_attr("draftnas", info.to_dict())
        return study
    old = StudyInfo.from_dict(stored).fingerprint()
    new = info.fingerprint()
    diff = [k for k in new if old.get(k) != new[k]]
    if diff:
        raise option_error("study_name", f"{name!r} in {redact(storage_url)} was made with a different "
                                         f"{', '.join(diff)}; name another study, or give the same settings "
                                         "to resume", flag="--study")
    return study
