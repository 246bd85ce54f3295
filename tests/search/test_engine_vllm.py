"""The vLLM search's calibration reading, pricing, constraints and printed settings, on hand-made driver
output (no engine runs here; `tests/latency/test_vllm_calibration.py` runs vLLM)."""

from __future__ import annotations

import json

import pytest

from draftnas.core.errors import DraftnasError, InfeasibleCandidateError
from draftnas.core.machine import cpu_identity
from draftnas.core.options import OptionError
from draftnas.core.registry import get_architecture
from draftnas.latency.vllm import VllmCalibration, VllmModel, piecewise
from draftnas.latency.vllm_timing import catch_up_tokens, forward_ms, overhead_by_batch, timed_runs
from draftnas.search.scoring import read_latency, target_latency
from draftnas.search.spaces import load_search_space
from draftnas.search.vllm import (
    ANY_BATCH,
    batch_schedule,
    calibration_batches,
    parse_schedule,
    schedule_gamma,
    space_problems,
    speculative_config,
)

TARGET = get_architecture("qwen2.5-coder-1.5b")
BASE = get_architecture("qwen2.5-coder-0.5b")


def driver_result() -> dict:
    """What the driver returns for a speculative run at γ 2: a prefill, then two verify steps, at batch 2."""
    step = [["target", 6, 0.030], ["target-logits", 6, 0.006], ["draft", 8, 0.012],
            ["draft-logits", 2, 0.002], ["draft", 2, 0.005], ["draft-logits", 2, 0.002]]
    prefill = [["target", 40, 0.100], ["target-logits", 2, 0.003], ["draft", 42, 0.050],
               ["draft-logits", 2, 0.002], ["draft", 2, 0.005], ["draft-logits", 2, 0.002]]
    forwards = prefill + step + step
    spent = sum(s for _, _, s in forwards)
    return {"vllm": "0.32.0", "rounds": [[{"batch": 2, "seconds": spent + 3 * 0.010, "forwards": forwards}]]}


def test_driver_output_is_read_into_forwards_heads_overheads_and_the_catch_up():
    runs = timed_runs(driver_result())
    assert runs[0].steps == 3  # one target forward a step
    assert forward_ms(runs, "target") == {6: 30.0, 40: 100.0}
    assert forward_ms(runs, "draft-logits") == {2: 2.0}
    assert overhead_by_batch(runs) == {2: pytest.approx(10.0)}
    assert catch_up_tokens(runs, 2) == 2  # 8 tokens over 2 sequences after a verify of 3 each
    with pytest.raises(InfeasibleCandidateError, match="no verify step"):
        catch_up_tokens(runs, 4)


def test_piecewise_joins_points_and_extends_past_the_last_two():
    points = {1: 10.0, 4: 16.0, 8: 32.0}
    assert piecewise(points, 1) == 10.0 and piecewise(points, 0.5) == 10.0
    assert piecewise(points, 2) == pytest.approx(12.0)
    assert piecewise(points, 12) == pytest.approx(48.0)
    assert piecewise({3: 7.0}, 100) == 7.0


def calibration() -> VllmCalibration:
    return VllmCalibration(
        engine="vllm", version="0.32.0", device="cpu", cpu=cpu_identity(), threads=2, target="t",
        base=BASE.name, gamma=4, batches=(1, 2, 4), prompt_tokens=40,
        target_ms={1: 100.0, 2: 104.0, 4: 112.0, 5: 120.0, 10: 150.0, 20: 200.0, 40: 300.0},
        target_head_ms={1: 20.0, 2: 22.0, 4: 26.0, 5: 28.0, 10: 40.0, 20: 60.0},
        drafter_ms={2: {1: 4.0, 6: 6.0, 12: 8.0}, 24: {1: 48.0, 6: 60.0, 12: 72.0}},
        drafter_head_ms={1: 10.0, 2: 11.0, 4: 13.0},
        plain_overhead_ms={1: 5.0, 2: 6.0, 4: 8.0}, spec_overhead_ms={1: 30.0, 2: 40.0, 4: 60.0},
        catch_up_tokens=2)


