"""Profiling: plans, a tiny real CPU measurement, the CLI's device errors, CUDA paths (skipped here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.registry import Architecture
from draftnas.latency.files import load_profile, save_profile
from draftnas.latency.grid import plan_profile
from draftnas.latency.measure import extrapolate_from_layers, measure_profile
from draftnas.latency.model import LatencyModel
from draftnas.latency.records import ProfileOptions, ProfilePlan
from draftnas.report.profile import depth_width_report, save_report_png


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


needs_cuda = pytest.mark.skipif(not _cuda(), reason="needs a CUDA device")


def _tiny(name: str, layers: int, hidden: int, vocab: int = 512) -> Architecture:
    return Architecture(name=name, family="llama", num_hidden_layers=layers, hidden_size=hidden,
                        intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=hidden // 4, vocab_size=vocab, tie_word_embeddings=True)


def _tiny_plan() -> ProfilePlan:
    shapes = (_tiny("d1", 1, 64), _tiny("d2", 2, 64), _tiny("d4", 4, 64, 1024), _tiny("w32", 2, 32, 256),
              _tiny("w128", 2, 128, 2048), _tiny("d3", 3, 96))
    return ProfilePlan(
        shapes=shapes, heldout=("d3",), conditions=((1, 1, 128), (2, 3, 16), (4, 1, 32)),
        head_points=(("d1", 256, 1), ("d1", 2048, 4)),
        extrapolation_shape=_tiny("ex", 6, 64), extrapolation_layers=(2, 3),
        extrapolation_conditions=((1, 1, 16),),
        series={"depth": ("d1", "d2", "d4"), "width": ("w32", "d2", "w128")},
    )


@pytest.fixture(scope="module")
def tiny_profile():
    ticks: list[tuple[int, int]] = []
    options = ProfileOptions(device="cpu", repeats=3, warmup=1, threads=1)
    prof = measure_profile(options, progress=lambda done, total: ticks.append((done, total)),
                           plan=_tiny_plan())
    return prof, ticks


def test_tiny_cpu_measurement_is_a_valid_profile(tiny_profile, tmp_path):
    prof, ticks = tiny_profile
    assert prof.kind == "measured" and prof.device == "cpu" and prof.dtype == "fp32"
    assert {"torch", "transformers"} <= set(prof.versions)
    models = [m for m in prof.measurements if m.kind == "model" and m.split != "extrapolation"]
    assert len(models) == 6 * 3
    assert all(0 < m.q1_ms <= m.median_ms <= m.q3_ms and m.repeats == 3 for m in prof.measurements)
    assert {m.split for m in models if m.shape == "d3"} == {"heldout"}
    assert prof.heldout_mape is not None and prof.train_mape is not None
    assert prof.extrapolation is not None and prof.extrapolation.full_layers == 6
    assert ticks[-1][0] == ticks[-1][1]  # the progress callback reached its total
    # the saved file passes the schema check and predicts
    again = load_profile(save_profile(prof, tmp_path / "cpu.json"))
    assert LatencyModel.from_profile(again).predict_ms(_tiny("x", 5, 64)) > 0


def test_report_png(tiny_profile, tmp_path):
    prof, _ = tiny_profile
    report = depth_width_report(prof)
    assert [r.layers for r in report.rows if r.series == "depth"] == [1, 2, 4]
    assert all(r.measured_ms is not None for r in report.rows)
    png = save_report_png(report, tmp_path / "r.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cache_context_stays_fixed_between_repeats():
    import torch

    from draftnas.latency.runtime import EagerStep, Runtime

    rt = Runtime(ProfileOptions(threads=1))
    arch = _tiny("t", 2, 32)
    step = EagerStep(rt, rt.build(arch), arch, (2, 3, 20), layers=2)  # transformers' eager mode
    with torch.inference_mode():
        for _ in range(3):
            step()
            assert step.cache.get_seq_length() == 23
            step.reset()
            assert step.cache.get_seq_length() == 20


def test_extrapolate_from_layers_is_fixed_plus_per_layer():
    assert extrapolate_from_layers({2: 5.0, 4: 7.0}, 32) == pytest.approx(3.0 + 32 * 1.0)
    with pytest.raises(InvalidInputError):
        extrapolate_from_layers({2: 5.0}, 32)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plans_cover_draft_and_verify_shapes(device):
    plan = plan_profile(ProfileOptions(device=device, quick=True))
    names = {a.name for a in plan.shapes}
    assert set(plan.heldout) < names and 2 <= len(plan.heldout) <= len(names) // 3
    assert all(set(series) <= names for series in plan.series.values())
    assert (1, 1, 128) in plan.conditions
    assert {n - 1 for _, n, _ in plan.conditions} >= {0, 2, 4, 8}  # draft, gamma 2/4/8 verification
    assert max(b for b, _, _ in plan.conditions) == 64
    assert plan.extrapolation_shape is not None


@pytest.mark.parametrize("kwargs,needle", [
    ({"device": "tpu"}, "device must be"),
    ({"dtype": "fp16"}, "dtype on cpu"),
    ({"mode": "cuda-graph"}, "needs device cuda"),
    ({"repeats": 1}, "repeats"),
])
def test_bad_options(kwargs, needle):
    with pytest.raises(InvalidInputError, match=needle):
        ProfileOptions(**kwargs).validate()


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA")
def test_cli_cuda_without_cuda_is_one_line_exit_2():
    out = subprocess.run([sys.executable, "-m", "draftnas", "profile", "--device", "cuda"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cuda" in lines[0].lower() and "Traceback" not in out.stderr


def test_cli_report_from_shipped_profile(tmp_path):
    from typer.testing import CliRunner

    from draftnas.cli import app
    from draftnas.latency.files import default_profile

    src = save_profile(default_profile("cpu-intel-xeon"), tmp_path / "cpu.json")
    result = CliRunner().invoke(app, ["profile", "--from", str(src), "--report", "--json",
                                      "--report-png", str(tmp_path / "r.png")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["heldout_mape"] is not None and (tmp_path / "r.png").exists()


def test_cli_corrupt_profile_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    out = subprocess.run([sys.executable, "-m", "draftnas", "profile", "--from", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and str(bad) in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_static_mode_on_cpu_times_the_decoder_step():
    options = ProfileOptions(device="cpu", mode="static", repeats=3, warmup=1, threads=1)
    prof = measure_profile(options, plan=_tiny_plan())
    assert prof.mode == "static" and prof.skipped == ()
    assert len([m for m in prof.measurements if m.kind == "model" and m.split != "extrapolation"]) == 18
    assert prof.heldout_mape is not None


def _job(name: str, held: int, transient: int):
    from draftnas.latency.timing import Job

    return Job("model", _tiny(name, 1, 32), 1, (1, 1, 8), 512, "train", lambda m, p: None, held, transient)


def test_plan_chunks_splits_a_model_s_jobs_and_skips_what_cannot_fit_alone():
    from draftnas.latency.timing import Group, plan_chunks

    big = Group(lambda: None, weight_bytes=50,
                 jobs=[_job("a", 20, 10), _job("a", 20, 10), _job("a", 200, 0)])
    small = Group(lambda: None, weight_bytes=10, jobs=[_job("b", 5, 40)])
    chunks, skipped = plan_chunks([big, small], budget_bytes=100)
    # a: 50 weights + 20 + 20 held + 10 transient = 100 fits; its third job needs 250 alone
    assert [[len(jobs) for _, jobs in c.parts] for c in chunks] == [[2], [1]]
    assert chunks[1].parts[0][0] is small
    assert len(skipped) == 1 and skipped[0].needed_bytes == 250 and skipped[0].budget_bytes == 100
    assert "GiB" in skipped[0].reason
    # with room for everything but the giant, one chunk holds both models
    chunks, skipped = plan_chunks([big, small], budget_bytes=200)
    assert len(chunks) == 1 and [len(j) for _, j in chunks[0].parts] == [2, 1] and len(skipped) == 1


def test_a_run_under_a_small_memory_budget_skips_and_records_instead_of_failing(tmp_path):
    plan = _tiny_plan()
    big = _tiny("huge-vocab", 2, 64, vocab=200_000)  # 51 MB of fp32 embedding alone
    plan = ProfilePlan(shapes=(*plan.shapes, big), heldout=plan.heldout, conditions=plan.conditions,
                       head_points=plan.head_points, extrapolation_shape=None, extrapolation_layers=(),
                       extrapolation_conditions=(), series=plan.series)
    options = ProfileOptions(device="cpu", repeats=3, warmup=1, threads=1, memory_budget_bytes=20 << 20)
    ticks: list[tuple[int, int]] = []
    prof = measure_profile(options, plan=plan, progress=lambda d, t: ticks.append((d, t)))
    assert {s.shape for s in prof.skipped} == {"huge-vocab"} and len(prof.skipped) == 3
    assert all(s.needed_bytes > s.budget_bytes == 20 << 20 for s in prof.skipped)
    assert "huge-vocab" not in {m.shape for m in prof.measurements}
    assert ticks[-1][0] == ticks[-1][1]
    again = load_profile(save_profile(prof, tmp_path / "p.json"))
    assert again.skipped == prof.skipped


def test_a_chunk_that_runs_out_of_memory_is_halved_and_a_job_failing_alone_is_skipped():
    from draftnas.latency.runtime import Runtime
    from draftnas.latency.timing import Group, Job, run_round_robin

    class Step:
        def __call__(self):
            return None

        def reset(self):
            return None

    def make_ok(model, pool):
        return Step()

    def make_oom(model, pool):
        raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")

    def job(name, make):
        return Job("model", _tiny(name, 1, 32), 1, (1, 1, 8), 512, "train", make, 10, 1)

    jobs = [job("a", make_ok), job("b", make_oom), job("c", make_ok), job("d", make_ok)]
    rt = Runtime(ProfileOptions(threads=1, repeats=3, warmup=1, memory_budget_bytes=1 << 20))
    ticks = []
    skipped = run_round_robin(rt, [Group(lambda: None, 0, jobs)], lambda: ticks.append(1))
    assert [s.shape for s in skipped] == ["b"] and "out of memory" in skipped[0].reason
    assert [len(j.times_ms) for j in jobs] == [3, 0, 3, 3]

    def make_broken(model, pool):
        raise RuntimeError("not memory: a shape bug")

    with pytest.raises(RuntimeError, match="not memory"):  # other errors are not swallowed
        run_round_robin(rt, [Group(lambda: None, 0, [job("e", make_broken)])], lambda: None)


def test_a_named_groups_builds_and_then_its_timing_are_said_in_that_order(caplog):
    """A log's heartbeat shows the last line said: the build while building, then the timing (it
    named the last build for the minutes its steps were timed)."""
    from draftnas.latency.runtime import Runtime
    from draftnas.latency.timing import Group, Job, run_round_robin

    class Step:
        def __call__(self):
            return None

        def reset(self):
            return None

    jobs = [Job("model", _tiny(n, 1, 32), 1, (1, 1, 8), 512, "train", lambda m, p: Step(), 10, 1)
            for n in "ab"]
    rt = Runtime(ProfileOptions(threads=1, repeats=2, warmup=1))
    with caplog.at_level("INFO", logger="draftnas.latency.timing"):
        run_round_robin(rt, [Group(lambda: None, 0, jobs, name="the tiny model")], lambda: None)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["building the tiny model (random weights) and choosing its products' kernels",
                    "timing 2 steps of the tiny model, round-robin"]


def test_out_of_memory_in_a_static_mode_is_retried_then_skipped_not_raised(monkeypatch):
    """An allocator failure while building a static step (or capturing it, on a GPU: the same
    function) is memory, not a broken capture: the chunk is halved and retried, and each condition
    that fails alone is recorded as skipped (injected here for the width-64 shapes' batch-4 steps)."""
    import draftnas.latency.runtime as runtime

    real = runtime.StaticStep

    def failing(model, cache, input_ids, *args, **kwargs):
        if input_ids.shape[0] >= 4 and model.arch.hidden_size == 64:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, cache, input_ids, *args, **kwargs)

    monkeypatch.setattr(runtime, "StaticStep", failing)
    options = ProfileOptions(device="cpu", mode="static", repeats=3, warmup=1, threads=1)
    prof = measure_profile(options, plan=_tiny_plan())
    assert {(s.shape, s.batch_size) for s in prof.skipped} == {("d1", 4), ("d2", 4), ("d4", 4)}
    assert all("ran out of memory when run alone" in s.reason for s in prof.skipped)
    timed = {(m.shape, m.batch_size) for m in prof.measurements}
    assert {("w32", 4), ("w128", 4), ("d3", 4), ("d1", 1), ("d2", 2)} <= timed


