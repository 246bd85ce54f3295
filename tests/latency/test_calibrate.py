"""Calibrating a host: the dtype timed, and stacks of other shapes (a base, a reference) beside the
target's, so drafters of their width are priced from their own kernels."""

from __future__ import annotations

import dataclasses

import pytest

from draftnas.core.registry import Architecture
from draftnas.latency.calibrate import CalibrationPlan, calibrate_host, choose_dtype
from draftnas.latency.corrected import CalibratedModel
from draftnas.latency.model import LatencyModel
from draftnas.latency.records import ProfileOptions

TARGET = Architecture(name="tgt", family="llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256)
BASE = Architecture(name="base", family="llama", num_hidden_layers=3, hidden_size=32, intermediate_size=64,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=256)
OPTIONS = ProfileOptions(device="cpu", dtype="fp32", mode="static", repeats=3, warmup=1, threads=1)


def _flat_model() -> LatencyModel:
    """A latency model that predicts 1 ms per layer plus 1 ms: what the calibration corrects."""
    from draftnas.latency.model import FIT_TERMS, RIDGE, TILE

    coefficients = {t: 0.0 for t in FIT_TERMS} | {"call": 1.0, "layer": 1.0, RIDGE: 1.0, TILE: 1.0}
    return LatencyModel(coefficients, "fp32", name="flat")


def test_choose_dtype_times_every_dtype_and_picks_the_fastest():
    chosen, timings = choose_dtype(OPTIONS, TARGET, 3, ("fp32", "bf16"))
    assert set(timings) == {"fp32", "bf16"} and all(set(ms) == {1, 3} for ms in timings.values())
    assert chosen == min(timings, key=lambda d: sum(timings[d].values()))


def _round_robin_passes(monkeypatch) -> list:
    """Every group list `run_round_robin` is called with from the calibration, in order (each is
    still timed for real)."""
    import draftnas.latency.calibrate as calibrate

    seen = []
    real = calibrate.run_round_robin

    def spy(rt, groups, tick):
        seen.append(groups)
        return real(rt, groups, tick)

    monkeypatch.setattr(calibrate, "run_round_robin", spy)
    return seen


def test_choose_dtype_times_the_dtypes_round_robin_in_one_pass(monkeypatch):
    """A burst of other work must hit every dtype alike: one interleaved pass over both models."""
    passes = _round_robin_passes(monkeypatch)
    _, timings = choose_dtype(OPTIONS, TARGET, 3, ("fp32", "bf16"), repeats=4, drop_above=1e9)
    # the probe, then the repeats: each pass interleaves both dtypes
    assert [len(groups) for groups in passes] == [2, 2] and set(timings) == {"fp32", "bf16"}


def test_a_dtype_that_loses_badly_on_the_probe_is_not_timed_to_the_end(monkeypatch):
    import draftnas.latency.calibrate as calibrate

    calls = []

    def fake(options, target, new_tokens, dtypes, context_tokens, repeats, kernels="auto"):
        calls.append((tuple(dtypes), repeats))
        return {"fp32": {1: 300.0, 3: 900.0}, "bf16": {1: 100.0, 3: 110.0}}

    monkeypatch.setattr(calibrate, "_time_dtypes", fake)
    chosen, timings = choose_dtype(OPTIONS, TARGET, 3, ("fp32", "bf16"))
    assert chosen == "bf16" and calls == [(("fp32", "bf16"), 3)]  # no repeats for either: fp32 is 5.7x
    assert timings["fp32"] == {1: 300.0, 3: 900.0}  # its probe stands as its timing


def test_a_base_is_timed_beside_the_target_and_prices_the_drafters_of_its_width():
    calibration = calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False, head_rows=[64],
                                                                  stacks=[BASE, TARGET]))
    assert set(calibration.stacks) == {"base"}  # the target is not timed twice
    stack = calibration.stacks["base"]
    assert stack.full_ms > 0 and set(stack.prefix_ms) == {1, 2} and set(stack.head_saving_ms) == {64}
    model = CalibratedModel(_flat_model(), calibration, TARGET)
    # the base itself (a reference drafter as users run it): its measured decode
    assert model.predict_ms(BASE, context_tokens=128) == pytest.approx(stack.full_ms)
    # a drafter cut from the base by depth: priced on the base's own line (measured over predicted, each a
    # straight fit in depth through the base's timed prefixes and its full depth), not the target's. The
    # check is on the fitted line itself: comparing with one raw timed point flaked on a loaded host,
    # where the fit sits away from any single noisy point.
    import numpy as np

    cut = BASE.with_shape(num_hidden_layers=2, name="cut")
    flat = _flat_model()
    points = {**stack.prefix_ms, BASE.num_hidden_layers: stack.full_ms}
    ks = sorted(points)
    measured = np.polyfit(ks, [points[k] for k in ks], 1)
    predicted = np.polyfit(ks, [flat.predict_ms(BASE.with_shape(num_hidden_layers=k), context_tokens=128)
                                for k in ks], 1)
    base_ratio = float(np.polyval(measured, 2)) / float(np.polyval(predicted, 2))
    said = model.predict_ms(cut, context_tokens=128)
    assert said == pytest.approx(flat.predict_ms(cut, context_tokens=128) * base_ratio, rel=1e-9)
    if abs(base_ratio - model.ratio(2)) > 1e-6 * base_ratio:  # and so not the target's line
        assert said != pytest.approx(flat.predict_ms(cut, context_tokens=128) * model.ratio(2), rel=1e-9)


