"""`bench --engine vllm`: each arm's vLLM config comes from its drafter family, a drafter vLLM cannot load is
one line, the options vLLM's arms do not take are refused, draftnas's replay of vLLM's lookup rule is exact,
and where vLLM is installed (CI installs it) a real bench runs lossless with vLLM's acceptance per position
beside draftnas's replay."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from draftnas.bench.request_records import BenchOptions
from draftnas.bench.vllm import LOOKUP, SCHEDULE, TARGET, position_lines, vllm_arms, vllm_folder
from draftnas.core.errors import DraftnasError, InvalidInputError
from draftnas.core.options import OptionError
from draftnas.drafter.families import parse_drafter
from draftnas.drafter.lookup import propose_earliest_longest, replay_lookup
from tests.helpers import installed_vllm, needs_vllm, tiny_llama


@pytest.fixture
def drafter_folder(tmp_path, tiny_llama_config):
    folder = tmp_path / "drafter"
    tiny_llama(tiny_llama_config).save_pretrained(folder)
    return folder


def test_each_arm_runs_its_familys_vllm_config(drafter_folder):
    options = BenchOptions(engine="vllm", gamma=3, reference_gamma=5, lookup="lookup:n=2,m=4")
    arms = vllm_arms(str(drafter_folder), [str(drafter_folder)], options, {"vocab_size": 128})
    assert [a.name for a in arms] == [TARGET, "draftnas", "reference", LOOKUP]
    assert arms[0].config is None
    assert arms[1].config == {"method": "draft_model", "model": str(drafter_folder),
                              "num_speculative_tokens": 3}
    assert arms[2].gamma == 5
    assert arms[3].config == {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 2,
                              "num_speculative_tokens": 4}


def test_a_schedule_arm_drafts_by_batch_as_vllm_reads_its_schedule(drafter_folder):
    options = BenchOptions(engine="vllm", gamma=3, reference_gamma=1, batch_sizes=(1, 2, 4),
                           gamma_schedule="1-1:3,2-3:1,4-65536:0").validate()
    arms = vllm_arms(str(drafter_folder), [str(drafter_folder)], options, {"vocab_size": 128})
    assert [a.name for a in arms] == [TARGET, "draftnas", "reference", SCHEDULE]
    schedule = arms[-1]
    assert schedule.config == {"method": "draft_model", "model": str(drafter_folder),
                               "num_speculative_tokens": 3,
                               "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 3, 1], [4, 65536, 0]]}
    assert [schedule.gamma_at(b) for b in (1, 2, 3, 4, 16)] == [3, 1, 1, 0, 0]
    assert arms[2].gamma_at(16) == 1  # a fixed arm drafts its γ at every batch
    fixed = schedule.at_gamma(0)
    assert fixed.config == {"method": "draft_model", "model": str(drafter_folder),
                            "num_speculative_tokens": 0}
    assert schedule.label().endswith(", γ by batch 1-1:3,2-3:1,4-65536:0")
    assert arms[2].label().endswith(" at γ 1")


def test_a_schedule_is_vllms_batched_benchs_and_one_vllm_accepts():
    for options, said in ((BenchOptions(engine="vllm", gamma_schedule="1-1:3"), "add --engine vllm and "
                                                                                  "--batch-size"),
                          (BenchOptions(batch_sizes=(1, 2), gamma_schedule="1-1:3"), "add --engine vllm"),
                          (BenchOptions(engine="vllm", batch_sizes=(1, 2), gamma_schedule="2-9:3"),
                           "--gamma-schedule '2-9:3': ranges must start at batch 1")):
        with pytest.raises(OptionError) as caught:
            options.validate()
        assert said in caught.value.for_flags()


def test_a_replay_at_gamma_0_is_a_token_a_step():
    from draftnas.bench.vllm import VllmArm
    from draftnas.bench.vllm_replay import replayed

    arm = VllmArm("schedule", parse_drafter("qwen2.5-coder-0.5b"), "",
                  {"method": "draft_model", "num_speculative_tokens": 0})
    counts, steps = replayed(arm, [[1, 2]], [[5, 6, 7, 8, 9]], 4)
    assert counts == [0] and steps == [[(0, 0)] * 3]  # the prefill gives the first token


def test_the_schedule_is_held_against_the_fastest_fixed_gamma_at_each_batch_paired_per_run():
    from draftnas.bench.batch_records import BatchedBenchResult, BatchPoint
    from draftnas.bench.vllm_batched import schedule_readings
    from draftnas.cli import cmd_bench

    def point(b, runs):
        speedup = {k: sorted(v)[1] for k, v in runs.items()}
        return BatchPoint(batch_size=b, target_tokens_per_s=2.0, tokens_per_s=speedup, speedup=speedup,
                          tokens_per_step=dict.fromkeys(runs, 2.0), exact_match_rate=dict.fromkeys(runs, 1.0),
                          predicted_speedup={}, speedup_runs=runs)

    points = (point(1, {"g3": (1.2, 1.3, 1.25), "g1": (1.1, 1.1, 1.1), "s": (1.25, 1.3, 1.2)}),
              point(8, {"g3": (0.7, 0.72, 0.71), "g1": (0.8, 0.82, 0.81), "s": (0.9, 0.95, 0.91)}))
    result = BatchedBenchResult(
        target="t", drafters={"g3": "d at γ 3", "g1": "d at γ 1", "s": "d, γ by batch 1-4:3,5-65536:0"},
        gamma=3, max_new_tokens=8, device="cpu", dtype="float32", threads=2, profile="", engine="vllm",
        points=points, measured_crossover={}, predicted_crossover={}, schedule_against={"s": ("g3", "g1")},
        schedules={"s": [[1, 4, 3], [5, 65536, 0]]})
    at1, at8 = schedule_readings(result, "s")
    assert (at1.batch_size, at1.gamma, at1.best_fixed) == (1, 3, "g3")
    assert (at1.low, at1.high) == pytest.approx((0.96, 1.0416667))
    assert (at8.gamma, at8.best_fixed) == (0, "g1")
    assert at8.ratio == pytest.approx(0.9 / 0.8) and at8.low == pytest.approx(0.91 / 0.81)  # runs paired
    said = " ".join(cmd_bench._schedule_lines(result))
    assert "B=1 (γ 3) over g3: 1.000x (0.960-1.042), not separable" in said
    assert "B=8 (γ 0) over g1: 1.125x (1.123-1.159)" in said and said.endswith("faster")
    from draftnas.report.tables import _schedule_lines  # the docs' rendering of a kept result

    (line,) = _schedule_lines(type(result).from_dict(result.to_dict()))  # as read back from its file
    assert "(g3, g1), paired per run: B = 1 (γ 3) over g3: 1.000x (0.960-1.042); B = 8 (γ 0) over g1: " \
           "1.125x (1.123-1.159)" in line


def test_a_drafter_vllm_cannot_load_is_one_line(drafter_folder):
    with pytest.raises(OptionError, match=r"its vocabulary \(128 rows\) is not the target's \(256\)"):
        vllm_folder(parse_drafter(str(drafter_folder)), 256)
    config = json.loads((drafter_folder / "config.json").read_text())
    (drafter_folder / "config.json").write_text(json.dumps(config | {"auto_map": {
        "AutoModelForCausalLM": "modeling_draftnas_head.DraftnasReducedHead"}}))
    with pytest.raises(OptionError, match="its reduced head is custom code, which vLLM refuses; export it "
                                          "with --full-head"):
        vllm_folder(parse_drafter(str(drafter_folder)), 128)
    with pytest.raises(InvalidInputError, match="a hybrid drafter does not run in vLLM"):
        vllm_arms(f"lookup:n=2,m=4+{drafter_folder}", [], BenchOptions(engine="vllm"), {"vocab_size": 128})


def test_what_vllms_arms_do_not_take_is_refused():
    with pytest.raises(OptionError) as caught:
        BenchOptions(engine="vllm", temperature=0.7).validate()
    assert "vLLM's arms run greedy here" in caught.value.for_flags()
    assert BenchOptions(engine="vllm", batch_sizes=(1, 2), lookup="lookup").validate().batch_sizes == (1, 2)


def test_a_batch_whose_kv_cache_does_not_fit_is_one_line_before_any_engine_starts(monkeypatch):
    from draftnas.bench import vllm as bench_vllm
    from draftnas.core.prompts import Prompt

    monkeypatch.setattr(bench_vllm, "find_vllm", lambda: pytest.fail("vLLM must not be looked for"))
    prompts = [Prompt(id="p0", domain="code", text="Write a function that adds two numbers.")]
    options = BenchOptions(engine="vllm", batch_sizes=(1, 1024), max_new_tokens=512).validate()
    with pytest.raises(OptionError) as caught:
        bench_vllm.plan_vllm_bench("smollm2-135m", "smollm2-135m", prompts, options, (), (1, 1024))
    said = caught.value.for_flags()
    assert "--batch-size a batch of 1024 sequences of" in said
    assert "lower --batch-size or --max-new-tokens" in said


def test_a_batch_point_pairs_each_round_with_the_target_alone():
    from draftnas.bench.vllm import VllmArm
    from draftnas.bench.vllm_batched import _point

    def run(tokens, seconds, outputs, accepted=0):
        return {2: {"tokens": tokens, "seconds": seconds, "outputs": outputs, "accepted": accepted}}

    runs = {"target": [run(20, 10.0, [[1], [2]]), run(20, 5.0, [[1], [2]])],
            "draftnas": [run(20, 5.0, [[1], [2]], 10), run(20, 4.0, [[1], [3]], 10)]}
    point = _point(2, runs, [VllmArm("draftnas", config={"method": "draft_model"})])
    assert point.speedup_runs == {"draftnas": (2.0, 1.25)}
    assert point.speedup["draftnas"] == pytest.approx(1.625)
    assert point.target_tokens_per_s == pytest.approx(3.0)
    assert point.tokens_per_step["draftnas"] == pytest.approx(2.0)
    assert point.exact_match_rate["draftnas"] == 0.75


def test_the_crossover_is_read_in_each_run_as_well_as_over_the_medians():
    from draftnas.bench.batch_records import BatchPoint
    from draftnas.bench.batched import crossover_runs

    def point(b, runs):
        return BatchPoint(batch_size=b, target_tokens_per_s=1.0, tokens_per_s={}, speedup={},
                          tokens_per_step={}, exact_match_rate={}, predicted_speedup={},
                          speedup_runs={"d": runs})

    points = [point(1, (1.2, 1.1, 1.3)), point(2, (0.9, 1.05, 1.1)), point(4, (0.8, 0.95, 1.02))]
    assert crossover_runs(points, "d") == (2, 4, None)
    assert crossover_runs(points, "other") == ()


def test_a_batch_point_carries_the_speedup_predicted_for_it():
    from draftnas.bench.vllm import VllmArm
    from draftnas.bench.vllm_batched import _point

    runs = {"target": [{2: {"tokens": 20, "seconds": 10.0, "outputs": [[1]], "accepted": 0}}],
            "d": [{2: {"tokens": 20, "seconds": 8.0, "outputs": [[1]], "accepted": 5}}]}
    point = _point(2, runs, [VllmArm("d", config={"method": "ngram"})], {"d": 1.4})
    assert point.predicted_speedup == {"d": 1.4} and point.speedup["d"] == pytest.approx(1.25)


def test_batched_predictions_price_the_groups_the_bench_submits():
    """At B = 1 each prompt alone, at B > 1 one group of B prompts cycled from the list, each request's
    tokens and steps its prompt's."""
    from draftnas.bench.vllm_predicted import PricedArm, arm_group_ms, batch_speedups
    from draftnas.core.registry import get_architecture
    from draftnas.latency.vllm import VllmModel
    from tests.search.test_engine_vllm import calibration

    target, base = get_architecture("qwen2.5-coder-1.5b"), get_architecture("qwen2.5-coder-0.5b")
    model = VllmModel(calibration(), target, base)
    arms = {"target": PricedArm("target"), "lookup": PricedArm("lookup", gamma=3),
            "big": PricedArm("model", base.with_shape(intermediate_size=1), 3)}
    walks = [[(3, 3), (0, 3)], [(0, 0), (1, 2), (0, 0)]]
    out = batch_speedups(model, arms, [10, 20], [6, 5], {"lookup": walks, "big": [[], []]}, [1, 3])
    assert set(out) == {1, 3} and "big" not in out[1]  # a drafter the calibration cannot price: left out
    alone = arm_group_ms(model, "target", None, 0, [10], [6], []) + arm_group_ms(
        model, "target", None, 0, [20], [5], [])
    looked = arm_group_ms(model, "lookup", None, 3, [10], [6], [walks[0]]) + arm_group_ms(
        model, "lookup", None, 3, [20], [5], [walks[1]])
    assert out[1]["lookup"] == pytest.approx(alone / looked)
    together = arm_group_ms(model, "target", None, 0, [10, 20, 10], [6, 5, 6], [])
    looked3 = arm_group_ms(model, "lookup", None, 3, [10, 20, 10], [6, 5, 6], [walks[0], walks[1], walks[0]])
    assert out[3]["lookup"] == pytest.approx(together / looked3)