def test_a_memory_budget_must_be_positive():
    with pytest.raises(InvalidInputError, match="memory_budget_bytes must be >= 1"):
        ProfileOptions(memory_budget_bytes=0).validate()


@needs_cuda
@pytest.mark.parametrize("mode", ["eager", "static", "cuda-graph"])
def test_tiny_cuda_measurement(mode):
    options = ProfileOptions(device="cuda", dtype="fp16", mode=mode, repeats=3, warmup=1)
    prof = measure_profile(options, plan=_tiny_plan())
    assert prof.device == "cuda" and prof.mode == mode and prof.heldout_mape is not None
    assert all(m.median_ms > 0 for m in prof.measurements)


def test_report_counts_the_tile_term_as_a_per_parameter_cost_at_one_token():
    from draftnas.latency.model import FIT_TERMS
    from draftnas.latency.records import LatencyProfile

    coefficients = dict.fromkeys(FIT_TERMS, 0.0)
    coefficients.update(layer=0.1, gemm_mb=0.5, gemm_tile_gflop=0.3, ridge_flops_per_byte=2.0, tile_rows=1.0)
    prof = LatencyProfile(schema_version=1, kind="measured", device="cuda", device_name="x", dtype="bf16",
                          versions={}, measurements=(), coefficients=coefficients, heldout_mape=None)
    report = depth_width_report(prof)
    # per million parameters: 0.5 ms/MB x 2 bytes (weights read) + 0.3 ms/GFLOP x 2 FLOPs x 1e6 / 1e9
    assert report.ms_per_million_layer_params == pytest.approx(0.5 * 2 + 0.3 * 2e-3)
    assert report.ms_per_layer_overhead == pytest.approx(0.1)