def test_the_model_prices_steps_as_vllm_runs_them():
    model = VllmModel(calibration(), TARGET, BASE)
    assert model.predict_ms(TARGET) == pytest.approx(100 + 20 + 5)  # forward, head, plain step's work
    assert model.predict_ms(TARGET, new_tokens=5) == pytest.approx(120 + 28 + 30)  # a verify scores 5 rows
    assert model.predict_ms(TARGET, batch_size=2, new_tokens=5) == pytest.approx(150 + 40 + 40)
    assert model.predict_ms(TARGET, new_tokens=40, context_tokens=0) == pytest.approx(300 + 20 + 5)  # prefill
    drafter = BASE.with_shape(name="cut", num_hidden_layers=13)
    assert model.predict_ms(drafter) == pytest.approx(4 + (48 - 4) / 22 * 11 + 10)  # the depths' line
    assert model.predict_ms(BASE) == pytest.approx(48 + 10)
    # the first draft of a step reads γ + 2 tokens: at γ 4, 6 tokens, beyond a one-token forward
    assert model.drafter_batch_ms(BASE, 5) == pytest.approx(60 - 48)
    at_two = piecewise({1: 48, 6: 60, 12: 72}, 2)
    assert model.drafter_batch_ms(BASE, 5, batch_size=2) == pytest.approx(72 - at_two)
    assert model.predict_ms(BASE, head_vocab_size=32768) == model.predict_ms(BASE)  # the full-head copy runs
    assert model.max_batch_size == 4 and model.timed_batches() == (2, 4)
    assert model.for_weights("dense") is model
    with pytest.raises(InfeasibleCandidateError, match="dense"):
        model.for_weights("int8")
    with pytest.raises(InfeasibleCandidateError, match="full width"):
        model.predict_ms(BASE.with_shape(intermediate_size=2048))
    assert "vLLM 0.32.0" in model.summary()


def test_the_search_adds_the_drafters_catch_up_to_each_verify_at_its_batch():
    space = load_search_space("qwen2.5-coder-1.5b-vllm")
    model = VllmModel(calibration(), TARGET, BASE)
    target = target_latency(model, TARGET, space.workload, space.gamma)
    reading = read_latency(model, "vllm", BASE, space.workload, target)
    g = 4
    expected = model.predict_ms(TARGET, new_tokens=g + 1) + model.drafter_batch_ms(BASE, g + 1)
    assert reading.verify_ms[0][g] == pytest.approx(expected)
    assert reading.verify_ms[0][0] == model.predict_ms(TARGET)  # no drafts, no catch-up


def test_the_shipped_vllm_space_holds_what_vllm_runs_and_others_are_refused():
    assert space_problems(load_search_space("qwen2.5-coder-1.5b-vllm")) == []
    said = " ".join(space_problems(load_search_space("qwen2.5-coder-1.5b")))
    assert "int8" in said and "confidence stops" in said
    assert "prunes widths" in " ".join(space_problems(load_search_space("smollm2-135m")))


def test_calibration_batches_double_up_to_the_largest():
    assert calibration_batches(1) == (1,)
    assert calibration_batches(8) == (1, 2, 4, 8)
    assert calibration_batches(6) == (1, 2, 4, 6)


