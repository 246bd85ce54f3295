"""`draftnas bench --batch-size` on tiny random models: lossless at every B, and the crossover rule."""

from __future__ import annotations

import statistics

import pytest

from draftnas.bench.batch_records import BatchedBenchResult
from draftnas.bench.batched import first_below_one, latency_model, predicted_speedup
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.run import run_batch_sizes
from draftnas.core.errors import InvalidInputError
from draftnas.core.prompts import Prompt
from draftnas.core.registry import get_architecture
from tests.helpers import loaded, tiny_llama, truncated

PROMPTS = (Prompt(id="a", domain="x", text="speculate "), Prompt(id="b", domain="y", text="draft nas " * 2),
           Prompt(id="c", domain="x", text="verify"))


@pytest.fixture(scope="module")
def tiny_models(tiny_llama_config):
    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    target.generation_config.eos_token_id = None
    return (loaded(target, "tiny-target"), loaded(truncated(target, 2), "tiny-draft"),
            loaded(truncated(target, 1), "tiny-reference"))


def test_every_batch_size_is_lossless_for_each_drafter_with_the_crossover_beside_the_profile(tiny_models):
    target, draft, reference = tiny_models
    options = BenchOptions(gamma=3, max_new_tokens=12, batch_sizes=(4, 1, 2), profile="cpu-amd-static")
    progress: list[tuple[int, int]] = []
    result = run_batch_sizes(target, draft, PROMPTS, options, reference=reference,
                             progress=lambda done, total: progress.append((done, total)))
    assert [p.batch_size for p in result.points] == [1, 2, 4] and progress[-1] == (3, 3)
    assert result.drafters == {"draftnas": "tiny-draft", "reference": "tiny-reference"}
    for point in result.points:
        for label in result.drafters:
            assert point.exact_match_rate[label] == 1.0  # fp32: each sequence equals the target's own
            assert 1.0 <= point.tokens_per_step[label] <= 4.0
            runs = point.speedup_runs[label]  # one per round (3 by default), each paired in its run
            assert len(runs) == options.rounds
            assert point.speedup[label] == pytest.approx(statistics.median(runs))
            assert point.predicted_speedup[label] > 0
            split = point.time_split[label]  # where the loop's time went: parts of the whole, and the rest
            assert set(split) == {"prefill", "draft", "verify", "read", "bookkeeping", "other"}
            assert sum(split.values()) == pytest.approx(1.0) and split["verify"] > 0 and split["draft"] > 0
            assert 0.0 <= point.idle_row_share[label] < 1.0
            assert point.decode_speedup[label] > 0  # the same runs with the prompts' prefill left out
    for label in result.drafters:
        assert result.measured_crossover[label] == first_below_one(
            [(p.batch_size, p.speedup[label]) for p in result.points])
    assert "cpu-amd-static" in result.profile and result.prompts == ("a", "b", "c")
    assert BatchedBenchResult.from_dict(result.to_dict()) == result


def test_the_first_batch_size_below_one_is_the_crossover():
    assert first_below_one([(8, 0.9), (1, 1.4), (4, 0.95), (2, 1.1)]) == 4
    assert first_below_one([(1, 1.2), (2, 1.0)]) is None


def test_at_a_short_context_the_profile_prices_a_large_batch_below_one():
    """LLaMA-7B with a 2-layer drafter cut from it, 16 tokens of context: at B=1 the verify costs
    about one decode; at B=1024 a verify of 1024 x 5 tokens is bound by compute and the drafts cost
    more than they save. (At long contexts reading the KV cache dominates both, and the verify reads
    it once for gamma + 1 tokens: the spec sheet then keeps speculation above 1.)"""
    _, model = latency_model("h100-sxm", "cpu", "fp16")
    assert model is not None
    target = get_architecture("llama-7b")
    drafter = target.with_shape(num_hidden_layers=2)
    small, large = (predicted_speedup(model, target, drafter, None, b, 4, 3.0, 16) for b in (1, 1024))
    assert small > 1.0 > large
    assert predicted_speedup(model, target, drafter, None, 1024, 4, 3.0, 4096) > 1.0


def test_batch_sizes_refuse_sampling_the_hf_engine_and_bad_values_in_one_line():
    with pytest.raises(InvalidInputError, match="batch_sizes runs greedy decoding only"):
        BenchOptions(batch_sizes=(1, 2), temperature=0.7).validate()
    with pytest.raises(InvalidInputError, match="batch_sizes runs in the static engine"):
        BenchOptions(batch_sizes=(1,), engine="hf").validate()
    with pytest.raises(InvalidInputError, match=r"batch_sizes must be in \[1, 1024\], got 0"):
        BenchOptions(batch_sizes=(0, 2)).validate()
    with pytest.raises(InvalidInputError, match="neither a JSON file nor a shipped profile"):
        latency_model("no-such-profile", "cpu", "fp32")
    with pytest.raises(InvalidInputError, match="is empty"):  # not this host's profile, silently
        latency_model(" ", "cpu", "fp32")
    assert BenchOptions(batch_sizes=(1, 2)).resolved_engine() == "static"