def test_a_scheduled_arm_is_priced_from_its_chains_at_each_steps_batch():
    """A drafter arm with a schedule is priced over each request's chain, each step at the γ of the batch
    it ran (`VllmModel.group_ms`), so a group's tail at one sequence drafts the schedule's γ there."""
    from draftnas.bench.vllm_predicted import PricedArm, arm_group_ms, batch_speedups
    from draftnas.core.registry import get_architecture
    from draftnas.latency.vllm import Chain, VllmModel
    from tests.search.test_engine_vllm import calibration

    target, base = get_architecture("qwen2.5-coder-1.5b"), get_architecture("qwen2.5-coder-0.5b")
    model = VllmModel(calibration(), target, base)
    arm = PricedArm("model", base, 3, ((1, 1, 3), (2, 65536, 1)))
    assert [arm.gamma_at(b) for b in (1, 2, 9)] == [3, 1, 1]
    chains = [Chain((1, 0), 3), Chain((0, 3, 3, 3, 3, 3, 3), 8)]
    out = batch_speedups(model, {"s": arm}, [20, 20], [3, 8], {"s": chains}, [2])
    plain = arm_group_ms(model, "target", None, 0, [20, 20], [3, 8], [])
    tail = model.group_ms("model", base, {1: 3, 2: 1}.__getitem__, [20, 20], chains)
    assert out[2]["s"] == pytest.approx(plain / tail)
    # a schedule of γ 1 throughout prices as γ 1 fixed over the chains' walks; this one's tail does not
    fixed = model.group_ms("model", base, 1, [20, 20], [c.walk(1) for c in chains])
    flat = batch_speedups(model, {"s": PricedArm("model", base, 1, ((1, 65536, 1),))}, [20, 20], [3, 8],
                          {"s": chains}, [2])
    assert flat[2]["s"] == pytest.approx(plain / fixed) and tail != pytest.approx(fixed)