def test_the_schedule_keeps_gamma_per_range_and_past_the_last_batch_that_pays_the_best_gamma_there():
    batches, gammas = (1, 2, 4, 8, 16), (4, 4, 3, 2, 1)
    assert batch_schedule(batches, gammas, (1.3, 1.2, 1.1, 1.05, 0.9)) == [(1, 3, 4), (4, 7, 3), (8, 8, 2),
                                                                           (9, ANY_BATCH, 1)]
    # where the best γ past the break-even is the last range's, that range runs on to any batch
    assert batch_schedule(batches, (3, 3, 1, 1, 1), (1.3, 1.2, 0.9, 0.8, 0.7)) == [(1, 2, 3),
                                                                               (3, ANY_BATCH, 1)]
    assert batch_schedule((1, 2, 4), (3, 1, 1), (1.2, 1.1, 0.9)) == [(1, 1, 3), (2, ANY_BATCH, 1)]
    assert batch_schedule(batches, gammas, (1.3, 1.2, 1.1, 1.05, 1.01)) == [(1, 3, 4), (4, 7, 3), (8, 15, 2),
                                                                            (16, ANY_BATCH, 1)]
    assert batch_schedule(batches, gammas, (0.9, 1.2, 1.1, 1.05, 1.01)) == []  # never past a break-even


def test_vllm_reads_the_schedule_as_its_scheduler_does():
    schedule = [(1, 3, 3), (4, 4, 2), (5, ANY_BATCH, 0)]
    assert [schedule_gamma(schedule, b) for b in (1, 2, 3, 4, 5, 8, 300)] == [3, 3, 3, 2, 0, 0, 0]
    # a batch in no range takes the γ of the last range before it, as vLLM fills a gap
    assert [schedule_gamma([(1, 2, 3), (8, 9, 1)], b) for b in (2, 5, 8, 12)] == [3, 3, 1, 1]


def test_a_schedule_parses_from_the_printed_json_or_ranges_and_bad_ones_are_one_line():
    assert parse_schedule("1-3:4,4-65536:0") == ((1, 3, 4), (4, 65536, 0))
    assert parse_schedule("[[1,3,4],[4,65536,0]]") == ((1, 3, 4), (4, 65536, 0))
    for bad, said in (("2-3:4", "start at batch 1"), ("1-3:4,3-9:2", "without overlapping"),
                      ("1-3:-1", "negative"), ("1-3:0", "never drafts"), ("1:3", "not START-END")):
        with pytest.raises(OptionError, match=said):
            parse_schedule(bad)