def test_a_stored_calibration_prices_the_batches_and_one_from_another_host_is_refused(tmp_path):
    import dataclasses
    import json

    from draftnas.core.records import CpuIdentity
    from draftnas.latency.batch_records import BatchTiming
    from draftnas.latency.calibration_store import FORMAT, StoredCalibration, host_key
    from draftnas.latency.records import HostCalibration

    target = get_architecture("qwen2.5-coder-1.5b")
    drafter = get_architecture("qwen2.5-coder-0.5b")
    ms = {f"{b}x{n}": 57.0 * max(1.0, b * n / 8) for b in (2, 4, 8) for n in (1, 5)}
    calibration = HostCalibration(
        target=target.name, device_name="here", threads=2, context_tokens=128,
        target_ms={n: 57.0 * max(1.0, n / 8) for n in range(1, 6)}, prefix_ms={1: 5.0, 2: 7.0},
        dtype="bf16", batched=(BatchTiming(arch=target, weights="dense", context_tokens=128, ms=ms),))
    here = StoredCalibration(host=host_key(), request={}, calibration=calibration)
    path = tmp_path / "here.json"
    path.write_text(json.dumps(here.to_dict()))
    label, model = latency_model(str(path), "cpu", "bf16", target)
    assert "batched steps timed at B 2, 4, 8" in label and model is not None
    assert model.predict_ms(target, batch_size=8, new_tokens=5) == pytest.approx(57.0 * 5)
    assert FORMAT == here.format
    other = dataclasses.replace(here, host=dataclasses.replace(host_key(), cpu=CpuIdentity(
        vendor="GenuineIntel", family=6, model=143, isa=("avx2", "avx512f", "amx_tile"))))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(other.to_dict()))
    with pytest.raises(InvalidInputError, match="does not belong to this host"):
        latency_model(str(elsewhere), "cpu", "bf16", target)
    with pytest.raises(InvalidInputError, match="calibrates qwen2.5-coder-1.5b, not this bench's target"):
        latency_model(str(path), "cpu", "bf16", drafter)


def test_each_step_is_measured_beside_what_the_profile_prices_it_at(tiny_models):
    target, draft, _ = tiny_models
    options = BenchOptions(gamma=3, max_new_tokens=10, batch_sizes=(2,), rounds=1, profile="cpu-amd-static")
    (point,) = run_batch_sizes(target, draft, PROMPTS, options).points
    assert set(point.step_ms) == {"target", "draftnas"} and point.step_ms["target"]["decode"] > 0
    assert point.step_ms["draftnas"]["draft"] > 0 and point.step_ms["draftnas"]["verify"] > 0
    assert set(point.priced_ms["draftnas"]) == {"draft", "verify"} and point.priced_ms["target"]["decode"] > 0


def test_the_prediction_waits_for_the_slowest_sequence_and_pays_the_prompts_prefill():
    from draftnas.core.lockstep import lockstep_share
    from draftnas.core.throughput import acceptance_rate_from_tokens_per_step
    from draftnas.latency.files import default_profile
    from draftnas.latency.model import LatencyModel

    model = LatencyModel.from_profile(default_profile("cpu-amd-static", "fp32"))
    target, drafter = get_architecture("qwen2.5-coder-1.5b"), get_architecture("qwen2.5-coder-0.5b")
    steady = predicted_speedup(model, target, drafter, None, 8, 4, 3.0, 128)
    lockstep = predicted_speedup(model, target, drafter, None, 8, 4, 3.0, 128, new_tokens=32)
    assert lockstep < steady  # a batch steps until its slowest sequence is done
    at_one = predicted_speedup(model, target, drafter, None, 1, 4, 3.0, 128, new_tokens=32)
    assert at_one == pytest.approx(predicted_speedup(model, target, drafter, None, 1, 4, 3.0, 128))
    # each prompt read one at a time: by the target alone, and by the target and the drafter in the loop
    with_prompt = predicted_speedup(model, target, drafter, None, 8, 4, 3.0, 128, new_tokens=32,
                                    prompt_tokens=200)
    ms = {(a.name, n, b, c): model.predict_ms(a, batch_size=b, new_tokens=n, context_tokens=c)
          for a in (target, drafter) for n, b, c in ((1, 8, 128), (5, 8, 128), (200, 1, 0))}
    share = lockstep_share(acceptance_rate_from_tokens_per_step(3.0, 4), 4, 32, 8)
    step_ms = 4 * ms[(drafter.name, 1, 8, 128)] + ms[(target.name, 5, 8, 128)]
    steps_s = 8 * 32 / (8 * 3.0 * share) * step_ms / 1e3
    plain_s = 32 * ms[(target.name, 1, 8, 128)] / 1e3
    prefill = ms[(target.name, 200, 1, 0)] / 1e3
    expected = (plain_s + 8 * prefill) / (steps_s + 8 * (prefill + ms[(drafter.name, 200, 1, 0)] / 1e3))
    assert with_prompt == pytest.approx(expected, rel=1e-6)