def test_lookup_runs_beside_vllms_draft_models():
    assert BenchOptions(engine="vllm", lookup="lookup:n=3,m=4").validate().lookup == "lookup:n=3,m=4"


def test_vllms_lookup_rule_is_the_longest_match_at_its_earliest_start():
    """Checked against its definition by brute force: among the n-grams of length n_min..n equal to the
    history's last ones and starting before its last token, the longest, then the earliest; up to m after."""
    import random

    rng = random.Random(1)
    for _ in range(2000):
        history = [rng.randint(0, 3) for _ in range(rng.randint(1, 30))]
        n_min, m = rng.randint(1, 3), rng.randint(1, 5)
        n = rng.randint(n_min, 5)
        t = len(history)
        found = [(v, s) for v in range(n_min, n + 1) for s in range(t - 1)
                 if s + v <= t - 1 and history[s:s + v] == history[t - v:]]
        want = []
        if found:
            v = max(f[0] for f in found)
            s = min(f[1] for f in found if f[0] == v)
            want = history[s + v:s + v + m]
        assert propose_earliest_longest(history, n, m, n_min) == want


def test_a_replay_to_a_budget_lets_the_last_step_draft_past_it():
    """vLLM drafts past max_tokens: with the answer known beyond the budget, the last step's drafts meet
    those tokens instead of being cut at the budget."""
    prompt, answer = [7, 1, 2, 3, 4, 5, 6, 9, 1, 2], [3, 4, 5, 6, 9, 1]
    cut = replay_lookup(prompt, answer[:3], 2, 4, rule="earliest-longest")
    past = replay_lookup(prompt, answer, 2, 4, rule="earliest-longest", budget=3)
    assert past.new_tokens == 3 and past.drafted[0] == 4 and past.accepted[0] == 4
    assert cut.drafted[0] == 1 and cut.accepted[0] == 1  # cut at the budget's end, as draftnas's loop does


