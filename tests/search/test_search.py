"""The search: scoring arithmetic, the Optuna loop, storage, resume after SIGKILL, workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from draftnas.core.errors import DraftnasError, InvalidInputError
from draftnas.core.throughput import RequestTerms, best_gamma, predict_throughput
from draftnas.search.evaluate import PriorEvaluator
from draftnas.search.loop import run_search
from draftnas.search.records import AcceptanceReading, LatencyReading
from draftnas.search.results import load_results
from draftnas.search.scoring import assumed_acceptance, predict_workload
from draftnas.search.space import GammaRange, Workload
from draftnas.search.space_file import parse_search_space
from draftnas.search.spaces import load_search_space
from draftnas.search.storage import load_trial, normalize_storage, open_storage
from tests.helpers import SMOL, FakeMeasured, StubLatency, smol_options

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- scoring arithmetic


def _latency():
    return LatencyReading(profile="hand", batch_sizes=(1, 8), context_tokens=128, draft_ms=(2.0, 3.0),
                          target_ms=(20.0, 25.0),
                          verify_ms=tuple(tuple(t + g for g in range(5)) for t in (20.0, 25.0)))


def test_workload_is_the_weighted_harmonic_mean_at_each_batch_best_gamma():
    workload = Workload(batch_sizes=(1, 8), batch_weights=(0.75, 0.25))
    gamma = GammaRange(0, 4)
    pred = predict_workload(_latency(), assumed_acceptance(0.8), workload, gamma)
    b1 = best_gamma(acceptance_rate=0.8, draft_ms=2.0, target_ms=20.0, verify_ms=lambda g: 20.0 + g,
                    max_gamma=4, batch_size=1)
    # a batch of 8 steps in lockstep until its slowest sequence has the workload's tokens (draftnas's loop)
    b8 = best_gamma(acceptance_rate=0.8, draft_ms=3.0, target_ms=25.0, verify_ms=lambda g: 25.0 + g,
                    max_gamma=4, batch_size=8, lockstep_tokens=workload.new_tokens)
    assert b8.lockstep < 1.0 and b1.lockstep == 1.0
    assert pred.per_batch == (b1, b8)
    assert pred.tokens_per_s == pytest.approx(1 / (0.75 / b1.tokens_per_s + 0.25 / b8.tokens_per_s))
    baseline = 1 / (0.75 / (1000 / 20) + 0.25 / (8000 / 25))
    assert pred.baseline_tokens_per_s == pytest.approx(baseline)
    assert pred.speedup == pytest.approx(pred.tokens_per_s / baseline)
    assert pred.acceptance_assumed


def test_measured_tokens_per_step_pick_the_best_gamma_in_range():
    # tokens/step saturates after gamma 2: gamma 2 is best at batch 1 (step 20+2+2*2 ms)
    acc = AcceptanceReading(kind="measured", acceptance_rate=0.5,
                            tokens_per_step={"1": 1.9, "2": 2.8, "3": 2.85, "4": 2.86})
    workload = Workload(batch_sizes=(1,), batch_weights=(1.0,))
    lat = _latency()
    lat1 = LatencyReading(profile="hand", batch_sizes=(1,), context_tokens=128, draft_ms=(2.0,),
                          target_ms=(20.0,), verify_ms=(lat.verify_ms[0],))
    pred = predict_workload(lat1, acc, workload, GammaRange(1, 4))
    expected = max((predict_throughput(gamma=g, draft_ms=2.0, target_ms=20.0, verify_ms=20.0 + g,
                                       tokens_per_step=acc.tokens_per_step[str(g)]) for g in range(1, 5)),
                   key=lambda e: e.tokens_per_s)
    assert pred.per_batch[0] == expected and expected.gamma == 2
    assert not pred.acceptance_assumed


def test_a_confidence_stop_is_priced_at_its_mean_drafts_and_per_prompt_for_the_median():
    """A stop the estimate walked is priced at its mean drafts per step (the verify interpolated between
    whole counts); it wins where it saves drafts; batch 1 also gets the median over prompts."""
    from draftnas.acceptance.records import AcceptanceEstimate, PolicySteps

    def policy(g, p, tokens, drafted, prompts):
        return PolicySteps(gamma=g, p_min=p, tokens_per_step=tokens, drafted_per_step=drafted,
                           prompt_tokens_per_step=tuple(t for t, _ in prompts),
                           prompt_drafted_per_step=tuple(d for _, d in prompts))

    policies = (policy(4, 0.0, 3.0, 4.0, [(2.0, 4.0), (3.0, 4.0), (4.0, 4.0)]),
                policy(4, 0.5, 2.9, 2.5, [(1.5, 1.5), (3.0, 2.5), (4.0, 3.5)]))
    est = AcceptanceEstimate(temperature=0.0, max_gamma=4, n_prompts=3, n_positions=30, top1_agreement=0.8,
                             acceptance_rate=0.8, acceptance_rate_upper=0.8, tokens_per_step={"4": 3.0},
                             tokens_per_step_upper={"4": 3.0}, ci_low={"4": 3.0}, ci_high={"4": 3.0},
                             policies=policies)
    acc = AcceptanceReading(kind="measured", acceptance_rate=0.8, tokens_per_step={"4": 3.0}, estimate=est)
    lat = LatencyReading(profile="hand", batch_sizes=(1,), context_tokens=128, draft_ms=(10.0,),
                         target_ms=(20.0,), verify_ms=(tuple(20.0 + g for g in range(5)),))
    workload = Workload(batch_sizes=(1,), batch_weights=(1.0,))
    fixed = predict_workload(lat, acc, workload, GammaRange(4, 4))
    stopped = predict_workload(lat, acc, workload, GammaRange(4, 4, (0.0, 0.5)))
    assert fixed.per_batch[0].p_min == 0.0 and stopped.per_batch[0].p_min == 0.5
    e = stopped.per_batch[0]
    assert e.verify_ms == pytest.approx(22.5) and e.step_ms == pytest.approx(2.5 * 10 + 22.5)
    assert e.tokens_per_s == pytest.approx(1000 * 2.9 / 47.5) and e.drafting == "4 <0.5"
    assert fixed.per_batch[0].tokens_per_s == pytest.approx(1000 * 3.0 / 64.0)
    # the median prompt (3.0 tokens a step, 2.5 drafts): 3 / (25 + 22.5) ms, speedup over 20 ms a token
    assert stopped.median_tokens_per_s == pytest.approx(1000 * 3.0 / 47.5)
    assert stopped.median_speedup == pytest.approx(3.0 * 20.0 / 47.5)
    # the terms that priced it go with it, so a bench can price its own prompts' walks alike
    assert stopped.request == RequestTerms(draft_ms=10.0, target_ms=20.0, verify_ms=lat.verify_ms[0],
                                           new_tokens=workload.new_tokens, baseline_batch_size=1)
    assert predict_workload(lat, assumed_acceptance(0.8), workload, GammaRange(1, 4, (0.0, 0.5))
                            ).median_tokens_per_s is None  # no walks: no median, no stop


# ---------------------------------------------------------------- the loop


def test_latency_only_search_stores_records_and_ranks_from_storage(tmp_path):
    result = run_search(smol_options(tmp_path, n_trials=15, prior=0.7), StubLatency(), PriorEvaluator(0.7))
    assert result.counts.get("COMPLETE", 0) + result.counts.get("PRUNED", 0) == 15
    assert result.info.acceptance_assumed and "ASSUMED" in result.info.note
    speeds = [r.throughput.tokens_per_s for r in result.ranked]
    assert speeds == sorted(speeds, reverse=True)
    study = _load(normalize_storage(str(tmp_path / "study.db"), "t"), "t")
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        assert {"candidate", "latency", "acceptance", "throughput", "worker"} <= set(t.user_attrs)
        json.dumps(t.user_attrs)  # JSON of records
        assert t.values[0] == pytest.approx(t.user_attrs["throughput"]["tokens_per_s"])
    again = load_results("t", str(tmp_path / "study.db"))
    assert [r.number for r in again.ranked] == [r.number for r in result.ranked]
    info, best = load_trial("t", str(tmp_path / "study.db"))
    assert info == result.info and best == result.ranked[0] and best.acceptance.kind == "assumed"


def test_upper_bound_prunes_without_evaluating(tmp_path):
    evaluator = FakeMeasured(alpha=0.95)  # well accepted: deep drafters cannot catch up even at 1
    options = smol_options(tmp_path, n_trials=30, sampler="random", seed=3)
    result = run_search(options, StubLatency(), evaluator)
    study = _load(normalize_storage(options.study.storage, "t"), "t")
    pruned = [t for t in study.get_trials() if t.user_attrs.get("pruned_kind") == "upper_bound"]
    assert result.pruned_by_upper_bound == len(pruned) > 0
    best = max(t.values[0] for t in study.get_trials(states=(TrialState.COMPLETE,)))
    for t in pruned:
        assert t.user_attrs["upper_bound_tokens_per_s"] <= best
        assert "cannot beat the best trial" in t.user_attrs["pruned_reason"]
    evaluated = result.counts["COMPLETE"] - result.reused
    assert len(evaluator.calls) == evaluated  # pruned and reused trials never reached the evaluator
    assert len(set(evaluator.calls)) == len(evaluator.calls)


def test_infeasible_candidates_are_pruned_with_the_reason(tmp_path):
    space = parse_search_space({"schema_version": 1, "name": "deep", "target": "smollm2-135m",
                                "base": "smollm2-135m", "depth": {"min": 28, "max": 30}})
    options = replace(smol_options(tmp_path, n_trials=6, prior=0.7, sampler="random"), space=space)
    result = run_search(options, StubLatency(), PriorEvaluator(0.7))
    assert result.pruned_infeasible == 6 and not result.ranked
    study = _load(normalize_storage(options.study.storage, "t"), "t")
    reasons = {t.user_attrs["pruned_reason"] for t in study.get_trials()}
    assert any("not fewer than the target's" in r for r in reasons)
    assert any("drafter too slow" in r for r in reasons)


def test_a_failing_evaluation_fails_one_trial_not_the_study(tmp_path):
    evaluator = FakeMeasured(fail_when=lambda c: c.arch.num_hidden_layers == 1)
    result = run_search(smol_options(tmp_path, n_trials=10, sampler="random", seed=1,
                                     upper_bound_pruning=False), StubLatency(), evaluator)
    assert result.counts.get("FAIL", 0) >= 1
    assert result.counts["COMPLETE"] + result.counts.get("PRUNED", 0) == 10
    with pytest.raises(DraftnasError, match="3 trials in a row failed; last: flaky"):
        run_search(smol_options(tmp_path, study="always"), StubLatency(), FakeMeasured(lambda c: True))


def test_ctrl_c_fails_the_trial_in_flight_and_a_rerun_resumes(tmp_path):
    first = run_search(smol_options(tmp_path, n_trials=8, sampler="random", upper_bound_pruning=False),
                       StubLatency(), FakeMeasured(interrupt_at=3))
    assert first.interrupted and first.counts["FAIL"] == 1 and first.counts["COMPLETE"] == 2
    assert first.interrupted_trial == 2
    study = _load(normalize_storage(str(tmp_path / "study.db"), "t"), "t")
    failed = study.get_trials(states=(TrialState.FAIL,))[0]
    assert failed.user_attrs["failed_reason"] == "interrupted (Ctrl-C)"
    second = run_search(smol_options(tmp_path, n_trials=8, sampler="random", upper_bound_pruning=False),
                        StubLatency(), FakeMeasured())
    assert not second.interrupted
    assert second.counts["COMPLETE"] + second.counts.get("PRUNED", 0) == 8


def test_ctrl_c_between_creating_a_trial_and_evaluating_it_leaves_nothing_running(tmp_path, monkeypatch):
    import draftnas.search.loop as search_module

    real_ask, asked = search_module.ask_with_worker, []

    def ask_then_interrupt(study, dists):
        trial = real_ask(study, dists)
        asked.append(trial.number)
        if len(asked) == 3:  # a second Ctrl-C (raised wherever it lands) after the trial exists
            raise KeyboardInterrupt
        return trial

    monkeypatch.setattr(search_module, "ask_with_worker", ask_then_interrupt)
    result = run_search(smol_options(tmp_path, n_trials=8, sampler="random", upper_bound_pruning=False),
                        StubLatency(), FakeMeasured())
    assert result.interrupted and result.interrupted_trial == asked[-1]
    study = _load(normalize_storage(str(tmp_path / "study.db"), "t"), "t")
    assert not study.get_trials(states=(TrialState.RUNNING,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert [t.number for t in failed] == [asked[-1]]
    assert failed[0].user_attrs["failed_reason"] == "interrupted (Ctrl-C)"


@pytest.mark.integration
def test_ctrl_c_waits_for_the_storage_write_but_stops_an_evaluation_at_once():
    """A KeyboardInterrupt inside SQLAlchemy's flush can hang the session: outside an evaluation the
    signal is held until a safe point; inside one it raises at once; a second one always does."""
    from draftnas.search.liveness import InterruptGate

    before = signal.getsignal(signal.SIGINT)
    gate = InterruptGate()
    with gate.installed():
        os.kill(os.getpid(), signal.SIGINT)  # "during a storage write": held
        time.sleep(0.05)
        assert gate.pending
        with pytest.raises(KeyboardInterrupt):
            gate.check()
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    gate = InterruptGate()
    with gate.installed(), pytest.raises(KeyboardInterrupt), gate.immediate():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # an evaluation: interrupted long before this ends
    gate = InterruptGate()
    with gate.installed(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C: abort now
        time.sleep(5)


def test_resuming_with_other_settings_is_refused(tmp_path):
    run_search(smol_options(tmp_path, n_trials=2, prior=0.7), StubLatency(), PriorEvaluator(0.7))
    with pytest.raises(InvalidInputError, match="made with a different acceptance_prior"):
        run_search(smol_options(tmp_path, n_trials=2, prior=0.6), StubLatency(), PriorEvaluator(0.6))


def test_nsga2_front_and_journal_storage(tmp_path):
    options = smol_options(tmp_path, n_trials=16, sampler="nsga2", storage=f"journal:{tmp_path / 'j.log'}")
    result = run_search(options, StubLatency(), FakeMeasured())
    assert result.info.objectives == "latency,acceptance" and result.pruned_by_upper_bound == 0
    by_number = {r.number: r for r in result.ranked}
    front = [by_number[n] for n in result.pareto]
    assert front
    for f in front:  # nothing is faster and better accepted than a front point
        assert not any(r.primary.draft_ms < f.primary.draft_ms
                       and r.acceptance.acceptance_rate > f.acceptance.acceptance_rate for r in result.ranked)
    assert load_results("t", f"journal:{tmp_path / 'j.log'}").pareto == result.pareto


def test_storage_urls():
    assert normalize_storage("x/study.db", "s").startswith("sqlite:///")
    assert normalize_storage("x/j.log", "s").startswith("journal:")
    assert normalize_storage("postgresql://u@h/db", "s") == "postgresql://u@h/db"
    with pytest.raises(InvalidInputError, match="allowed: sqlite"):
        normalize_storage("x/thing.txt", "s")


# ---------------------------------------------------------------- processes


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftnas", "search", "--target", "llama-65b", "--base-shape", "llama-7b",
            "--acceptance-prior", "0.7", *args]


def _load(storage: str, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=open_storage(storage))


@pytest.mark.integration
def test_sigkill_then_rerun_loses_no_completed_trial(tmp_path):
    storage = f"sqlite:///{tmp_path / 'k.db'}"
    args = ["--storage", storage, "--study", "k", "--seed", "1", "--out-json", str(tmp_path / "r.json")]
    proc = subprocess.Popen(_cli("--trials", "100000", *args), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    completed = 0
    while completed < 8 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        with pytest.MonkeyPatch.context():
            try:
                completed = len(_load(storage, "k").get_trials(states=(TrialState.COMPLETE,)))
            except KeyError:
                completed = 0
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: t.values[0] for t in _load(storage, "k").get_trials(states=(TrialState.COMPLETE,))}
    in_flight = [t.number for t in _load(storage, "k").get_trials(states=(TrialState.RUNNING,))]
    assert len(before) >= 8 and len(in_flight) <= 1
    target = len(before) + 4
    rerun = subprocess.run(_cli("--trials", str(target), *args), cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    study = _load(storage, "k")
    after = {t.number: t for t in study.get_trials()}
    for number, value in before.items():  # every completed trial survived, unchanged
        assert after[number].state == TrialState.COMPLETE and after[number].values[0] == value
    for number in in_flight:  # the trial in flight is marked FAIL on resume, with the reason
        assert after[number].state == TrialState.FAIL
        assert "died" in after[number].user_attrs["failed_reason"]
    states = [t.state for t in after.values()]
    assert TrialState.RUNNING not in states and states.count(TrialState.FAIL) == len(in_flight)
    assert sum(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states) == target
    assert json.loads((tmp_path / "r.json").read_text())["acceptance"] == "ASSUMED"


def _concurrent_workers(tmp_path, storage: str, study: str, n_trials: int = 24) -> None:
    procs = []
    for i in range(2):
        out = tmp_path / f"w{i}.json"
        procs.append((out, subprocess.Popen(
            _cli("--trials", str(n_trials), "--storage", storage, "--study", study, "--seed", str(i),
                 "--out-json", str(out)), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)))
    told = []
    try:
        for out, proc in procs:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
            told.append(json.loads(out.read_text())["told_here"])
    finally:
        for _, proc in procs:
            proc.kill()  # no worker outlives a failed test
    trials = _load(storage, study).get_trials()
    numbers = sorted(t.number for t in trials)
    assert numbers == list(range(len(trials)))  # none lost, none duplicated
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert n_trials <= len(trials) <= n_trials + 1  # at most one raced past the target
    assert not set(told[0]) & set(told[1]) and sorted(told[0] + told[1]) == numbers
    assert told[0] and told[1]  # both workers did work


@pytest.mark.integration
def test_two_workers_share_one_sqlite_study(tmp_path):
    # Enough trials that the second worker's start-up (~1 s) cannot let the first finish alone
    # on a fast machine (latency-only trials run at ~20/s).
    _concurrent_workers(tmp_path, f"sqlite:///{tmp_path / 'shared.db'}", "shared", n_trials=200)


@pytest.mark.postgres
@pytest.mark.integration
def test_two_workers_share_one_postgres_study(tmp_path):
    url = os.environ.get("DRAFTNAS_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("DRAFTNAS_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL server and sets it)")
    _concurrent_workers(tmp_path, url, f"pg-{os.getpid()}-{int(time.time())}", n_trials=60)


def test_cli_without_weights_or_prior_says_what_to_pass_and_imports_stay_lazy():
    out = subprocess.run([sys.executable, "-m", "draftnas", "search", "--target", "llama-65b", "--base-shape",
                          "llama-7b"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--acceptance-prior" in lines[0] and "latency-only" in lines[0]
    code = "import sys, draftnas.cli; print('optuna' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip() == "False False"


@pytest.mark.real_model
def test_weights_evaluator_prunes_heals_and_measures_on_real_smollm2(smollm2, tmp_path):
    from draftnas.acceptance.records import TraceOptions
    from draftnas.acceptance.tracing import build_traces
    from draftnas.core.prompts import load_prompts
    from draftnas.search.candidate import build_candidate
    from draftnas.search.evaluate import WeightsEvaluator
    from draftnas.search.records import CandidateChoice

    prompts = list(load_prompts("chat"))[:3]
    traces = build_traces(smollm2, prompts, TraceOptions(max_new_tokens=12, batch_size=3),
                          tmp_path / "t.safetensors", prompt_set="chat")
    space = parse_search_space({"schema_version": 1, "name": "tiny", "target": "smollm2-135m",
                                "base": "smollm2-135m", "depth": {"min": 2, "max": 2},
                                "width": {"mlp_ratios": [0.5]}, "gamma": {"min": 1, "max": 4},
                                "heal": {"steps": 2, "batch_size": 1, "seq_len": 64}})
    cand = build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=2, mlp_ratio=0.5), target=SMOL)
    evaluation = WeightsEvaluator("smollm2-135m", SMOL, traces, space).evaluate(cand)
    acc = evaluation.acceptance
    assert acc.kind == "measured" and 0.0 <= acc.acceptance_rate <= 1.0
    assert set(acc.tokens_per_step or {}) == {"1", "2", "3", "4"} and acc.heal is not None
    plan = evaluation.candidate.plan
    assert plan is not None and plan.intermediate_size == 768 and len(plan.layers) == 2
    assert plan.kept_channels is not None  # a real plan: importance chose the channels
    assert evaluation.candidate.arch.intermediate_size == 768


@pytest.mark.real_model
def test_drafters_differing_only_in_their_head_share_one_pass_of_their_body_with_the_same_estimates(
        smollm2, tmp_path, monkeypatch):
    """The stock drafter under each head size (the hand-made bar) runs one body: scored one after another
    by one evaluator, the body's pass over the held-out records is made once, and each estimate is the one
    a fresh evaluator gives (int8 weights: each head multiplies in its own products)."""
    import draftnas.acceptance.estimate as estimate_mod
    from draftnas.acceptance.records import TraceOptions
    from draftnas.acceptance.tracing import build_traces
    from draftnas.core.prompts import load_prompts
    from draftnas.models.kernel_choices import kept_choices
    from draftnas.search.candidate import build_candidate
    from draftnas.search.evaluate import WeightsEvaluator
    from draftnas.search.records import CandidateChoice

    prompts = list(load_prompts("chat"))[:4]
    traces = build_traces(smollm2, prompts, TraceOptions(max_new_tokens=12, batch_size=4),
                          tmp_path / "t.safetensors", prompt_set="chat")
    space = parse_search_space({"schema_version": 1, "name": "tiny", "target": "smollm2-135m",
                                "base": "smollm2-135m", "depth": {"min": 24, "max": 24},
                                "vocab": {"sizes": ["full", 1024]}, "weights": ["int8"],
                                "gamma": {"min": 1, "max": 4}, "heal": {"steps": 0}})
    cands = [build_candidate(space, SMOL, "smollm2-135m",
                             CandidateChoice(depth=24, vocab_size=v, weights="int8"), target=SMOL)
             for v in (0, 1024, 0)]
    passes = []
    real = estimate_mod._hidden_states
    monkeypatch.setattr(estimate_mod, "_hidden_states", lambda *a: passes.append(1) or real(*a))
    # every evaluator multiplies in the forms the first timed (as a search keeps them per host): a form
    # timed anew may differ, and with it the last bits of a product and a near-tie's token
    with kept_choices(tmp_path / "kernels.json"):
        shared = WeightsEvaluator("smollm2-135m", SMOL, traces, space, quant_dtype="bf16")  # int8's fast one
        together = [shared.evaluate(c).acceptance for c in cands]
        assert len(passes) == 1  # one body, three heads (the last the first again)
        alone = [WeightsEvaluator("smollm2-135m", SMOL, traces, space, quant_dtype="bf16").evaluate(c)
                 .acceptance for c in cands[:2]]
    assert len(passes) == 3
    for a, b in zip(together, alone, strict=False):
        assert a.tokens_per_step == b.tokens_per_step and a.acceptance_rate == b.acceptance_rate
    assert together[0].tokens_per_step == together[2].tokens_per_step
    assert together[1].acceptance_rate < together[0].acceptance_rate  # 1,024 rows miss some target tokens


@pytest.mark.integration
def test_ctrl_c_on_the_cli_prints_the_table_so_far_and_leaves_nothing_running(tmp_path):
    storage = f"sqlite:///{tmp_path / 'c.db'}"
    proc = subprocess.Popen(_cli("--trials", "100000", "--storage", storage, "--study", "c"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        try:
            if len(_load(storage, "c").get_trials(states=(TrialState.COMPLETE,))) >= 3:
                break
        except KeyError:
            pass
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a hung child must not outlive the test (one once loaded CI's machine for an hour)
    assert proc.returncode == 130, err
    assert "ACCEPTANCE ASSUMED" in out and "trials:" in out and "interrupted:" in err
    assert not _load(storage, "c").get_trials(states=(TrialState.RUNNING,))


def test_the_table_keeps_whole_names_at_120_columns_and_says_what_to_run_next(tmp_path):
    from rich.console import Console

    from draftnas.cli.search_render import ranked_table
    from draftnas.search.explain import next_commands, summary_lines

    result = run_search(smol_options(tmp_path, n_trials=10), StubLatency(), FakeMeasured())
    console = Console(width=120, record=True)
    console.print(ranked_table(result, 10))
    text = console.export_text()
    assert "…" not in text
    for r in result.ranked[:10]:  # folded onto two lines at worst, never cut
        assert r.candidate.name in text.replace("\n", "").replace("│", "").replace(" ", "")
    lines = next_commands(result)
    best = result.best
    export = next(line for line in lines if "draftnas export" in line)
    assert f"--trial {best.number}" in export and f"--out drafters/{best.candidate.name}" in export
    bench = next(line for line in lines if "draftnas bench" in line)
    assert f"--gamma {best.primary.gamma}" in bench and "assistant_model=" in lines[-2]
    assert "route_linears(target); route_linears(drafter)" in lines[-1]
    # after --export: no export line; bench the folder written, at the gamma it was exported with
    exported = next_commands(result, ("drafters/x", 7, 0.0))
    assert not any("draftnas export" in line for line in exported)
    assert any("--draft drafters/x --gamma 7 " in line for line in exported)
    assert "'drafters/x'" in exported[-2]
    stopped = next_commands(result, ("drafters/x", 7, 0.6))  # and at the confidence stop it was exported with
    assert any("--draft drafters/x --gamma 7 --p-min 0.6 " in line for line in stopped)
    assumed = run_search(smol_options(tmp_path, n_trials=4, prior=0.7, study="a"), StubLatency(),
                         PriorEvaluator(0.7))
    assert any("latency-only" in line for line in next_commands(assumed))
    assert not any("latency-only" in line for line in summary_lines(assumed))


def test_when_nothing_wins_the_summary_gives_the_acceptance_one_ceiling(tmp_path):
    from draftnas.search.explain import summary_lines
    from draftnas.search.results import acceptance_ceiling

    result = run_search(smol_options(tmp_path, n_trials=6), StubLatency(), FakeMeasured(alpha=0.02))
    assert result.best is not None and result.best.throughput.speedup < 1.0
    ranked, bound = acceptance_ceiling(result)
    assert bound.speedup > max(r.throughput.speedup for r in result.ranked)  # acceptance 1 bounds them all
    note = next(line for line in summary_lines(result) if line.startswith("NOTE: no candidate"))
    assert ranked.candidate.name in note and f"{bound.speedup:.2f}x" in note
    assert "acceptance that falls short" in note if bound.speedup > 1 else "no acceptance makes" in note


def test_a_workload_with_a_prompt_prices_whole_requests_prefill_included():
    from draftnas.core.throughput import with_prefill
    from draftnas.search.scoring import read_latency, target_latency

    assert with_prefill(20.0, 64, 0.0) == pytest.approx(20.0)
    assert with_prefill(20.0, 64, 400.0) == pytest.approx(64 / (0.4 + 3.2))
    steady = Workload(batch_sizes=(1,), batch_weights=(1.0,), context_tokens=128)
    request = replace(steady, prompt_tokens=50, new_tokens=64)
    drafter = SMOL.with_shape(num_hidden_layers=2)
    gamma = GammaRange(1, 4)
    acc = assumed_acceptance(0.6)
    lat = StubLatency()
    plain = predict_workload(read_latency(lat, "stub", drafter, steady, target_latency(lat, SMOL, steady,
                                                                                       gamma)),
                             acc, steady, gamma)
    reading = read_latency(lat, "stub", drafter, request, target_latency(lat, SMOL, request, gamma))
    whole = predict_workload(reading, acc, request, gamma)
    target_prefill = lat.predict_ms(SMOL, new_tokens=50, context_tokens=0)
    draft_prefill = lat.predict_ms(drafter, new_tokens=50, context_tokens=0)
    assert reading.target_prefill_ms == (pytest.approx(target_prefill),)
    assert reading.spec_prefill_ms == (pytest.approx(target_prefill + draft_prefill),)
    e = plain.per_batch[0]  # the steady-state step is the same; only whole requests pay the prefill
    assert whole.per_batch[0].tokens_per_s == pytest.approx(e.tokens_per_s)
    spec_s = (target_prefill + draft_prefill) / 1e3 + 64 / e.tokens_per_s
    plain_s = target_prefill / 1e3 + 64 / e.baseline_tokens_per_s
    assert whole.tokens_per_s == pytest.approx(64 / spec_s)
    assert whole.baseline_tokens_per_s == pytest.approx(64 / plain_s)
    assert whole.tokens_per_s < plain.tokens_per_s
    assert whole.baseline_tokens_per_s < plain.baseline_tokens_per_s


def test_host_calibration_answers_the_targets_prefill_with_its_measurement():
    from draftnas.latency.corrected import CalibratedModel
    from draftnas.latency.records import HostCalibration

    cal = HostCalibration(target=SMOL.name, device_name="here", threads=2, context_tokens=128,
                          target_ms={1: 50.0, 2: 80.0}, prefix_ms={1: 10.0}, prefill_ms={50: 170.0})
    model = CalibratedModel(StubLatency(), cal, SMOL)
    assert model.predict_ms(SMOL, new_tokens=50, context_tokens=0) == 170.0
    assert model.predict_ms(SMOL, new_tokens=1, context_tokens=128) == 50.0


def test_the_printed_bench_command_runs_the_engine_and_prompts_the_search_priced():
    from types import SimpleNamespace as NS

    from draftnas.search.explain import next_commands

    S = {"study_name": "s", "predictions_file": None}  # noqa: N806

    space = load_search_space("smollm2-135m")  # workload: chat prompts
    best = NS(candidate=NS(plan=object(), name="L1bi-x-v4096", head_vocab_size=4096,
                           choice=NS(weights="dense")), number=3, primary=NS(gamma=2, p_min=0.0))
    info = NS(acceptance_assumed=False, target="smollm2-135m", engine="static", space=space, dtype="fp32",
              device="cpu")
    lines = next_commands(NS(best=best, info=info, **S,
                             storage="sqlite:///s.db", references=()))
    assert lines[-1].endswith("route_linears(drafter)")
    bench = next(line for line in lines if "draftnas bench" in line)
    assert bench.strip() == ("draftnas bench --target smollm2-135m --draft drafters/L1bi-x-v4096 --gamma 2 "
                             "--engine static --prompts chat --per-domain 3")
    assert "trust_remote_code=True" in lines[-2]  # a reduced head loads through the shipped class
    # in the dtype the search chose, beside the reference with weights it priced
    ref = NS(reference="smollm2-135m", primary=NS(gamma=2, p_min=0.0))
    chosen = next_commands(NS(best=best, info=NS(**{**vars(info), "dtype": "bf16"}), **S,
                              storage="sqlite:///s.db", references=(ref,)))
    bench_bf16 = next(line for line in chosen if "draftnas bench" in line)
    assert "--dtype bf16 --reference smollm2-135m --prompts" in bench_bf16  # same gamma: no flag
    # the reference at its own best gamma, not the winner's
    ref3 = NS(reference="smollm2-135m", primary=NS(gamma=3, p_min=0.5))
    own_gamma = next_commands(NS(best=best, info=info, **S, storage="sqlite:///s.db",
                                 references=(ref3,)))
    assert "--reference smollm2-135m --reference-gamma 3 --reference-p-min 0.5" in next(
        x for x in own_gamma if "bench" in x)
    uncalibrated = next_commands(NS(best=best, info=NS(**{**vars(info), "engine": None}), **S,
                                    storage="sqlite:///s.db", references=()))
    assert "--engine" not in next(line for line in uncalibrated if "draftnas bench" in line)
    on_gpu = next_commands(NS(best=best, info=NS(**{**vars(info), "device": "cuda"}), **S,
                              storage="sqlite:///s.db", references=()))
    assert "--device cuda" in next(line for line in on_gpu if "draftnas bench" in line)  # where it was priced
    predicted = next_commands(NS(best=best, info=info, study_name="s", storage="sqlite:///s.db",
                                 references=(),
                                 predictions_file="runs/s/predictions.json"))
    assert next(x for x in predicted if "bench" in x).endswith("--predictions runs/s/predictions.json")
    # an int8 winner is routed in int8 in transformers too
    int8 = NS(**{**vars(best), "candidate": NS(**{**vars(best.candidate), "choice": NS(weights="int8")})})
    int8_lines = next_commands(NS(best=int8, info=info, **S, storage="sqlite:///s.db",
                                  references=()))
    assert "route_linears(drafter, weights='int8')" in int8_lines[-1]


def test_the_result_json_carries_the_export_after_export(tmp_path):
    from draftnas.cli.cmd_search import result_json
    from draftnas.cli.flags import Output, emit_json
    from draftnas.export.records import BestExport

    result = run_search(smol_options(tmp_path, n_trials=3), StubLatency(), FakeMeasured())
    out = tmp_path / "r.json"
    emit_json(Output(out_json=str(out)), result_json(result, BestExport("drafters/x", 2, {"gamma": 2})))
    data = json.loads(out.read_text())
    assert data["export"] == {"folder": "drafters/x", "gamma": 2, "record": {"gamma": 2}}
    assert data["study_name"] == result.study_name
    emit_json(Output(out_json=str(out)), result_json(result))
    assert "export" not in json.loads(out.read_text())


def test_export_keeps_a_folder_that_already_holds_the_best_trial_and_refuses_a_latency_only_one(tmp_path):
    from types import SimpleNamespace as NS

    from draftnas.export.request import _same_trial, export_best
    from draftnas.search.records import WorkloadPrediction

    def prediction(tps):
        return WorkloadPrediction(per_batch=(), batch_weights=(1.0,), tokens_per_s=tps,
                                  baseline_tokens_per_s=2.0, speedup=tps / 2.0, acceptance_assumed=False)

    best = NS(candidate=NS(plan=object(), name="L1bi-x"), number=3, primary=NS(gamma=2, p_min=0.0),
              throughput=prediction(5.0))
    result = NS(best=best, info=NS(acceptance_assumed=False), study_name="s", storage="sqlite:///s.db")
    folder = tmp_path / "L1bi-x"
    folder.mkdir()
    record = {"source": "study s trial 3", "gamma": 1, "p_min": 0.5,
              "trial": {"throughput": {**prediction(5.0).to_dict(), "a_field_dropped_since": 1}}}
    (folder / "draftnas.json").write_text(json.dumps(record))
    kept = export_best(result, tmp_path)  # nothing re-healed
    assert (kept.folder, kept.gamma, kept.p_min, kept.record, kept.result) == (
        str(folder), 1, 0.5, record, None)
    # trial 3 of an earlier study of that name (deleted and searched again) is not this trial
    stale = NS(throughput=prediction(4.0))
    assert _same_trial(record, best) and not _same_trial(record, stale)
    latency_only = NS(best=NS(candidate=NS(plan=None, name="x"), number=0, primary=NS(gamma=2)),
                      info=NS(acceptance_assumed=True), study_name="s", storage="sqlite:///s.db")
    with pytest.raises(DraftnasError, match="needs a search that pruned real weights"):
        export_best(latency_only, tmp_path)


def test_a_base_or_reference_with_another_vocabulary_or_tokenizer_is_refused(tmp_path, monkeypatch):
    import draftnas.search.resolve as resolve
    from draftnas.core.registry import get_architecture

    target = get_architecture("qwen2.5-coder-1.5b")
    vocab = resolve._tokenizer_problems("reference", "smollm2-135m", "qwen2.5-coder-1.5b", target)
    assert vocab and "reads 49152 token ids but target qwen2.5-coder-1.5b 151936" in vocab[0]
    if resolve.has_weights("qwen2.5-coder-0.5b"):  # the embedded pair shares one tokenizer, from the GGUFs
        with monkeypatch.context() as m:
            m.setattr(resolve, "ensure_local_folder", lambda spec: pytest.fail(f"converted {spec}"))
            problems = resolve._tokenizer_problems("base", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", target)
            assert problems == []
        if resolve.has_weights("smollm2-135m"):  # another tokenizer: another digest
            assert resolve._same_gguf_tokenizer("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
            assert not resolve._same_gguf_tokenizer("smollm2-135m", "qwen2.5-coder-1.5b")
    monkeypatch.setattr(resolve, "has_weights", lambda spec: True)
    monkeypatch.setattr(resolve, "ensure_local_folder", lambda spec: (None, tmp_path / spec, True))
    monkeypatch.setattr(resolve, "resolve_architecture", lambda spec: target)
    monkeypatch.setattr(resolve.AutoTokenizer, "from_pretrained", lambda folder: folder)
    monkeypatch.setattr(resolve, "tokenizer_fingerprint", lambda tok: Path(tok).name[:4])
    other = resolve._tokenizer_problems("base", "qwen-like", "target", target)
    assert other and "has another tokenizer than target target" in other[0]
    assert resolve._tokenizer_problems("base", "targ-copy", "target", target) == []
    for name in ("same", "target"):  # the same tokenizer files: no tokenizer is loaded
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')

    def no_load(folder):
        raise AssertionError(f"loaded {folder}")

    monkeypatch.setattr(resolve.AutoTokenizer, "from_pretrained", no_load)
    assert resolve._tokenizer_problems("base", "same", "target", target) == []


def test_bf16_is_refused_where_the_cpu_has_no_native_bf16(monkeypatch):
    import draftnas.search.pricing as pricing

    monkeypatch.setattr(pricing, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(InvalidInputError, match="no native bf16 instructions"):
        pricing._check_dtype("bf16", "cpu")
    pricing._check_dtype("fp32", "cpu")
    pricing._check_dtype("bf16", "cuda")  # judged on the GPU's own terms


@pytest.mark.real_model
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_a_search_on_cuda_calibrates_the_gpu_profile_and_scores_drafters_there(tmp_path):
    """--device cuda: the measured H100 profile is calibrated on the present GPU (CUDA graphs, the faster
    of bf16 and fp16), traces are written and drafters healed and scored there."""
    from draftnas.latency.files import profiles_dir
    from draftnas.models.sources import has_weights
    from draftnas.search.records import StudySettings
    from draftnas.search.resolve import SearchRequest, search

    if not has_weights("smollm2-135m"):  # the GPU machine has the GGUF only (the runbook's search-cuda phase)
        pytest.skip("the embedded SmolLM2-135M package is not installed here")
    space = parse_search_space({"schema_version": 1, "name": "tiny-gpu", "target": "smollm2-135m",
                                "base": "smollm2-135m", "depth": {"min": 1, "max": 3},
                                "gamma": {"min": 1, "max": 4}, "traces": {"prompts": 4, "max_new_tokens": 16},
                                "heal": {"steps": 2, "batch_size": 1, "seq_len": 64}})
    result = search(SearchRequest(target="smollm2-135m", space=space, device="cuda",
                                  profile=str(profiles_dir() / "h100-bf16-cuda-graph.json"),
                                  study=StudySettings(n_trials=2, run_dir=str(tmp_path), study_name="g")))
    assert result.info.device == "cuda" and result.info.dtype in ("bf16", "fp16")
    assert (result.profile_note or "").startswith("calibrated") and result.best is not None


def test_a_registry_target_without_a_shipped_space_gets_the_default_space_written_to_edit(tmp_path):
    from draftnas.core.errors import SearchSpaceError
    from draftnas.search.records import StudySettings
    from draftnas.search.requests import SearchRequest
    from draftnas.search.resolve import plan_search
    from draftnas.search.spaces import registry_space

    request = SearchRequest(target="qwen2.5-72b", base_shape="qwen2.5-0.5b", acceptance_prior=0.7,
                            study=StudySettings(n_trials=2, run_dir=str(tmp_path)))
    options, _, _ = plan_search(request)
    written = tmp_path / "qwen2.5-72b-from-qwen2.5-0.5b" / "space.yaml"
    assert options.space.name == "qwen2.5-72b-from-qwen2.5-0.5b" and options.space.latency_only
    assert replace(load_search_space(str(written)), source="the registry") == options.space  # it reads back
    assert str(written) in (options.profile_note or "")
    # KV-head ratios as the drafter builder rounds them: 2 heads keep 2 or 1, 32 heads 32/24/16/8
    assert options.space.width.kv_head_ratios == (1.0, 0.5)
    assert registry_space("llama-65b", "llama-7b")["width"]["kv_head_ratios"] == [1.0, 0.75, 0.5, 0.25]
    with pytest.raises(SearchSpaceError, match="no shipped search space targets 'qwen2.5-72b'"):
        plan_search(SearchRequest(target="qwen2.5-72b", acceptance_prior=0.7))


class _HandMade(FakeMeasured):
    builds = True


class _Formats(StubLatency):
    """The stub's latencies, with quantized drafters priced at 60% of dense (as a calibration would)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def predict_ms(self, arch, **kw):
        return self.scale * super().predict_ms(arch, **kw)

    def for_weights(self, weights):
        return self if weights == "dense" else _Formats(0.6)


