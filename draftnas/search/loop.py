"""The search: an Optuna study over drafter shapes, ranked by predicted speculative throughput.

Ask/tell loop (Optuna): each trial proposes a `CandidateChoice`, builds the
`Candidate`, reads its latency from a latency model, checks an upper bound
(acceptance 1 at that latency) against the best trial so far, and only then runs
the expensive evaluation (pruning plan on real weights, healing, acceptance on
traces) — or takes an acceptance the user assumed. The objective is the
workload's predicted tokens/s at each batch size's best gamma (Yan et al. 2025,
eq. 1-3; `draftnas.core.throughput`). Every trial stores its records as JSON user
attributes, so ranking, reports and export rebuild everything from storage.

Storage is Optuna's: a SQLite file beside the run's outputs by default,
`postgresql://...` for several machines, or a journal file. Several processes
can work on one study; a killed process loses at most its trial in flight, which
the next run marks FAIL (same host: its process is gone; other hosts: heartbeat).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from draftnas.core.engine_kinds import STATIC
from draftnas.core.errors import DraftnasError, InfeasibleCandidateError, InvalidInputError
from draftnas.core.placement import deployed
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.drafter.families import family
from draftnas.drafter.training.distill_records import TrainedPrice
from draftnas.models.sources import has_weights
from draftnas.search.candidate import build_candidate, reference_candidate
from draftnas.search.evaluate import Evaluation, Evaluator, WeightsEvaluator
from draftnas.search.explain import standing_lines
from draftnas.search.hand_made import ATTR as HAND_MADE
from draftnas.search.hand_made import hand_made_best, hand_made_params, next_hand_made
from draftnas.search.healing import heal_within_budget
from draftnas.search.liveness import (
    InterruptGate,
    ask_with_worker,
    fail_own_running_trials,
    heartbeat,
    recover_stale_trials,
)
from draftnas.search.records import (
    AcceptanceReading,
    BatchEconomics,
    Candidate,
    CandidateChoice,
    LatencyPredictor,
    LatencyReading,
    RankedTrial,
    SearchResult,
    StudyInfo,
    TargetLatency,
)
from draftnas.search.results import collect_result
from draftnas.search.run_options import SearchOptions
from draftnas.search.scoring import (
    assumed_acceptance,
    batch_economics,
    predict_workload,
    read_latency,
    target_latency,
    weights_predictor,
)
from draftnas.search.space import HealBudget
from draftnas.search.storage import normalize_storage, ranked_trials
from draftnas.search.study import distributions, make_sampler, objectives, open_study
from draftnas.search.trained import price_trained

log = logging.getLogger(__name__)
SamplerName = Literal["tpe", "nsga2", "random"]
STUDY_SCHEMA = 1
MAX_CONSECUTIVE_FAILURES = 3


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
    hand_made: int = 0  # hand-made trials the study holds beside the search's own (`search.hand_made`)
    gate: InterruptGate = field(default_factory=InterruptGate)
    standings: Callable[[list[str]], None] | None = None  # the ranking so far, while the search runs
    said_at: int = -1  # the finished count the last standing was said at


def run_search(options: SearchOptions, predictor: LatencyPredictor, evaluator: Evaluator, *,
               progress: Callable[[int, int], None] | None = None,
               standings: Callable[[list[str]], None] | None = None) -> SearchResult:
    """Run (or resume, or join) the study until it holds `n_trials` finished trials; `standings` is
    given the ranking so far after the hand-made trials and each quarter of the search's own
    (`explain.standing_lines`).

    Finished = COMPLETE or PRUNED (FAIL trials are retried). Stops early at `timeout_s`
    or Ctrl-C (the trial in flight is told FAIL; the result says `interrupted`).
    """
    start = time.monotonic()
    settings = options.study
    kind, _ = objectives(settings.sampler)
    if evaluator.measured != (options.acceptance_prior is None and options.acceptance_model is None):
        raise InvalidInputError("an acceptance prior and a measuring evaluator exclude each other")
    info = StudyInfo(schema=STUDY_SCHEMA, target=options.target, base=options.base, space=options.space,
                     objectives=kind, acceptance_assumed=not evaluator.measured,
                     acceptance_prior=options.acceptance_prior, profile=options.profile,
                     target_arch=options.target_arch, base_arch=options.base_arch,
                     acceptance_model=options.acceptance_model, placement=options.placement,
                     engine=options.engine, traces=_traces_of(evaluator), dtype=options.dtype,
                     references=options.references, device=options.device, quant_dtype=options.quant_dtype)
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
               dists=distributions(options.space), standings=standings)
    if evaluator.builds:  # the stock drafter under each global transform, first
        run.hand_made = len(hand_made_params(options.space, options.base_arch))
    interrupted = False
    try:
        with run.gate.installed():
            _loop(run, start, progress)
            if settings.heal_budget_s and evaluator.builds:
                heal_within_budget(ranked_trials(study), options.base_arch, options.space.heal,
                                   settings.heal_budget_s, lambda r, h: _heal_one(run, r, h),
                                   train=settings.heal_with)
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
    result = replace(result, interrupted_trial=run.interrupted_trial, references=_references(run))
    return replace(result, trained=_trained(run, result)) if options.curves is not None else result


def _traces_of(evaluator: Evaluator) -> str | None:
    """The traces a measuring evaluator scores on (recorded in the study for the export)."""
    return str(Path(evaluator.traces_path).resolve()) if isinstance(evaluator, WeightsEvaluator) else None


def _loop(run: _Run, start: float, progress: Callable[[int, int], None] | None) -> None:
    target, timeout = run.options.study.n_trials + run.hand_made, run.options.study.timeout_s
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
        _standing(run, finished, target)
        if timeout is not None and time.monotonic() - start >= timeout:
            log.info("timeout of %.0f s reached with %d/%d trials finished", timeout,
                     finished, target)
            return
        _one_trial(run, trials)


def _standing(run: _Run, finished: int, target: int) -> None:
    """Say the ranking so far once the hand-made trials are in, then after each quarter of the rest."""
    if run.standings is None or finished == run.said_at or finished < max(run.hand_made, 1):
        return
    step = max(1, (target - run.hand_made) // 4)
    first = finished == run.hand_made
    if first or (finished - run.hand_made) % step == 0:
        run.said_at = finished
        run.standings(standing_lines(ranked_trials(run.study), finished, target,
                                     first and run.hand_made > 0))


def _one_trial(run: _Run, trials: Sequence[FrozenTrial]) -> None:
    o = run.options
    made = next_hand_made(trials, o.space, o.base_arch) if run.hand_made else None
    trial = ask_with_worker(run.study, run.dists, *(made or ()))
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


def _heal_one(run: _Run, r: RankedTrial, heal: HealBudget) -> None:
    """Heal trial `r`'s drafter with `heal`, score and price it again, and tell it as a trial of its own
    that records what the healing cost and gained."""
    started = time.monotonic()
    params = run.study.trials[r.number].params
    trial = ask_with_worker(run.study, run.dists, params, {"healed": {"from": r.number}})
    try:
        with heartbeat(run.study, trial._trial_id), run.gate.immediate():
            evaluation = run.evaluator.evaluate(r.candidate, heal=heal)
            state, values = _finish(run, trial, evaluation, r.candidate, _read(run, r.candidate), True)
    except Exception as exc:  # a failed healing fails its own trial, not the search
        log.warning("healing trial %d failed: %s", r.number, exc)
        trial.set_user_attr("failed_reason", f"{type(exc).__name__}: {exc}"[:500])
        run.study.tell(trial, state=TrialState.FAIL)
        run.told.append(trial.number)
        return
    trial.set_user_attr("healed", {
        "from": r.number, "minutes": round((time.monotonic() - started) / 60, 2),
        "top1_before": r.acceptance.acceptance_rate, "top1_after": evaluation.acceptance.acceptance_rate,
        "tokens_per_s_before": r.throughput.tokens_per_s, "train": heal.train})
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
    if single and o.upper_bound_pruning and HAND_MADE not in trial.user_attrs:  # the bar needs its acceptance
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


def _read(run: _Run, candidate: Candidate, weights: str | None = None) -> LatencyReading:
    """The candidate's latency reading with its linear layers in `weights` (default: its own format)."""
    o = run.options
    predictor = weights_predictor(run.predictor, weights or candidate.choice.weights)
    return read_latency(predictor, o.profile, candidate.arch, o.space.workload, run.target_latency,
                        candidate.head_vocab_size, placement=o.placement, target_arch=o.target_arch,
                        target_predictor=run.target_predictor)