def test_the_replay_by_vllms_rule_differs_from_draftnass_where_matches_repeat():
    prompt = [1, 2, 7, 9, 9, 1, 2, 5, 6, 6, 1, 2]
    answer = [5, 6, 6, 1, 2, 5, 6, 6]
    latest = replay_lookup(prompt, answer, 2, 3)
    earliest = replay_lookup(prompt, answer, 2, 3, rule="earliest-longest")
    assert sum(earliest.accepted) < sum(latest.accepted)  # vLLM's first match drafts 7, 9, 9


@needs_vllm
def test_a_real_vllm_bench_is_lossless_and_its_acceptance_is_replayed():
    """SmolLM2-135M in vLLM, its own weights as the draft model and lookup beside it, 2 prompts x 24 tokens:
    every output equals the target alone's, the draft model's drafts are all accepted, and vLLM's accepted
    drafts per position are draftnas's replay of the same requests."""
    from draftnas.bench.vllm import run_vllm_bench
    from draftnas.core.prompts import Prompt

    prompts = [Prompt(id="p0", domain="edit", text="Repeat exactly, twice: alpha beta gamma delta alpha"),
               Prompt(id="p1", domain="code", text="Write def add(a, b): return a + b three times.")]
    options = BenchOptions(engine="vllm", gamma=3, max_new_tokens=24, rounds=1, lookup="lookup:n=2,m=3")
    result = run_vllm_bench("smollm2-135m", "smollm2-135m", prompts, options.validate())
    assert result.versions == {"vllm": installed_vllm().version}
    draft, lookup = result.arm("draftnas"), result.arm(LOOKUP)
    assert draft.exact_match_rate == lookup.exact_match_rate == 1.0
    assert draft.accepted_per_position == draft.predicted_accepted_per_position == (1.0, 1.0, 1.0)
    assert lookup.accepted_per_position and lookup.predicted_accepted_per_position
    for measured, replayed in zip(lookup.accepted_per_position, lookup.predicted_accepted_per_position,
                                  strict=True):
        assert measured == pytest.approx(replayed, rel=0.05)  # the bar: within 5%
    assert any("largest difference" in line for line in position_lines(result))