def test_the_stock_drafter_under_each_global_format_and_head_is_priced_first_as_the_hand_made_bar(tmp_path):
    from draftnas.search.explain import summary_lines
    from draftnas.search.hand_made import hand_made_best

    space = replace(load_search_space("smollm2-135m"), depth=replace(load_search_space("smollm2-135m").depth,
                                                                      min=20, max=30),
                    weights=("dense", "int8", "attn=int8,mlp=int8,head=int4"), vocab_sizes=(0, 8192))
    big = SMOL.with_shape(num_hidden_layers=120, name="smollm2-deep")  # a target the stock drafter can serve
    options = replace(smol_options(tmp_path, n_trials=3, sampler="random", seed=0), space=space,
                      target_arch=big)
    said: list[list[str]] = []
    result = run_search(options, _Formats(), _HandMade(), standings=said.append)
    made = [r for r in result.ranked if r.hand_made]
    # the ranking so far is said once the hand-made trials are in, then after each of the 3 the search adds
    assert said[0][0].startswith("first ranking, from the hand-made trials") and len(said[0]) == 4
    assert all("(hand-made)" in row for row in said[0][1:])
    assert [lines[0] for lines in said[1:]] == [f"ranking after {n} of 7 trials:" for n in (5, 6)]
    # dense and int8 (the global formats) x full head and 8,192 rows; the per-layer format is the search's
    assert sorted(r.hand_made for r in made) == ["dense, full head", "dense, head 8192", "int8, full head",
                                                 "int8, head 8192"]
    assert all(r.candidate.arch.num_hidden_layers == 30 and r.number < 4 for r in made)  # enqueued first
    assert result.counts["COMPLETE"] + result.counts.get("PRUNED", 0) == 3 + 4  # the search's 3 beside them
    best = hand_made_best(result)
    assert best is not None and best is made[0]
    bar = next(line for line in summary_lines(result) if line.startswith("hand-made best:"))
    assert f"trial {best.number} {best.candidate.name} (the stock drafter, {best.hand_made})" in bar
    assert ("the search confirms the hand-made best" in bar) == (result.best.number == best.number)
    # resumed with the same trial count: nothing more to run, and no hand-made drafter queued twice
    again = run_search(options, _Formats(), _HandMade())
    assert len([r for r in again.ranked if r.hand_made]) == 4 and not again.told_here
    # a space whose depth stops short of the base's layers cannot make the stock drafter: no bar
    short = replace(options, space=replace(space, depth=replace(space.depth, max=29)),
                    study=replace(options.study, study_name="short"))
    assert not any(r.hand_made for r in run_search(short, _Formats(), _HandMade()).ranked)