def test_a_base_is_timed_with_int8_weights_beside_its_dense_stack_and_only_in_the_static_cpu_engine():
    from draftnas.core.errors import DeviceError

    calibration = calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False, head_rows=[64],
                                                                  stacks=[BASE], quant_stacks=[BASE]))
    dense, int8 = calibration.stacks["base"], calibration.quant_stacks["int8"]["base"]
    assert int8.full_ms > 0 and set(int8.prefix_ms) == {1, 2} and set(int8.head_saving_ms) == {64}
    assert int8 != dense  # timed on its own models, not a copy of the dense figures
    # int8 is offered only where it timed faster than dense; on a stack this tiny either may win, so the
    # pricing is checked on the int8 figures set below the dense ones
    fast = dataclasses.replace(int8, full_ms=min(int8.full_ms, 0.9 * dense.full_ms))
    faster = dataclasses.replace(calibration, quant_stacks={"int8": {"base": fast}})
    model = CalibratedModel(_flat_model(), faster, TARGET)
    assert model.for_weights("int8").predict_ms(BASE, context_tokens=128) == pytest.approx(fast.full_ms)
    with pytest.raises(DeviceError, match="static"):
        eager = ProfileOptions(device="cpu", dtype="fp32", mode="eager", repeats=3, warmup=1, threads=1)
        calibrate_host(eager, TARGET, CalibrationPlan((2,), overheads=False, quant_stacks=[BASE]))


def test_the_target_is_timed_at_the_start_and_again_at_the_end_of_a_calibration(monkeypatch):
    """The host's speed moves over minutes: the target's steps are read in two passes, pooled."""
    seen = _round_robin_passes(monkeypatch)
    calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False, stacks=[BASE]))
    groups = seen[0]
    assert len(groups) == 3 and groups[-1] is groups[0] and groups[1] is not groups[0]
    assert all(len(job.times_ms) == 2 * OPTIONS.repeats for job in groups[0].jobs)
    assert all(len(job.times_ms) == OPTIONS.repeats for job in groups[1].jobs)
    seen.clear()
    calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False))  # the target alone: one pass
    assert len(seen[0]) == 1 and all(len(job.times_ms) == OPTIONS.repeats for job in seen[0][0].jobs)


def test_a_stack_held_out_is_priced_from_its_prefixes_not_from_its_timed_full_depth():
    deep = BASE.with_shape(name="deep", num_hidden_layers=6)
    calibration = calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False, stacks=[deep]))
    stack = calibration.stacks["deep"]
    assert set(stack.prefix_ms) == {1, 2, 3}  # its first layers and its middle depth: the line spans it
    model = CalibratedModel(_flat_model(), calibration, TARGET)
    assert model.predict_ms(deep) == pytest.approx(stack.full_ms)  # timed: read back
    held = model.without_full_depth(frozenset({"deep"}))
    predicted = held.predict_ms(deep)
    assert predicted != pytest.approx(stack.full_ms) and predicted > stack.prefix_ms[3]
    # the held-out model still reads every other timed shape as measured
    assert held.predict_ms(TARGET, new_tokens=2) == pytest.approx(model.predict_ms(TARGET, new_tokens=2))


def test_int8_stacks_may_run_bf16_activations_beside_an_fp32_target(monkeypatch):
    calibration = calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False, stacks=[BASE],
                                                                  quant_stacks=[BASE], quant_dtype="bf16"))
    assert calibration.dtype == "fp32" and calibration.quant_dtype == "bf16"
    assert calibration.quant_stacks["int8"]["base"].full_ms > 0
    assert calibrate_host(OPTIONS, TARGET, CalibrationPlan((2,), overheads=False,
                                                           quant_stacks=[BASE])).quant_dtype == "fp32"
    # the choice: beside an fp32 target, whichever activations the int8 product timed faster in
    import draftnas.search.calibration as search_calibration
    from draftnas.models.matmul import faster_int8_activations

    best, times = faster_int8_activations(32, 64, repeats=3)
    assert best in times and set(times) == {"fp32", "bf16"} and all(t > 0 for t in times.values())
    monkeypatch.setattr(search_calibration, "faster_int8_activations", lambda i, o: ("bf16", {}))
    assert search_calibration.int8_activations("fp32", [BASE]) == "bf16"
    assert search_calibration.int8_activations("bf16", [BASE]) is None  # the target's own dtype
    assert search_calibration.int8_activations("fp32", []) is None  # no int8 drafters offered