@needs_vllm
def test_a_real_vllm_batch_bench_runs_b_requests_at_once_losslessly():
    from draftnas.bench.vllm_batched import run_vllm_batch_sizes
    from draftnas.core.prompts import Prompt

    prompts = [Prompt(id="p0", domain="code", text="Write def add(a, b): return a + b three times."),
               Prompt(id="p1", domain="chat", text="Name three colours.")]
    options = BenchOptions(engine="vllm", gamma=2, max_new_tokens=12, rounds=1, batch_sizes=(1, 3),
                           gamma_schedule="1-1:2,2-65536:0")
    result = run_vllm_batch_sizes("smollm2-135m", "smollm2-135m", prompts, options.validate())
    assert [p.batch_size for p in result.points] == [1, 3] and result.engine == "vllm"
    for p in result.points:
        assert p.exact_match_rate["draftnas"] == 1.0 and p.tokens_per_step["draftnas"] >= 2.0
        assert p.target_tokens_per_s > 0 and len(p.speedup_runs["draftnas"]) == 1
    # the schedule drafts γ 2 at one sequence and none at three (vLLM still runs), lossless at both.
    # vLLM picks γ by the batch live at each step, so a step where one of the three sequences is left
    # alone drafts at γ 2 (the group is prefilled in one step): most steps at three sequences carry one
    # token, and the mean stays well below the single sequence's.
    one, three = result.points
    assert one.exact_match_rate[SCHEDULE] == three.exact_match_rate[SCHEDULE] == 1.0
    assert one.tokens_per_step[SCHEDULE] >= 2.0
    assert 1.0 <= three.tokens_per_step[SCHEDULE] < 1.25 < one.tokens_per_step[SCHEDULE]
    assert result.schedule_against == {SCHEDULE: ("draftnas",)}