def _economics(run: _Run, candidate: Candidate, acceptance: AcceptanceReading) -> BatchEconomics | None:
    """The batch sweep; None where the latency model prices one sequence only (llama.cpp here)."""
    o = run.options
    if getattr(run.predictor, "max_batch_size", None) == 1:
        return None
    predictor = weights_predictor(run.predictor, candidate.choice.weights)
    return batch_economics(predictor, run.target_predictor, o.profile, candidate.arch, o.target_arch,
                           o.space.workload, o.space.gamma, acceptance, candidate.head_vocab_size,
                           o.placement)


def _references(run: _Run) -> tuple[RankedTrial, ...]:
    """The drafters a user would otherwise pick (the space's references and --reference), priced with
    the trials' latency model; a reference with weights here is estimated on the trials' held-out
    traces as it is (no pruning, no healing), a registry shape gets the trials' acceptance source."""
    o, out = run.options, []
    for name in o.references or o.space.references:
        candidate = reference_candidate(name, o.base, o.base_arch)
        try:
            latency = _read(run, candidate)
        except InfeasibleCandidateError as exc:
            log.warning("reference drafter %s: %s", name, exc)
            continue
        try:
            if isinstance(run.evaluator, WeightsEvaluator) and has_weights(name):
                acceptance = run.evaluator.evaluate_reference(candidate).acceptance
            else:
                acceptance = run.evaluator.evaluate(candidate).acceptance
        except InfeasibleCandidateError as exc:
            log.warning("reference drafter %s: %s", name, exc)
            continue
        prediction = predict_workload(latency, acceptance, o.space.workload, o.space.gamma)
        out.append(RankedTrial(number=-1, candidate=candidate, latency=latency, acceptance=acceptance,
                               throughput=prediction,
                               economics=_economics(run, candidate, acceptance), reference=name))
    return tuple(out)