class _Heals(FakeMeasured):
    """Builds drafters: healing within a budget raises a drafter's acceptance by 0.05."""

    builds = True

    def __init__(self):
        super().__init__()
        self.heals = []

    def evaluate(self, candidate, heal=None):
        evaluation = super().evaluate(candidate)
        if heal is None:
            return evaluation
        from draftnas.core.throughput import expected_tokens_per_step

        self.heals.append(heal)
        alpha = evaluation.acceptance.acceptance_rate + 0.05
        tokens = {str(g): expected_tokens_per_step(alpha, g) for g in range(1, 9)}
        return replace(evaluation, acceptance=AcceptanceReading(kind="measured", acceptance_rate=alpha,
                                                                tokens_per_step=tokens))


def test_a_heal_budget_heals_the_best_cut_drafters_as_trials_of_their_own_and_records_cost_and_gain(tmp_path):
    from draftnas.search.explain import summary_lines

    options = smol_options(tmp_path, n_trials=4, sampler="random", seed=3)
    options = replace(options, study=replace(options.study, heal_budget_s=600.0))
    evaluator = _Heals()
    result = run_search(options, StubLatency(), evaluator)
    healed = [r for r in result.ranked if r.healed]
    originals = {r.number: r for r in result.ranked if not r.healed}
    assert healed and len(healed) == len(evaluator.heals) == len(originals)  # every drafter here has a cut
    from draftnas.search.healing import HEAL_STEPS

    assert all(h.train == "cut" and h.max_seconds is not None and h.max_seconds <= 600
               for h in evaluator.heals)
    assert {h.steps for h in evaluator.heals} == {options.space.heal.steps + HEAL_STEPS}  # beyond the trials
    for r in healed:
        before = originals[r.healed["from"]]
        assert r.candidate.name == before.candidate.name
        assert r.healed["top1_before"] == before.acceptance.acceptance_rate
        assert r.healed["top1_after"] == pytest.approx(before.acceptance.acceptance_rate + 0.05)
        assert r.healed["minutes"] >= 0 and r.throughput.tokens_per_s > before.throughput.tokens_per_s
    lines = summary_lines(result)
    assert any(line.startswith(f"healed within the budget: {len(healed)} drafter(s)") for line in lines)
    # resumed: nothing is healed twice
    again = run_search(options, StubLatency(), evaluator)
    assert len(evaluator.heals) == len(healed) and not again.told_here