@needs_vllm
def test_settings_vllm_refuses_and_a_batch_above_its_max_num_seqs_are_one_line_before_any_engine_starts():
    from draftnas.bench.vllm import VllmArm, check_settings, plan_vllm_bench
    from draftnas.bench.vllm_batched import run_vllm_batch_sizes
    from draftnas.core.prompts import Prompt
    from draftnas.models.vllm_engine import find_vllm

    prompts = [Prompt(id="p0", domain="code", text="Write def add(a, b): return a + b three times.")]
    options = BenchOptions(engine="vllm", gamma=2, max_new_tokens=8, rounds=1).validate()
    plan = plan_vllm_bench("smollm2-135m", "smollm2-135m", prompts, options, ())
    bad = VllmArm("lookup", plan.arms[1].drafter, "", {"method": "ngram", "prompt_lookup_min": 5,
                                                       "prompt_lookup_max": 2, "num_speculative_tokens": 3})
    with pytest.raises(InvalidInputError, match="refuses the lookup arm's speculative_config.*lookup_min=5"):
        check_settings(find_vllm(), replace(plan, arms=[*plan.arms, bad]))
    wide = replace(options, batch_sizes=(1, 200)).validate()
    with pytest.raises(DraftnasError, match=r"200 is above the \d+ sequences vLLM"):
        run_vllm_batch_sizes("smollm2-135m", "smollm2-135m", prompts, wide)