def _trained(run: _Run, result: SearchResult) -> tuple[TrainedPrice, ...]:
    """The curves' shapes priced with the trials' latency model at the request's budget, against the
    hand-made best (else, for a target without a stock drafter, the search's best trial)."""
    o = run.options
    assert o.curves is not None
    bar = hand_made_best(result) or result.best

    def read(arch: Architecture, head_rows: int | None) -> LatencyReading:
        return read_latency(run.predictor, o.profile, arch, o.space.workload, run.target_latency, head_rows,
                            placement=o.placement, target_arch=o.target_arch,
                            target_predictor=run.target_predictor)

    bar_tps = None
    if bar is not None:  # priced again with this run's latency model, as the shapes are
        bar_tps = predict_workload(_read(run, bar.candidate), bar.acceptance, o.space.workload,
                                   o.space.gamma).tokens_per_s
    heads_run = (o.engine or STATIC) in family("head").engines
    return price_trained(o.curves, o.train_tokens, read, resolve_architecture, o.space.workload,
                         o.space.gamma, bar_tps, heads_run=heads_run)


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
    dense = None  # a quantized drafter loaded plainly (transformers' assistant_model=) runs dense
    if candidate.choice.weights != "dense":
        with contextlib.suppress(InfeasibleCandidateError):
            dense = _read(run, candidate, "dense")
    for key, rec in (("candidate", candidate), ("latency", latency), ("acceptance", evaluation.acceptance),
                     ("throughput", prediction), ("economics", economics), ("dense_latency", dense)):
        if rec is not None:
            trial.set_user_attr(key, rec.to_dict())
    if single:
        return TrialState.COMPLETE, [prediction.tokens_per_s]
    i = o.space.workload.batch_sizes.index(o.space.workload.primary_batch_size)
    return TrialState.COMPLETE, [latency.draft_ms[i], evaluation.acceptance.acceptance_rate]