def test_a_profile_from_another_cpu_or_a_spec_sheet_is_named_as_such():
    import dataclasses

    from draftnas.core.machine import cpu_count, cpu_identity
    from draftnas.core.records import CpuIdentity
    from draftnas.latency.files import default_profile
    from draftnas.latency.host_profile import host_mismatch

    shipped = default_profile("cpu-intel-xeon")
    here = dataclasses.replace(shipped, cpu=cpu_identity(), threads=cpu_count())
    assert host_mismatch(here) is None
    imaginary = CpuIdentity(vendor="Imaginary", isa=("avx2",), name="Imaginary CPU 9000")
    other = dataclasses.replace(here, cpu=imaginary)
    note = host_mismatch(other)
    assert note is not None and "measured on Imaginary CPU 9000" in note and "draftnas profile" in note
    # hosts /proc/cpuinfo names alike ("AMD EPYC") differ by family, model and instruction sets
    same_name = dataclasses.replace(here, cpu=dataclasses.replace(cpu_identity(), family=1, model=1))
    assert host_mismatch(same_name) is not None
    # a profile that records no family or model (measured before draftnas recorded them) is never this
    # CPU's, whatever its name: the Zen 2 profile said "AMD EPYC" and was taken for a Zen 3 host's
    unrecorded = dataclasses.replace(here, cpu=dataclasses.replace(cpu_identity(), family=None, model=None))
    assert host_mismatch(unrecorded) is not None
    assert host_mismatch(dataclasses.replace(here, cpu=None)) is not None
    for name in ("cpu-amd-static", "cpu-intel-xeon"):  # the two shipped without an identity
        assert host_mismatch(dataclasses.replace(default_profile(name), threads=cpu_count())) is not None
    assert "cores" in host_mismatch(dataclasses.replace(here, threads=cpu_count() + 7))
    assert "spec-sheet" in host_mismatch(default_profile("h100-sxm"))
    gpu = dataclasses.replace(here, device="cuda", device_name="NVIDIA H100 80GB HBM3")
    assert host_mismatch(gpu) is None  # judged where a GPU is used