def test_the_printed_config_loads_the_full_head_copy_and_carries_the_schedule(tmp_path):
    folder = tmp_path / "drafter"
    (folder / "full-head").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"auto_map": {}}))
    config = speculative_config(str(folder), 4, [(1, 3, 4), (4, 7, 3)])
    assert config == {"method": "draft_model", "model": str(folder / "full-head"),
                      "num_speculative_tokens": 4,
                      "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 7, 3]]}
    assert speculative_config("qwen2.5-coder-0.5b", 3)["model"] == "qwen2.5-coder-0.5b"


def test_a_vllm_search_without_vllm_says_how_to_install_it(monkeypatch, tmp_path):
    from draftnas.search.vllm import vllm_model

    monkeypatch.setenv("DRAFTNAS_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(DraftnasError, match="draftnas engines --install vllm"):
        vllm_model("qwen2.5-coder-1.5b", TARGET, "qwen2.5-coder-0.5b", BASE,
                   load_search_space("qwen2.5-coder-1.5b-vllm"), 2)


def test_a_vllm_bench_prices_each_request_from_the_calibration_and_the_replay():
    from draftnas.bench.records import ArmResult, ArmRun, BenchPrompt, BenchResult
    from draftnas.bench.vllm_predicted import arm_request_ms, predicted_checks

    model = VllmModel(calibration(), TARGET, BASE)
    plain = arm_request_ms(model, "target", None, 0, 40, 8, [])
    assert plain == pytest.approx((300 + 20 + 5) + 7 * (100 + 20 + 5))  # prefill gives the first token
    steps = [(4, 4), (2, 4)]
    drafted = arm_request_ms(model, "model", BASE, 4, 40, 8, steps)
    drafts_after = 3 * 48 + 4 * 10  # γ - 1 one-token forwards, γ heads
    first = (300 + 20 + 30) + piecewise({1: 48, 6: 60, 12: 72}, 41) + drafts_after
    assert drafted == pytest.approx(first + 2 * ((120 + 28 + 30) + 60 + drafts_after))
    looked = arm_request_ms(model, "lookup", None, 4, 40, 8, [(2, 3), (0, 0)])
    assert looked == pytest.approx((300 + 20 + 30) + (112 + 26 + 30) + (100 + 20 + 30))  # no n-gram timing
    rows = tuple(BenchPrompt(prompt_id=f"p{i}", domain="code", prompt_tokens=40, round=0, runs=(
        ArmRun(arm="target", seconds=plain / 1000, new_tokens=8),
        ArmRun(arm="draftnas", seconds=drafted / 500, new_tokens=8))) for i in range(2))
    arms = (ArmResult(name="target", engine="vllm", tokens_per_s=8000 / plain,
                      pooled_tokens_per_s=8000 / plain),
            ArmResult(name="draftnas", engine="vllm", tokens_per_s=4000 / drafted,
                      speedup=plain / drafted / 2, drafter="qwen2.5-coder-0.5b", gamma=4,
                      pooled_tokens_per_s=4000 / drafted))
    result = BenchResult(target="t", drafters={"draftnas": "qwen2.5-coder-0.5b"}, gamma=4, temperature=0.0,
                         max_new_tokens=8, n_prompts=2, device="cpu", dtype="float32", threads=2,
                         engine="vllm", arms=arms, prompts=rows)
    checks = {c.arm: c for c in predicted_checks(result, model, {"target": "target", "draftnas": "model"},
                                                 {"target": None, "draftnas": BASE},
                                                 {"draftnas": [steps, steps]})}
    assert checks["target"].tokens_per_s_error == pytest.approx(0.0)
    assert checks["target"].speedup_error is None
    assert checks["draftnas"].tokens_per_s_error == pytest.approx(1.0)  # measured at half the predicted speed
    assert checks["draftnas"].speedup_error == pytest.approx(1.0)
    assert checks["draftnas"].source == "vllm calibration"


def test_requests_submitted_together_run_in_lockstep_at_the_batch_still_running():
    from draftnas.bench.vllm_predicted import arm_group_ms

    model = VllmModel(calibration(), TARGET, BASE)
    # two prompts of 20 tokens, 3 and 2 new tokens: one prefill of 40 tokens scoring 2 rows at batch 2's
    # work, a step at batch 2, then one at batch 1 (the shorter request has finished)
    plain = arm_group_ms(model, "target", None, 0, [20, 20], [3, 2], [])
    assert plain == pytest.approx((300 + 22 + 6) + (104 + 22 + 6) + (100 + 20 + 5))
    # lookup: the first step verifies 3 + 1 and 0 + 1 tokens, the second 1 + 1 for the request still running
    looked = arm_group_ms(model, "lookup", None, 4, [20, 20], [3, 3], [[(2, 3)], [(0, 0), (1, 1)]])
    assert looked == pytest.approx((300 + 22 + 40) + (120 + 28 + 40) + (104 + 22 + 30))
    # a model drafter at γ 1 (its first forward of a step drafts it): batch 2, then 1
    one = arm_group_ms(model, "model", BASE, 1, [20, 20], [3, 3], [[(1, 1)], [(0, 1), (1, 1)]])
    drafter = {1: 48.0, 6: 60.0, 12: 72.0}
    assert one == pytest.approx((300 + 22 + 40) + piecewise(drafter, 42) + 11
                                + (112 + 26 + 40) + piecewise(drafter, 6) + 11
                                + (104 + 22 + 30) + piecewise(drafter, 3) + 10)
    assert arm_group_ms(model, "target", None, 0, [40], [8], []) == model.group_ms(
        "target", None, 0, [40], [[(0, 0)] * 7])
    # γ 0 (a schedule's batches past its break-even): each step verifies one token a sequence and the
    # drafter still reads its catch-up tokens, with no draft head and no drafts after it
    none = arm_group_ms(model, "model", BASE, 0, [20, 20], [2, 2], [[(0, 0)], [(0, 0)]])
    assert none == pytest.approx((300 + 22 + 40) + piecewise(drafter, 42)
                                 + (104 + 22 + 40) + piecewise(drafter, 4))


def test_a_chain_prices_a_fixed_gamma_as_its_walk_and_a_schedule_at_each_steps_batch():
    """A chain holds each position's accepted run, so at a fixed γ it prices as the walk it gives, and under a
    schedule each step drafts the γ of the batch it ran: a group's tail, one sequence left, drafts γ 3."""
    from draftnas.latency.vllm import Chain

    model = VllmModel(calibration(), TARGET, BASE)
    drafter = {1: 48.0, 6: 60.0, 12: 72.0}
    # the two requests of the γ 1 case above: their walks at γ 1 are [(1, 1)] and [(0, 1), (1, 1)]
    a, b = Chain((1, 0), 3), Chain((0, 3), 3)
    assert a.walk(1) == [(1, 1)] and b.walk(1) == [(0, 1), (1, 1)] and b.walk(3) == [(0, 3), (3, 3)]
    one = model.group_ms("model", BASE, 1, [20, 20], [[(1, 1)], [(0, 1), (1, 1)]])
    assert model.group_ms("model", BASE, 1, [20, 20], [a, b]) == pytest.approx(one)
    # γ 3 at one sequence, 1 from two: the same steps, but the last (one sequence) drafts 3, which no step
    # verifies: two more one-token drafter forwards and two more heads at batch 1
    schedule = {1: 3, 2: 1}.__getitem__
    assert model.group_ms("model", BASE, schedule, [20, 20], [a, b]) == pytest.approx(one + 2 * 48 + 2 * 10)
    # where the tail goes on, its γ 3 drafts are verified: b's answer of 8 tokens takes steps at batch 2 (0
    # accepted, γ 1), then at batch 1 verifying γ 1 (1 accepted) and γ 3 (3 accepted): done in 3, not 4
    longer = Chain((0, 3, 3, 3, 3, 3, 3), 8)
    assert len(longer.walk(1)) == 4
    priced = model.group_ms("model", BASE, schedule, [20, 20], [a, longer])
    assert priced == pytest.approx((300 + 22 + 40) + piecewise(drafter, 42) + 11
                                   + (112 + 26 + 40) + piecewise(drafter, 6) + 11
                                   + (104 + 22 + 30) + piecewise(drafter, 3) + (2 * 48 + 3 * 10)
                                   + (112 + 26 + 30) + piecewise(drafter, 5) + (2 * 48 + 3 * 10))


def test_the_default_space_for_vllm_is_the_targets_vllm_one_else_its_loops_one():
    from draftnas.search.spaces import default_space_for

    assert default_space_for("qwen2.5-coder-1.5b", "vllm").name == "qwen2.5-coder-1.5b-vllm"
    assert default_space_for("qwen2.5-coder-1.5b", "static").name == "qwen2.5-coder-1.5b"
    assert default_space_for("qwen2.5-coder-1.5b", "llama.cpp").name == "qwen2.5-coder-1.5b-llama-cpp"
    assert default_space_for("smollm2-135m", "vllm").name == "smollm2-135m"  # whose problems the search says


def head_calibration() -> VllmCalibration:
    """`calibration()` with an eagle3 head timed: its forward, fc, head and step work."""
    from dataclasses import replace

    return replace(calibration(), head_label="head L2/14/25 V8192 F2048", head_rows=8192,
                   head_ms={1: 6.0, 2: 6.5, 5: 8.0, 10: 10.0}, head_fc_ms={1: 1.0, 5: 2.0, 10: 3.0},
                   head_logits_ms={1: 2.0, 2: 2.5, 4: 3.0}, head_overhead_ms={1: 25.0, 2: 33.0, 4: 50.0},
                   head_catch_up_tokens=1)


def timed_head_arch():
    from draftnas.drafter.head.shape import head_shape
    from draftnas.search.vllm import head_arch

    config = {"num_hidden_layers": 28, "hidden_size": 1536, "vocab_size": 151936, "num_attention_heads": 12,
              "num_key_value_heads": 2, "intermediate_size": 8960, "rope_theta": 1e6}
    shape = head_shape(config, "qwen2.5-coder-1.5b", layers=(2, 14, 25), draft_vocab=8192, ffn=2048)
    assert shape.label() == "head L2/14/25 V8192 F2048"
    return head_arch(TARGET, shape)


def test_the_timed_head_is_priced_from_its_own_steps_and_no_other_head_is():
    head = timed_head_arch()
    model = VllmModel(head_calibration(), TARGET, BASE, head=head)
    assert model.is_head(head, 8192) and not model.is_head(head, 16384) and not model.is_head(BASE)
    assert model.predict_ms(head, head_vocab_size=8192) == pytest.approx(6 + 2)  # one forward, its head
    # its first forward of a step reads the verified tokens (γ + 1 at c_h = 1) with its fc over them, and
    # its step's work differs from a model drafter's by 25 - 30 ms at batch 1
    assert model.drafter_batch_ms(head, 5) == pytest.approx(8 + 2 - 6 + 25 - 30)
    # a request: the prefill (the head reads the prompt and its first token, fc over them), then a step
    from draftnas.bench.vllm_predicted import arm_request_ms

    drafted = arm_request_ms(model, "head", head, 4, 40, 6, [(4, 4)])
    drafts_after = 3 * 6 + 4 * 2
    forward, fc = {1: 6, 2: 6.5, 5: 8, 10: 10}, {1: 1, 5: 2, 10: 3}
    prefill = (300 + 20 + 25) + piecewise(forward, 41) + piecewise(fc, 41)
    assert drafted == pytest.approx(prefill + drafts_after + (120 + 28 + 25) + 8 + 2 + drafts_after)
    other = head.with_shape(intermediate_size=head.intermediate_size + 64)
    with pytest.raises(InfeasibleCandidateError, match="one eagle3 head here"):
        arm_request_ms(model, "head", other, 4, 40, 6, [(4, 4)])
    # a calibration with no head timed prices no head's steps, as before
    with pytest.raises(InfeasibleCandidateError, match="head drafter's steps"):
        arm_request_ms(VllmModel(calibration(), TARGET, BASE, head=head), "head", head, 4, 40, 6, [(4, 4)])
    assert "eagle3 head L2/14/25 V8192 F2048" in model.summary()


def test_a_head_curve_is_priced_in_a_vllm_search_where_its_shape_was_timed():
    from draftnas.drafter.training.curve_fit import load_curves
    from draftnas.search.space import GammaRange
    from draftnas.search.trained import price_trained

    space = load_search_space("qwen2.5-coder-1.5b-vllm")
    head = timed_head_arch()
    curves = load_curves("benchmarks/results/heads/cpu-amd-zen3-qwen2.5-coder-1.5b-head-curve.json")
    curve = curves.curves[0]

    def priced(model):
        target = target_latency(model, TARGET, space.workload, space.gamma)
        return price_trained(curves, 120000, lambda a, rows: read_latency(model, "vllm", a, space.workload,
                                                                          target, rows),
                             get_architecture, space.workload, GammaRange(1, 4), None)

    found = priced(VllmModel(head_calibration(), TARGET, BASE, head=head))
    assert [p.label for p in found] == [curve.label]
    assert found[0].draft_ms == pytest.approx(8.0)  # the head's own forward and head at batch 1
    assert priced(VllmModel(calibration(), TARGET, BASE, head=None)) == ()  # no head timed: left out