def test_the_budget_stops_healing_when_too_little_is_left():
    from types import SimpleNamespace as NS

    from draftnas.search.healing import MIN_SECONDS, heal_within_budget
    from draftnas.search.records import CandidateChoice
    from draftnas.search.space import HealBudget

    def trial(number, depth):
        return NS(number=number, healed=None, candidate=NS(choice=CandidateChoice(depth=depth)))

    now = [0.0]
    done = []

    def heal_one(r, heal):
        done.append((r.number, heal.max_seconds))
        now[0] += 100.0

    ranked = [trial(1, 8), trial(2, 30), trial(3, 6), trial(4, 4)]  # trial 2 is the base's full depth: no cut
    n = heal_within_budget(ranked, SMOL, HealBudget(), 200.0 + MIN_SECONDS - 1, heal_one,
                           clock=lambda: now[0])
    assert n == 2 and done == [(1, 229.0), (3, 129.0)]  # the third would start with 29 s left
    trains = []
    heal_within_budget(ranked[:1], SMOL, HealBudget(), 600.0, lambda r, h: trains.append(h.train),
                       train="lowrank")
    assert trains == ["lowrank"]  # --heal-with lowrank: a low-rank update over the stack


def test_search_at_a_batch_prices_it_says_its_break_even_batch_and_refuses_a_batch_that_cannot_run(tmp_path):
    storage = f"sqlite:///{tmp_path / 'b.db'}"
    ok = subprocess.run(_cli("--batch", "8", "--trials", "3", "--storage", storage, "--out-json",
                             str(tmp_path / "b.json")), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert ok.returncode == 0, ok.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["info"]["space"]["workload"]["batch_sizes"] == [8] and data["study_name"].endswith("-batch8")
    # no GPU here to time batches on: the line says the break-even batch came from batch 1 alone
    assert "break-even batch:" in ok.stdout and "--batch B` times batches" in ok.stdout.replace("\n", " ")
    for batch, needle in (("0", "--batch must be"), ("100000", "--batch of 100000 sequences does not fit")):
        bad = subprocess.run(_cli("--batch", batch, "--trials", "1", "--storage", storage), cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
        assert bad.returncode == 2 and len(lines) == 1 and needle in lines[0], bad.stderr
