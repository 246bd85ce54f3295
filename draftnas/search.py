"""The search: an Optuna study over drafter shapes, ranked by predicted speculative throughput.

Ask/tell loop (Optuna): each trial proposes a `CandidateChoice`, builds the
`Candidate`, reads its latency from a latency model, checks an upper bound
(acceptance 1 at that latency) against the best trial so far, and only then runs
the expensive evaluation (pruning plan on real weights, healing, acceptance on
traces) — or takes an acceptance the user assumed. The objective is the
workload's predicted tokens/s at each batch size's best gamma (Yan et al. 2025,
eq. 1-3; `draftnas.throughput`). Every trial stores its records as JSON user
attributes, so ranking, reports and export rebuild everything from storage.

Storage is Optuna's: a SQLite file beside the run's outputs by default,
`postgresql://...` for several machines, or a journal file. Several processes
can work on one study; a killed process loses at most its trial in flight, which
the next run marks FAIL (same host: its process is gone; other hosts: heartbeat).

Size: the study loop (ask, bound, evaluate, tell), its results rebuilt from storage and request
resolution (shapes, space, profile, calibration, traces).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from draftnas.bench import ENGINES
from draftnas.candidate import Candidate, CandidateChoice, InfeasibleCandidateError, build_candidate
from draftnas.errors import DraftnasError, InvalidInputError
from draftnas.evaluate import Evaluation, Evaluator, PriorEvaluator, WeightsEvaluator
from draftnas.placement import Placement, deployed
from draftnas.record import Record
from draftnas.registry import Architecture
from draftnas.scoring import (
    AcceptanceReading,
    BatchEconomics,
    LatencyPredictor,
    LatencyReading,
    RankedTrial,
    TargetLatency,
    WorkloadPrediction,
    assumed_acceptance,
    batch_economics,
    pareto_front,
    predict_workload,
    read_latency,
    target_latency,
)
from draftnas.space import SearchSpace
from draftnas.study import (
    InterruptGate,
    StudyInfo,
    ask_with_worker,
    fail_own_running_trials,
    heartbeat,
    load_study,
    normalize_storage,
    open_storage,
    ranked_trials,
    recover_stale_trials,
    redact,
    study_info,
)

if TYPE_CHECKING:
    from draftnas.latency import LatencyProfile

log = logging.getLogger(__name__)

SamplerName = Literal["tpe", "nsga2", "random"]
SAMPLERS: tuple[str, ...] = ("tpe", "nsga2", "random")
STUDY_SCHEMA = 1
MAX_CONSECUTIVE_FAILURES = 3


# ---------------------------------------------------------------- records stored in trials


@dataclass(frozen=True)
class SearchResult(Record):
    """A study's state after this process's run: the ranking and what happened."""

    study_name: str
    storage: str
    run_dir: str
    info: StudyInfo
    sampler: str
    n_trials: int
    ranked: tuple[RankedTrial, ...]
    pareto: tuple[int, ...]
    counts: dict[str, int]
    pruned_by_upper_bound: int
    pruned_infeasible: int
    reused: int
    told_here: tuple[int, ...]
    interrupted: bool
    wall_s: float
    baseline_tokens_per_s: float
    interrupted_trial: int | None = None  # the trial in flight at Ctrl-C (told FAIL), if any
    profile_note: str | None = None  # calibration summary, or: the profile was not measured here
    references: tuple[RankedTrial, ...] = ()  # the space's published drafters, priced the same way

    @property
    def best(self) -> RankedTrial | None:
        return self.ranked[0] if self.ranked else None


# ---------------------------------------------------------------- scoring (pure, fast)


# ---------------------------------------------------------------- evaluation (the expensive part)


# ---------------------------------------------------------------- storage


# ---------------------------------------------------------------- the study


@dataclass(frozen=True)
class StudySettings(Record):
    """How a study runs: what `draftnas search` was asked and what the loop runs with alike."""

    n_trials: int = 20
    timeout_s: float | None = None
    storage: str | None = None
    study_name: str | None = None
    sampler: str = "tpe"  # stored lower-case
    seed: int | None = 0
    run_dir: str = "runs"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampler", self.sampler.lower())


@dataclass(frozen=True)
class SearchOptions:
    """Everything `run_search` needs besides the latency model and the evaluator (resolved)."""

    target: str
    target_arch: Architecture
    base: str
    base_arch: Architecture
    space: SearchSpace
    profile: str
    study: StudySettings = StudySettings()
    acceptance_prior: float | None = None
    upper_bound_pruning: bool = True
    profile_note: str | None = None  # calibration summary, or: the profile is not of this machine
    placement: Placement | None = None  # GPUs, tensor parallelism and memory (GPU profiles with hardware)
    acceptance_model: str | None = None  # label of the alpha(drafter) model the evaluator predicts with
    engine: str | None = None  # the loop engine the calibration timed (None: the profile as it is)

    @property
    def study_name(self) -> str:
        return self.study.study_name or default_study_name(self.target, self.space, self.study.sampler)


def default_study_name(target: str, space: SearchSpace, sampler: str) -> str:
    name = space.name if space.target.lower() == target.lower() else f"{space.name}-for-{target}"
    return f"{name}-nsga2" if sampler == "nsga2" else name


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions of the space's knobs (a knob with one value is not searched)."""
    out: dict[str, BaseDistribution] = {}
    d = space.depth
    if d.max > d.min:
        out["depth"] = IntDistribution(d.min, d.max - (d.max - d.min) % d.step, step=d.step)
    w = space.width
    for name, values in (("layer_selection", space.layer_selection), ("kv_head_ratio", w.kv_head_ratios),
                         ("query_head_ratio", w.query_head_ratios), ("mlp_ratio", w.mlp_ratios),
                         ("hidden_ratio", w.hidden_ratios), ("vocab_size", space.vocab_sizes)):
        if len(values) > 1:
            out[name] = CategoricalDistribution(list(values))
    return out