def test_the_printed_crossover_gives_each_run_and_what_the_prediction_read():
    from draftnas.bench.batch_records import BatchedBenchResult, BatchPoint
    from draftnas.cli import cmd_bench
    from draftnas.cli.app import console

    def point(b, runs, predicted):
        return BatchPoint(batch_size=b, target_tokens_per_s=2.0, tokens_per_s={"d": 2.0},
                          speedup={"d": runs[1]}, tokens_per_step={"d": 2.0}, exact_match_rate={"d": 1.0},
                          predicted_speedup={"d": predicted}, speedup_runs={"d": runs})

    result = BatchedBenchResult(
        target="t", drafters={"d": "qwen2.5-coder-0.5b"}, gamma=3, max_new_tokens=8, device="cpu",
        dtype="float32", threads=2, profile="this host's vLLM calibration c.json", engine="vllm",
        points=(point(1, (1.1, 1.2, 1.1), 1.2), point(2, (0.9, 1.01, 0.97), 0.95)),
        measured_crossover={"d": None}, predicted_crossover={"d": 2},
        measured_crossover_runs={"d": (2, None, 2)})
    with console.capture() as captured:
        cmd_bench._print_batched(result)
    said = " ".join(captured.get().split())
    assert "crossover measured not reached up to B=2 (per run: B=2, none, B=2)" in said
    assert "predicted B=2 (acceptance from draftnas's replay of each prompt" in said
    assert "measured over 3 run(s) per B: pays at B=1; not separable at B=2;" in said
    assert "vLLM)" in said  # the table's title names the engine
    with console.capture() as captured:
        cmd_bench._print_batched(replace(result, profile=""))
    assert "no vLLM calibration of this target here" in " ".join(captured.get().split())


@needs_vllm
def test_a_head_runs_in_vllm_as_eagle3_losslessly_and_its_steps_are_replayed(tmp_path):
    """A head for SmolLM2-135M (untrained: its output rows the target's, the rest random), served by vLLM as
    `eagle3`, 2 prompts x 12 tokens: every output equals the target alone's, and vLLM's drafting steps and
    accepted drafts per position are draftnas's replay of the same requests (the head read over the
    target's hidden states)."""
    import json as json_

    from draftnas.bench.vllm import run_vllm_bench
    from draftnas.core.prompts import Prompt
    from draftnas.drafter.head.build import new_head
    from draftnas.drafter.head.folder import write_head
    from draftnas.drafter.head.shape import head_shape
    from draftnas.models.sources import ensure_local_folder, load_model

    target = load_model("smollm2-135m").model.float()
    config = json_.loads((ensure_local_folder("smollm2-135m")[1] / "config.json").read_text())
    shape = head_shape(config, "smollm2-135m", draft_vocab=4096, ffn=256)
    folder = write_head(new_head(target, shape, list(range(4096)), seed=0), tmp_path / "head")
    prompts = [Prompt(id="p0", domain="code", text="Write def add(a, b): return a + b three times."),
               Prompt(id="p1", domain="chat", text="Name three colours.")]
    options = BenchOptions(engine="vllm", gamma=2, max_new_tokens=12, rounds=1)
    result = run_vllm_bench("smollm2-135m", f"head:{folder}", prompts, options.validate())
    head = result.arm("draftnas")
    assert head.exact_match_rate == 1.0 and head.gamma == 2
    assert head.accepted_per_position == head.predicted_accepted_per_position
    assert sum(r.drafted for p in result.prompts for r in p.runs if r.arm == "draftnas") > 0


def test_a_model_drafters_replay_to_a_budget_stops_where_the_answer_ended_first():
    """A request that ends at its end-of-sequence token before the budget takes no more steps in vLLM; the
    replay counted steps up to the budget (drafts never made, the per-position rates diluted)."""
    from types import SimpleNamespace

    import torch

    from draftnas.bench.vllm_replay import _model_chain

    prompt, answer = [1, 2, 3], [4, 5, 6, 7, 8, 9]

    def perfect(input_ids):  # a drafter whose guess after each prefix is the sequence's next token
        ids = input_ids[0].tolist()
        logits = torch.zeros(len(ids), 16)
        for i, nxt in enumerate(ids[1:] + [0]):
            logits[i, nxt] = 1.0
        return SimpleNamespace(logits=logits[None])

    assert _model_chain(perfect, prompt, answer, 2, budget=64).walk(2) == [(2, 2), (2, 2)]  # 1 + 3 + 3 tokens
    assert _model_chain(perfect, prompt, answer, 2, budget=3).walk(2) == [(2, 2)]