def test_profile_target_extrapolates_k_layers_checks_the_method_and_the_search_uses_it(tmp_path):
    import dataclasses

    from draftnas.core.registry import get_architecture
    from draftnas.latency.corrected import TargetTimedModel
    from draftnas.latency.files import default_profile, load_profile, save_profile
    from draftnas.latency.measure import measure_target
    from draftnas.latency.model import LatencyModel
    from draftnas.search.records import StudySettings
    from draftnas.search.resolve import SearchRequest, plan_search
    from draftnas.search.spaces import default_space_for

    smol = get_architecture("smollm2-135m")
    small = smol.with_shape(num_hidden_layers=6)
    timing = measure_target(ProfileOptions(device="cpu", repeats=3, warmup=1, threads=1), small,
                            layer_counts=(1, 2), max_gamma=1, context_tokens=32)
    assert set(timing.ms) == {"1x1", "1x2"} and timing.timed_layers == (1, 2)
    assert timing.check is not None and timing.check.full_layers == 6  # the whole shape fits: checked on it
    assert len(timing.check.points) == 2 and all(p.full_ms > 0 for p in timing.check.points)
    model = TargetTimedModel(LatencyModel.from_profile(default_profile("cpu-intel-xeon")), [timing])
    assert model.predict_ms(small, context_tokens=32) == timing.ms["1x1"]
    assert model.predict_ms(small, new_tokens=2, context_tokens=32) == timing.ms["1x2"]
    other = smol.with_shape(num_hidden_layers=2)  # any other shape: the fitted model
    xeon = LatencyModel.from_profile(default_profile("cpu-intel-xeon"))
    assert model.predict_ms(other) == xeon.predict_ms(other)
    with pytest.raises(InvalidInputError, match="at least two different layer counts"):
        measure_target(ProfileOptions(), small, layer_counts=(2,))
    with pytest.raises(InvalidInputError, match="not fewer than"):
        measure_target(ProfileOptions(), small, layer_counts=(2, 6))
    with pytest.raises(InvalidInputError, match="CUDA only"):
        measure_target(ProfileOptions(), small, gpus=2)

    # a profile carrying a timing of the search's target: the search prices the target with it
    full = dataclasses.replace(timing, target=smol.name, arch=smol,
                               ms={"1x1": 111.0, **{f"1x{n}": 100.0 + n for n in range(2, 10)}},
                               context_tokens=default_space_for("smollm2-135m").workload.context_tokens)
    path = save_profile(dataclasses.replace(default_profile("cpu-intel-xeon"), targets={smol.name: full}),
                        tmp_path / "p.json")
    assert load_profile(path).targets[smol.name].ms["1x1"] == 111.0
    request = SearchRequest(target="smollm2-135m", profile=str(path), calibrate=False, acceptance_prior=0.5,
                            study=StudySettings(run_dir=str(tmp_path)))
    options, predictor, _ = plan_search(request)
    ctx = options.space.workload.context_tokens
    assert predictor.predict_ms(smol, context_tokens=ctx) == 111.0
    assert "priced from its first 1/2 layers" in (options.profile_note or "")
    assert options.engine is None  # not calibrated: priced as the profile was timed
    # vLLM prices drafters of the base's full width; this space prunes widths, so it is refused in one line
    with pytest.raises(InvalidInputError,
                       match="engine vllm with search space 'smollm2-135m': the space prunes widths"):
        plan_search(dataclasses.replace(request, engine="vllm"))


def test_a_search_calibrated_from_a_borrowed_profile_names_it_and_whose_it_is(monkeypatch, tmp_path):
    """The calibration corrects the main terms, but the search's note says which profile it started from
    and, when that profile is another CPU's (or records no CPU), that it is."""
    import draftnas.search.pricing as pricing
    from draftnas.latency.model import LatencyModel
    from draftnas.search.records import StudySettings
    from draftnas.search.resolve import SearchRequest, plan_search

    def fake_calibration(profile, *args, **kwargs):  # the timing itself is tested elsewhere
        return LatencyModel.from_profile(profile), "calibrated on this machine (stand-in)", "fp32"

    monkeypatch.setattr(pricing, "calibrated_predictor", fake_calibration)
    request = SearchRequest(target="smollm2-135m", profile="cpu-amd-static", acceptance_prior=0.5,
                            study=StudySettings(run_dir=str(tmp_path)))
    options, _, _ = plan_search(request)
    note = options.profile_note or ""
    assert note.startswith("calibrated on this machine")
    assert "started from the profile cpu-amd-static (AMD EPYC" in note
    assert "the latency profile was measured on AMD EPYC" in note  # not this CPU's, said so