def make_sampler(name: str, seed: int | None, n_trials: int) -> optuna.samplers.BaseSampler:
    """TPE (default; multivariate, constant liar for parallel workers), NSGA-II or random."""
    if name not in SAMPLERS:
        raise InvalidInputError(f"--sampler {name!r} is not known (allowed: {', '.join(SAMPLERS)})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, min(10, n_trials // 3)),
                                              multivariate=True, constant_liar=True)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, min(50, n_trials // 5)))
    return optuna.samplers.RandomSampler(seed=seed)


def _objectives(sampler: str) -> tuple[str, list[optuna.study.StudyDirection]]:
    up, down = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    if sampler == "nsga2":
        return "latency,acceptance", [down, up]
    return "throughput", [up]


def open_study(options: SearchOptions, info: StudyInfo, storage_url: str) -> optuna.Study:
    """Create the study or load it (several workers, resume); refuse a study made for another search."""
    _, directions = _objectives(options.study.sampler)
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
        raise InvalidInputError(f"study {name!r} in {redact(storage_url)} was made with a different "
                                f"{', '.join(diff)}; pass another --study (or the same settings) to resume")
    return study


@dataclass
class _Run:
    """Mutable state of this process's loop."""

    study: optuna.Study
    options: SearchOptions
    info: StudyInfo
    predictor: LatencyPredictor  # the drafter's (on its GPUs)
    target_predictor: LatencyPredictor  # the target's (sharded over its GPUs)
    evaluator: Evaluator
    target_latency: TargetLatency
    dists: dict[str, BaseDistribution]
    told: list[int] = field(default_factory=list)
    failures_in_a_row: int = 0
    interrupted_trial: int | None = None
    gate: InterruptGate = field(default_factory=InterruptGate)


def run_search(options: SearchOptions, predictor: LatencyPredictor, evaluator: Evaluator, *,
               progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Run (or resume, or join) the study until it holds `n_trials` finished trials.

    Finished = COMPLETE or PRUNED (FAIL trials are retried). Stops early at `timeout_s`
    or Ctrl-C (the trial in flight is told FAIL; the result says `interrupted`).
    """
    start = time.monotonic()
    settings = options.study
    objectives, _ = _objectives(settings.sampler)
    if evaluator.measured != (options.acceptance_prior is None and options.acceptance_model is None):
        raise InvalidInputError("an acceptance prior and a measuring evaluator exclude each other")
    info = StudyInfo(schema=STUDY_SCHEMA, target=options.target, base=options.base, space=options.space,
                     objectives=objectives, acceptance_assumed=not evaluator.measured,
                     acceptance_prior=options.acceptance_prior, profile=options.profile,
                     target_arch=options.target_arch, base_arch=options.base_arch,
                     acceptance_model=options.acceptance_model, placement=options.placement,
                     engine=options.engine, traces=_traces_of(evaluator))
    storage_url = normalize_storage(settings.storage, options.study_name, settings.run_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(options, info, storage_url)
    recover_stale_trials(study)
    existing = len(study.get_trials(deepcopy=False))
    seed = None if settings.seed is None else settings.seed + existing
    study.sampler = make_sampler(settings.sampler, seed, settings.n_trials)
    target_predictor, draft_predictor = deployed(predictor, options.placement)
    run = _Run(study=study, options=options, info=info, predictor=draft_predictor,
               target_predictor=target_predictor, evaluator=evaluator,
               target_latency=target_latency(target_predictor, options.target_arch, options.space.workload,
                                             options.space.gamma),
               dists=distributions(options.space))
    interrupted = False
    try:
        with run.gate.installed():
            _loop(run, start, progress)
    except KeyboardInterrupt:
        interrupted = True
        # A second Ctrl-C raises wherever it lands (the gate's escape hatch), e.g. between
        # creating a trial and evaluating it: fail whatever this process left RUNNING.
        for number in fail_own_running_trials(study, "interrupted (Ctrl-C)"):
            if run.interrupted_trial is None:
                run.interrupted_trial = number
            if number not in run.told:
                run.told.append(number)
        log.info("interrupted (trial in flight: %s); re-run the command to resume", run.interrupted_trial)
    result = collect_result(study, storage_url, options, info, run.told, interrupted,
                            time.monotonic() - start)
    return replace(result, interrupted_trial=run.interrupted_trial, references=_references(run))


def _traces_of(evaluator: Evaluator) -> str | None:
    """The traces a measuring evaluator scores on (recorded in the study for the export)."""
    return str(Path(evaluator.traces_path).resolve()) if isinstance(evaluator, WeightsEvaluator) else None


def _loop(run: _Run, start: float, progress: Callable[[int, int], None] | None) -> None:
    target, timeout = run.options.study.n_trials, run.options.study.timeout_s
    while True:
        run.gate.check()
        trials = run.study.get_trials(deepcopy=False)
        stale = set(recover_stale_trials(run.study, trials))
        finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        running = sum(t.state == TrialState.RUNNING and t.number not in stale for t in trials)
        if progress is not None:
            progress(min(finished, target), target)
        if finished + running >= target:
            return
        if timeout is not None and time.monotonic() - start >= timeout:
            log.info("timeout of %.0f s reached with %d/%d trials finished", timeout,
                     finished, target)
            return
        _one_trial(run, trials)


def _one_trial(run: _Run, trials: Sequence[FrozenTrial]) -> None:
    trial = ask_with_worker(run.study, run.dists)
    try:
        with heartbeat(run.study, trial._trial_id):
            state, values = _evaluate_trial(run, trial, trials)
    except KeyboardInterrupt:
        run.interrupted_trial = trial.number
        with contextlib.suppress(Exception):
            trial.set_user_attr("failed_reason", "interrupted (Ctrl-C)")
            run.study.tell(trial, state=TrialState.FAIL)
        run.told.append(trial.number)
        raise
    except Exception as exc:  # a flaky evaluation fails one trial, not the study
        log.warning("trial %d failed: %s", trial.number, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        trial.set_user_attr("failed_reason", f"{type(exc).__name__}: {exc}"[:500])
        run.study.tell(trial, state=TrialState.FAIL)
        run.told.append(trial.number)
        run.failures_in_a_row += 1
        if run.failures_in_a_row >= MAX_CONSECUTIVE_FAILURES:
            raise DraftnasError(f"{run.failures_in_a_row} trials in a row failed; last: {exc}") from exc
        return
    run.failures_in_a_row = 0
    run.study.tell(trial, values=values, state=state)
    run.told.append(trial.number)


def _prune(trial: optuna.Trial, kind: str, reason: str,
           records: dict[str, Any] | None = None) -> tuple[TrialState, None]:
    for key, value in (records or {}).items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("pruned_kind", kind)
    trial.set_user_attr("pruned_reason", reason)
    log.info("trial %d pruned (%s): %s", trial.number, kind, reason)
    return TrialState.PRUNED, None


def _evaluate_trial(run: _Run, trial: optuna.Trial,
                    trials: Sequence[FrozenTrial]) -> tuple[TrialState, list[float] | None]:
    o = run.options
    choice = CandidateChoice.from_params(trial.params, o.space)
    try:
        candidate = build_candidate(o.space, o.base_arch, o.base, choice, target=o.target_arch)
    except InfeasibleCandidateError as exc:
        return _prune(trial, "infeasible", str(exc), {"choice": choice.to_dict()})
    try:
        latency = _read(run, candidate)
    except InfeasibleCandidateError as exc:
        return _prune(trial, "infeasible", str(exc), {"candidate": candidate.to_dict()})
    bound = predict_workload(latency, assumed_acceptance(1.0), o.space.workload, o.space.gamma)
    records = {"candidate": candidate.to_dict(), "latency": latency.to_dict(),
               "upper_bound_tokens_per_s": bound.tokens_per_s}
    if bound.speedup <= 1.0 + 1e-9:
        return _prune(trial, "infeasible", f"even with every draft accepted it predicts {bound.speedup:.3f}x "
                      "the target alone (drafter too slow)", records)
    single = run.info.objectives == "throughput"
    if single and o.upper_bound_pruning:
        best = _best_value(trials)
        if best is not None and bound.tokens_per_s <= best:
            return _prune(trial, "upper_bound", f"upper bound {bound.tokens_per_s:.2f} tokens/s "
                          f"(acceptance 1) cannot beat the best trial's {best:.2f}", records)
    evaluation = _reuse(run, trial, candidate, trials)
    if evaluation is None:
        if run.evaluator.measured:  # so a trial that dies while healing still says what it was
            for key, value in records.items():
                trial.set_user_attr(key, value)
        with run.gate.immediate():  # minutes of healing: Ctrl-C stops it at once
            try:
                evaluation = run.evaluator.evaluate(candidate)
            except InfeasibleCandidateError as exc:  # e.g. outside what an acceptance model was fitted on
                return _prune(trial, "infeasible", str(exc), records)
    return _finish(run, trial, evaluation, candidate, latency, single)


def _read(run: _Run, candidate: Candidate) -> LatencyReading:
    o = run.options
    return read_latency(run.predictor, o.profile, candidate.arch, o.space.workload, run.target_latency,
                        candidate.head_vocab_size, placement=o.placement, target_arch=o.target_arch,
                        target_predictor=run.target_predictor)


def _economics(run: _Run, candidate: Candidate, acceptance: AcceptanceReading) -> BatchEconomics:
    o = run.options
    return batch_economics(run.predictor, run.target_predictor, o.profile, candidate.arch, o.target_arch,
                           o.space.workload, o.space.gamma, acceptance, candidate.head_vocab_size,
                           o.placement)


def reference_candidate(name: str, base: str, base_arch: Architecture) -> Candidate:
    """A published drafter from the registry as a candidate cut from `base` (its first layers)."""
    from draftnas.registry import get_architecture

    arch = get_architecture(name)
    return Candidate(name=name, base=base, arch=arch, choice=CandidateChoice(depth=arch.num_hidden_layers),
                     plan=None)


def _references(run: _Run) -> tuple[RankedTrial, ...]:
    """The space's published drafters, priced with the trials' latency model and acceptance source."""
    o, out = run.options, []
    for name in o.space.references:
        candidate = reference_candidate(name, o.base, o.base_arch)
        try:
            latency = _read(run, candidate)
        except InfeasibleCandidateError as exc:
            log.warning("reference drafter %s: %s", name, exc)
            continue
        try:
            acceptance = run.evaluator.evaluate(candidate).acceptance
        except InfeasibleCandidateError as exc:
            log.warning("reference drafter %s: %s", name, exc)
            continue
        prediction = predict_workload(latency, acceptance, o.space.workload, o.space.gamma)
        out.append(RankedTrial(number=-1, candidate=candidate, latency=latency, acceptance=acceptance,
                               throughput=prediction,
                               economics=_economics(run, candidate, acceptance), reference=name))
    return tuple(out)


def _best_value(trials: Sequence[FrozenTrial]) -> float | None:
    values = [t.values[0] for t in trials if t.state == TrialState.COMPLETE and t.values]
    return max(values) if values else None


def _reuse(run: _Run, trial: optuna.Trial, candidate: Candidate,
           trials: Sequence[FrozenTrial]) -> Evaluation | None:
    """An earlier completed trial of the same drafter: reuse its evaluation instead of healing again."""
    if not run.evaluator.measured:
        return None
    for t in trials:
        stored = t.user_attrs.get("candidate")
        if (t.state == TrialState.COMPLETE and stored and "acceptance" in t.user_attrs
                and Candidate.from_dict(stored).key == candidate.key):
            trial.set_user_attr("reused_from", t.number)
            return Evaluation(candidate=Candidate.from_dict(stored),
                              acceptance=AcceptanceReading.from_dict(t.user_attrs["acceptance"]))
    return None


def _finish(run: _Run, trial: optuna.Trial, evaluation: Evaluation, proposed: Candidate,
            latency: LatencyReading, single: bool) -> tuple[TrialState, list[float]]:
    o = run.options
    candidate = evaluation.candidate
    if candidate.arch != proposed.arch:  # the real plan's shape differs from the proposed one
        latency = _read(run, candidate)
    prediction = predict_workload(latency, evaluation.acceptance, o.space.workload, o.space.gamma)
    economics = _economics(run, candidate, evaluation.acceptance)
    for key, rec in (("candidate", candidate), ("latency", latency), ("acceptance", evaluation.acceptance),
                     ("throughput", prediction), ("economics", economics)):
        trial.set_user_attr(key, rec.to_dict())
    if single:
        return TrialState.COMPLETE, [prediction.tokens_per_s]
    i = o.space.workload.batch_sizes.index(o.space.workload.primary_batch_size)
    return TrialState.COMPLETE, [latency.draft_ms[i], evaluation.acceptance.acceptance_rate]


# ---------------------------------------------------------------- results from storage


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


def fingerprint_text(data: Any) -> str:
    """Short stable hash of JSON-able data (for cache file names)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- real weights: plan, heal, estimate


# ---------------------------------------------------------------- the command's entry point


@dataclass(frozen=True)
class SearchRequest:
    """What `draftnas search` was asked (CLI flags, before anything is resolved)."""

    target: str
    base: str | None = None
    base_shape: str | None = None
    space: str | SearchSpace | None = None  # a YAML file or shipped name, or a space itself
    profile: str | None = None
    traces: str | None = None
    study: StudySettings = StudySettings()
    acceptance_prior: float | None = None
    calibrate: bool = True  # time the target on this machine before ranking (measured CPU profiles)
    acceptance_model: str | None = None  # an alpha(drafter) model file (`draftnas alpha fit`)
    acceptance_anchor: float | None = None  # with a model: the alpha of the space's first reference drafter
    gpus: int | None = None  # target tensor-parallel degree (GPU profiles); None: the smallest that fits
    draft_tp: str = "1"  # "1": drafter on one GPU; "same": sharded like the target
    dtype: str | None = None  # weights' dtype (spec-sheet profiles are re-derived for it)
    memory_margin: float = 0.1  # share of each GPU's memory kept free
    engine: str = "static"  # the loop the calibration times: "static" (draftnas's decoder) or "hf"


def resolve_architecture(spec: str) -> Architecture:
    """A registry name's shape, or a Hugging Face folder's config (read without loading weights)."""
    from draftnas.registry import get_architecture, load_registry

    if spec.lower() in load_registry():
        return get_architecture(spec)
    config = Path(spec).expanduser() / "config.json"
    if config.is_file():
        from types import SimpleNamespace

        data = json.loads(config.read_text())
        text = data.get("text_config") or data
        ns = SimpleNamespace(**{**text, "model_type": data.get("model_type", "llama"),
                                "tie_word_embeddings": data.get("tie_word_embeddings", False)})
        return Architecture.from_hf_config(ns, name=Path(spec).name)
    return get_architecture(spec)  # raises with close-name suggestions


def has_weights(spec: str) -> bool:
    """Whether `spec` names weights loadable here (embedded, folder, .gguf), without loading."""
    from draftnas.sources import resolve_source

    try:
        return resolve_source(spec).kind in ("embedded", "folder", "gguf")
    except DraftnasError:
        return False


def host_cpu_profile(engine: str = "static") -> str:
    """The shipped CPU profile to start from here: one measured on this CPU model with this many
    threads, in the mode that prices `engine` if there is one, else any measured here, else
    "cpu" (the Intel Xeon profile; `host_mismatch` then says so)."""
    from draftnas.latency import SHIPPED_PROFILES, default_profile
    from draftnas.profile import host_mismatch

    mode = "static" if engine == "static" else "eager"
    cpu = {k: default_profile(k) for k in SHIPPED_PROFILES if k.startswith("cpu")}
    here = [(p.mode != mode, k) for k, p in cpu.items() if host_mismatch(p) is None]
    return min(here)[1] if here else "cpu"


def resolve_profile(spec: str | None, space: SearchSpace, dtype: str | None = None,
                    engine: str = "static") -> tuple[str, LatencyProfile]:
    """A label naming the profile (file, device, kind) and the profile. `dtype`: a shipped spec-sheet
    profile is re-derived for it; a measured profile must have been measured in it. The name
    "cpu" (the spaces' default) is the shipped CPU profile measured on this host, when one is
    (`host_cpu_profile`, for the loop `engine`)."""
    from draftnas.latency import (
        SHIPPED_PROFILES,
        SPEC_SHEETS,
        default_profile,
        load_profile,
        spec_sheet_profile,
    )

    name = spec or space.profile or "cpu"
    if name == "cpu":
        name = host_cpu_profile(engine)
    path = Path(name).expanduser()
    profile = load_profile(path) if path.suffix == ".json" or path.is_file() else default_profile(name)
    if dtype is not None and dtype != profile.dtype:
        if profile.kind == "spec-sheet" and name.lower() in SPEC_SHEETS and name.lower() in SHIPPED_PROFILES:
            profile = spec_sheet_profile(name.lower(), dtype)
        else:
            raise InvalidInputError(f"--dtype {dtype}: the profile {name} was measured in {profile.dtype}; "
                                    f"measure one in {dtype} (`draftnas profile --dtype {dtype}`)")
    return f"{name} ({profile.device_name}, {profile.kind}, {profile.dtype})", profile


def calibrated_predictor(profile: LatencyProfile, target: Architecture, space: SearchSpace,
                         progress: Callable[[int, int], None] | None = None,
                         engine: str = "static") -> tuple[LatencyPredictor, str]:
    """The profile's model corrected by timing `target`'s decode, its verify at every gamma + 1
    the space considers, drafter-sized prefixes of it, the time the space's reduced heads save and
    the work outside the forward on this machine, in the loop `engine` that bench then runs
    (`calibrate_host`, about 1 min for SmolLM2-135M on 2 cores in the static engine), with the
    one-line summary of what was measured against what the profile said."""
    from draftnas.latency import CalibratedModel, LatencyModel
    from draftnas.profile import ProfileOptions, calibrate_host

    g = space.gamma
    counts = [n + 1 for n in range(max(1, g.min), g.max + 1)]
    mode = "static" if engine == "static" else "eager"
    options = ProfileOptions(device="cpu", dtype=profile.dtype, mode=mode, repeats=5, warmup=1)
    heads = [v for v in space.vocab_sizes if v > 0]
    calibration = calibrate_host(options, target, counts, context_tokens=space.workload.context_tokens,
                                 progress=progress, prompt_tokens=space.workload.prompt_tokens,
                                 head_rows=heads)
    model = CalibratedModel(LatencyModel.from_profile(profile), calibration, target)
    return model, model.summary()


def default_traces(request: SearchRequest, space: SearchSpace, study_name: str,
                   progress: Callable[[int, int], None] | None = None) -> Path:
    """Traces of the target over the space's prompt set, built once and cached in the run folder."""
    from draftnas.prompts import load_prompts
    from draftnas.traces import TraceOptions, build_traces

    w, t = space.workload, space.traces
    prompts = [p for p in load_prompts(w.prompt_set) if w.domain is None or p.domain == w.domain]
    prompts = prompts[:t.prompts]
    key = fingerprint_text([request.target, w.prompt_set, w.domain, t.prompts, t.max_new_tokens,
                            w.temperature])
    out = Path(request.study.run_dir).expanduser() / study_name / f"traces-{key}.safetensors"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    options = TraceOptions(max_new_tokens=t.max_new_tokens, temperatures=(w.temperature,),
                           batch_size=min(len(prompts), 16))
    log.info("building traces of %s over %d %s prompts into %s", request.target, len(prompts),
             w.prompt_set, out)
    return build_traces(request.target, prompts, options, out, prompt_set=w.prompt_set, progress=progress)


def plan_search(request: SearchRequest, trace_progress: Callable[[int, int], None] | None = None,
                calibration_progress: Callable[[int, int], None] | None = None
                ) -> tuple[SearchOptions, LatencyPredictor, Evaluator]:
    """Resolve the request: shapes, space, profile, and measured or assumed acceptance."""
    from draftnas.space import default_space_for, load_search_space

    if isinstance(request.space, SearchSpace):
        space = request.space
    else:
        space = load_search_space(request.space) if request.space else default_space_for(request.target)
    target_arch = resolve_architecture(request.target)
    base = request.base_shape or request.base or space.base
    base_arch = resolve_architecture(base)
    problems = space.problems_for_base(base_arch)
    if base_arch.vocab_size != target_arch.vocab_size:
        problems.append(f"base {base} reads {base_arch.vocab_size} token ids but target {request.target} "
                        f"{target_arch.vocab_size}; a drafter must share the target's tokenizer")
    if problems:
        raise InvalidInputError("; ".join(problems))
    from draftnas.latency import LatencyModel, TargetTimedModel
    from draftnas.profile import host_mismatch

    profile, latency_profile = resolve_profile(request.profile, space, request.dtype, request.engine)
    predictor: LatencyPredictor = LatencyModel.from_profile(latency_profile)
    profile_note = host_mismatch(latency_profile)
    timed = [t for t in latency_profile.targets.values() if t.target == target_arch.name]
    if timed:
        predictor = TargetTimedModel(predictor, timed)
        checks = [f"{t.check.mean_abs_error_pct:.1f}% mean error on {t.check.shape}"
                  for t in timed if t.check]
        layers = "/".join(map(str, timed[0].timed_layers))
        note = (f"{target_arch.name} priced from its first {layers} layers "
                f"timed on {timed[0].device_name} and extrapolated to full depth "
                f"({', '.join(checks) or 'method not checked here'})")
        profile_note = f"{profile_note}; {note}" if profile_note else note
    if request.study.n_trials < 1:
        raise InvalidInputError(f"--trials must be >= 1, got {request.study.n_trials}")
    if request.study.sampler not in SAMPLERS:
        raise InvalidInputError(f"--sampler {request.study.sampler!r} is not known "
                                f"(allowed: {', '.join(SAMPLERS)})")
    placement = _placement(request, latency_profile, target_arch, space)
    if request.engine not in ENGINES:
        raise InvalidInputError(f"--engine {request.engine!r} is not known (allowed: {', '.join(ENGINES)})")
    engine = None
    if request.calibrate and latency_profile.device == "cpu" and latency_profile.kind == "measured":
        engine = request.engine
        predictor, profile_note = calibrated_predictor(latency_profile, target_arch, space,
                                                       calibration_progress, engine=engine)
    evaluator: Evaluator
    model_label = None
    if request.acceptance_model is not None:
        if request.acceptance_prior is not None:
            raise InvalidInputError("--acceptance-prior takes either a number or a model file, not both")
        evaluator, model_label = _model_evaluator(request, space, base, base_arch)
    elif request.acceptance_anchor is not None:
        raise InvalidInputError("--acceptance-anchor needs an acceptance model "
                                "(--acceptance-prior MODEL.json)")
    options = SearchOptions(
        target=request.target, target_arch=target_arch, base=base, base_arch=base_arch, space=space,
        profile=profile, study=request.study, acceptance_prior=request.acceptance_prior,
        profile_note=profile_note, placement=placement, acceptance_model=model_label, engine=engine)
    if request.acceptance_model is not None:
        return options, predictor, evaluator
    if request.acceptance_prior is not None:
        return options, predictor, PriorEvaluator(request.acceptance_prior)
    return options, predictor, _measuring_evaluator(request, options, trace_progress)


def _placement(request: SearchRequest, profile: LatencyProfile, target: Architecture,
               space: SearchSpace) -> Placement | None:
    """Where the target runs: GPU profiles that carry their hardware; None on a CPU profile."""
    from draftnas.placement import place

    if profile.hardware is None or profile.device != "cuda":
        if request.gpus not in (None, 1):
            raise InvalidInputError(f"--gpus applies to GPU profiles with hardware figures; the profile "
                                    f"{profile.device_name} ({profile.device}) has none")
        return None
    w = space.workload
    return place(target, profile.hardware, profile.dtype, batch_sizes=w.batch_sizes,
                 context_tokens=w.context_tokens, max_gamma=space.gamma.max, gpus=request.gpus,
                 draft_tp=request.draft_tp, margin=request.memory_margin)


def _model_evaluator(request: SearchRequest, space: SearchSpace, base: str,
                     base_arch: Architecture) -> tuple[Evaluator, str]:
    """The alpha(drafter) model's evaluator and its label; healing as the space's budget, or (a
    latency-only space heals nothing) the largest budget the model was fitted on."""
    from draftnas.alpha import load_alpha_model
    from draftnas.evaluate import ModelEvaluator

    assert request.acceptance_model is not None
    path = Path(request.acceptance_model).expanduser()
    model = load_alpha_model(path)
    heal = space.heal.steps or round(math.expm1(model.ranges["log1p_heal_steps"][1]))
    anchor = None
    label = model.label() + f" ({path.name} {fingerprint_text(path.read_text())}, at {heal} heal steps)"
    if request.acceptance_anchor is not None:
        if not 0.0 < request.acceptance_anchor < 1.0:
            raise InvalidInputError(f"--acceptance-anchor must be in (0, 1), "
                                    f"got {request.acceptance_anchor:g}")
        if not space.references:
            raise InvalidInputError("--acceptance-anchor sets the alpha of the space's first reference "
                                    "drafter; "
                                    f"search space {space.name!r} lists none (`references:`)")
        anchor = (reference_candidate(space.references[0], base, base_arch), request.acceptance_anchor)
        label += f"; level ASSUMED: alpha {request.acceptance_anchor:g} for {space.references[0]}"
    return ModelEvaluator(model, base_arch, heal, space.workload.domain, anchor), label


def _measuring_evaluator(request: SearchRequest, options: SearchOptions,
                         trace_progress: Callable[[int, int], None] | None) -> Evaluator:
    space = options.space
    if space.latency_only:
        raise InvalidInputError(f"search space {space.name!r} is latency-only (it prunes the hidden "
                                "size); pass --acceptance-prior A (e.g. 0.7) to search it with an assumed "
                                "acceptance")
    missing = []
    if request.base_shape or not has_weights(options.base):
        missing.append(f"base weights (--base FOLDER; {options.base!r} has none here)")
    if request.traces is None and not has_weights(request.target):
        missing.append(f"target traces (--traces FILE from `draftnas trace`; {request.target!r} has no "
                       "weights here to build them)")
    if missing:
        raise InvalidInputError("measuring acceptance needs " + " and ".join(missing) + "; or pass "
                                "--acceptance-prior A to search on latency with an assumed acceptance")
    name = options.study_name
    traces = Path(request.traces) if request.traces else default_traces(request, space, name, trace_progress)
    if not traces.is_file():
        raise InvalidInputError(f"--traces {traces} is not a file")
    return WeightsEvaluator(options.base, options.base_arch, traces, space, seed=request.study.seed or 0)


def search(request: SearchRequest, *, progress: Callable[[int, int], None] | None = None,
           trace_progress: Callable[[int, int], None] | None = None,
           calibration_progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """`draftnas search`: resolve the request, then run (or resume, or join) the study."""
    options, predictor, evaluator = plan_search(request, trace_progress, calibration_progress)
    return run_search(options, predictor, evaluator, progress=progress)