def test_the_formats_a_calibration_times_are_those_that_run_on_its_device():
    """On the CPU every quantized format of the space; on CUDA int4 only (int8 there is refused before);
    none outside draftnas's static engine."""
    import dataclasses

    from draftnas.search.calibration import quant_formats
    from draftnas.search.spaces import load_search_space

    space = load_search_space("qwen2.5-coder-1.5b")
    mixed = dataclasses.replace(space, weights=("dense", "int8", "int4", "attn=int8,mlp=int8,head=int4",
                                                "attn=dense,mlp=int4,head=int4"))
    assert quant_formats(mixed, "cpu", "static") == ["int8", "int4", "attn=int8,mlp=int8,head=int4",
                                                     "attn=dense,mlp=int4,head=int4"]
    assert quant_formats(mixed, "cuda", "static") == ["int4", "attn=dense,mlp=int4,head=int4"]
    assert quant_formats(mixed, "cpu", "hf") == [] and quant_formats(mixed, "mps", "static") == []


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_a_cuda_calibration_of_a_space_offering_int4_times_its_base_in_int4_in_bf16_graphs():
    """On CUDA int4 multiplies bf16 activations only: a space offering it is calibrated in bf16 (not the
    faster of bf16 and fp16), its base timed in int4 and per layer group beside dense, as CUDA graphs,
    and each format priced from those timings or refused as slower than dense."""
    from draftnas.core.errors import InfeasibleCandidateError
    from draftnas.latency.files import load_profile, profiles_dir
    from draftnas.search.calibration import calibrated_predictor
    from draftnas.search.spaces import load_search_space

    target = TARGET.with_shape(hidden_size=256, intermediate_size=512, head_dim=64, vocab_size=1024)
    base = BASE.with_shape(hidden_size=128, intermediate_size=256, head_dim=64, vocab_size=1024)
    mixed = "attn=dense,mlp=int4,head=dense"
    space = dataclasses.replace(load_search_space("qwen2.5-coder-1.5b"), weights=("dense", "int4", mixed),
                                vocab_sizes=(0, 512))
    space = dataclasses.replace(space, gamma=dataclasses.replace(space.gamma, min=1, max=3))
    profile = load_profile(profiles_dir() / "h100-bf16-cuda-graph.json")
    model, summary, dtype = calibrated_predictor(profile, target, space, stacks=[base], quant_stacks=[base])
    calibration = model.calibration
    assert dtype == "bf16" and calibration.mode == "cuda-graph" and calibration.quant_dtype == "bf16"
    assert set(calibration.quant_stacks) == {"int4", mixed} and calibration.dtype_ms == {}  # bf16 given
    for weights in ("int4", mixed):
        timed = calibration.quant_stacks[weights]["base"]
        assert timed.full_ms > 0 and timed != calibration.stacks["base"]
        try:
            priced = model.for_weights(weights).predict_ms(base, context_tokens=128)
            assert priced == pytest.approx(timed.full_ms + calibration.draft_overhead_ms)  # a drafted token's
        except InfeasibleCandidateError as e:  # a stack this small may time int4 slower than dense
            assert "timed slower than dense" in str(e) and timed.full_ms >= calibration.stacks["base"].full_ms


def test_a_drafters_prefill_is_priced_from_its_stacks_prefill_timed_in_its_format():
    """A base is timed reading the workload's prompt too, dense and in each format: an int4 drafter's
    prefill is priced from the int4 stack's (the CPU's int4 kernel reads many rows slower than dense while
    it decodes one faster), a cut of it scaled by depth, not from the decode's ratio."""
    plan = CalibrationPlan((2,), overheads=False, prompt_tokens=24, stacks=(BASE,), quant_stacks=(BASE,),
                           quant_formats=("int4",))
    calibration = calibrate_host(OPTIONS, TARGET, plan)
    dense, int4 = calibration.stacks["base"], calibration.quant_stacks["int4"]["base"]
    assert set(dense.prefill_ms) == set(int4.prefill_ms) == {24} and dense.prefill_ms != int4.prefill_ms
    assert set(dense.prefix_ms) == {1, 2}  # the prefill is not taken for a depth
    # priced only where int4 decodes faster than dense: set so, its prefill left as timed
    fast = dataclasses.replace(int4, full_ms=min(int4.full_ms, 0.9 * dense.full_ms),
                               prefill_ms={24: 3 * dense.prefill_ms[24]})
    timed = dataclasses.replace(calibration, quant_stacks={"int4": {"base": fast}})
    model = CalibratedModel(_flat_model(), timed, TARGET)
    for priced, stack in ((model, dense), (model.for_weights("int4"), fast)):
        assert priced.predict_ms(BASE, new_tokens=24, context_tokens=0) == pytest.approx(stack.prefill_ms[24])
        cut = BASE.with_shape(num_hidden_layers=2, name="cut")
        flat = _flat_model()
        said = flat.predict_ms(cut, new_tokens=24, context_tokens=0) / \
            flat.predict_ms(BASE, new_tokens=24, context_tokens=0)
        assert priced.predict_ms(cut, new_tokens=24, context_tokens=0) == \
            pytest.approx(stack.prefill_ms[24] * said)
    # the target's own prefill read back as timed
    assert model.predict_ms(TARGET, new_tokens=24, context_tokens=0) == \
        pytest.approx(calibration.prefill_ms[24])
