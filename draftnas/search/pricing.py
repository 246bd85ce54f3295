"""What prices drafters for a search on this machine (`pricing`): the latency profile named or this
host's (`resolve_profile`), checked for the dtype and the space's weight formats, then the model that
prices them: the profile alone (a target timed by its first layers extrapolated), this host's
calibration of the loop's engine, or llama.cpp's own timings; and where the target runs on GPUs
(`Placement`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftnas.core.engine_kinds import LLAMA_CPP, VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_has_native_bf16, cpu_identity
from draftnas.core.options import option_error
from draftnas.core.placement import Placement, place
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.latency.batched import check_batch_fits
from draftnas.latency.corrected import CalibratedModel, TargetTimedModel
from draftnas.latency.files import SHIPPED_PROFILES, default_profile, load_profile
from draftnas.latency.hardware import SPEC_SHEETS, spec_sheet_profile
from draftnas.latency.host_profile import calibrates, host_cpu_profile, host_mismatch
from draftnas.latency.model import LatencyModel
from draftnas.models.records import GGUF_WEIGHTS, weights_problem
from draftnas.models.sources import has_weights
from draftnas.search.calibration import calibrated_predictor
from draftnas.search.llama_cpp import llama_cpp_model
from draftnas.search.records import LatencyPredictor
from draftnas.search.requests import SearchRequest
from draftnas.search.space import SearchSpace

if TYPE_CHECKING:
    from draftnas.drafter.training.distill_records import CurveSet
    from draftnas.latency.records import LatencyProfile


@dataclass(frozen=True)
class Pricing:
    """What prices the search's drafters: the predictor, the profile it started from, what was measured
    against what that profile said, where the target runs, and the engine and dtypes the prices are for."""

    predictor: LatencyPredictor
    profile: str
    note: str
    placement: Placement | None
    engine: str | None  # None: the profile's prices alone, no engine timed here
    dtype: str
    quant_dtype: str | None  # quantized drafters' activations where not the target's dtype


def pricing(request: SearchRequest, space: SearchSpace, target_arch: Architecture, base_arch: Architecture,
            references: tuple[str, ...], progress: Callable[[int, int], None] | None = None,
            curves: CurveSet | None = None) -> Pricing:
    """The profile, checked; then the model that prices drafters (see the module docstring); `curves`: the
    trained shapes the search prices (vLLM times the first head among them)."""
    profile, latency_profile = resolve_profile(request.profile, space, request.dtype, request.engine,
                                               calibrating=request.calibrate, device=request.device)
    _check_dtype(request.dtype, latency_profile.device)
    device, priced_dtype = latency_profile.device, request.dtype or latency_profile.dtype
    unavailable = [p for w in space.weights if (p := weights_problem(w, device, priced_dtype))]
    if unavailable:
        raise InvalidInputError(f"search space {space.name!r}, priced on {latency_profile.device} (profile "
                                f"{profile}): {unavailable[0]}")
    predictor, note = _profile_model(latency_profile, target_arch)
    placement = _placement(request, latency_profile, target_arch, space)
    engine, dtype = None, request.dtype or latency_profile.dtype
    if request.engine == LLAMA_CPP:
        engine, dtype = LLAMA_CPP, request.dtype or "fp32"  # acceptance: fp32 over the GGUF-rounded weights
        engine_model, note = llama_cpp_model(
            request.target, target_arch, base_arch, space, references, request.llama_cpp, request.threads,
            progress, request.target_gguf)
        predictor, profile = engine_model, f"llama.cpp ({engine_model.calibration.version}, this host)"
    elif request.engine == VLLM:
        from draftnas.search.vllm import vllm_model

        engine, dtype = VLLM, request.dtype or "fp32"  # vLLM's CPU build runs the drafters fp32 here
        served, note = vllm_model(request.target, target_arch, request.base or space.base, base_arch, space,
                                  request.threads, progress, curves)
        predictor, profile = served, f"vLLM ({served.calibration.version}, this host)"
    elif [w for w in space.weights if w in GGUF_WEIGHTS]:
        raise option_error("engine", f"is {request.engine}, but search space {space.name!r} offers GGUF "
                                     f"weights ({', '.join(space.weights)}), which run in llama.cpp only: "
                                     "give llama.cpp")
    elif request.calibrate and latency_profile.device == request.device and calibrates(latency_profile):
        engine = request.engine
        stacks = [base_arch, *(resolve_architecture(r) for r in references if has_weights(r))]
        predictor, note, dtype = calibrated_predictor(
            latency_profile, target_arch, space, progress, engine=engine, dtype=request.dtype,
            stacks=stacks, given=Path(request.calibration).expanduser() if request.calibration else None,
            quant_stacks=[base_arch])
        borrowed = host_mismatch(latency_profile)
        note += f"; started from the profile {profile}" + (f": {borrowed}" if borrowed else "")
    quant_dtype = None
    if isinstance(predictor, CalibratedModel) and predictor.calibration.quant_dtype not in ("", dtype):
        quant_dtype = predictor.calibration.quant_dtype  # quantized drafters beside an fp32 target: bf16
    return Pricing(predictor, profile, note, placement, engine, dtype, quant_dtype)


def _profile_model(profile: LatencyProfile, target_arch: Architecture) -> tuple[LatencyPredictor, str]:
    """The profile's own prices (a target it timed by its first layers, extrapolated to full depth), and
    the note saying whose host it was measured on where not this one."""
    predictor: LatencyPredictor = LatencyModel.from_profile(profile)
    note = host_mismatch(profile) or ""
    timed = [t for t in profile.targets.values() if t.target == target_arch.name]
    if not timed:
        return predictor, note
    checks = [f"{t.check.mean_abs_error_pct:.1f}% mean error on {t.check.shape}" for t in timed if t.check]
    layers = "/".join(map(str, timed[0].timed_layers))
    checked = ", ".join(checks) or "method not checked here"
    extrapolated = (f"{target_arch.name} priced from its first {layers} layers timed on "
                    f"{timed[0].device_name} and extrapolated to full depth ({checked})")
    return TargetTimedModel(predictor, timed), f"{note}; {extrapolated}" if note else extrapolated


def resolve_profile(spec: str | None, space: SearchSpace, dtype: str | None = None,
                    engine: str = "static", calibrating: bool = False,
                    device: str = "cpu") -> tuple[str, LatencyProfile]:
    """A label naming the profile (file, device, kind) and the profile. `dtype`: a shipped spec-sheet
    profile is re-derived for it; a measured profile must have been measured in it. The name
    "cpu" (the spaces' default) is the shipped CPU profile measured on this host, when one is, else
    this CPU's roofline prior (`host_cpu_profile`, for the loop `engine` and `dtype`). `calibrating`: a
    CPU profile, or a measured profile of `device` (the one the calibration times), in another dtype is
    a prior the calibration corrects in `dtype`, not an error."""

    name = spec or space.profile or "cpu"
    if name == "cpu":
        name = host_cpu_profile(engine, dtype)
    path = Path(name).expanduser()
    profile = (load_profile(path) if path.suffix == ".json" or path.is_file()
               else default_profile(name, dtype=dtype or "fp32"))
    corrected = calibrating and profile.device == device and calibrates(profile)
    if dtype is not None and dtype != profile.dtype and not corrected:
        if profile.kind == "spec-sheet" and name.lower() in SPEC_SHEETS and name.lower() in SHIPPED_PROFILES:
            profile = spec_sheet_profile(name.lower(), dtype)
        else:
            raise option_error("dtype", f"{dtype}: the profile {name} was measured in {profile.dtype}; "
                                        f"measure one in {dtype} (`draftnas profile --dtype {dtype}`)")
    return f"{name} ({profile.device_name}, {profile.kind}, {profile.dtype})", profile


def _check_dtype(dtype: str | None, device: str) -> None:
    """Refuse in one line a dtype the device has no kernels for (bf16 on a CPU without native bf16)."""
    if dtype == "bf16" and device == "cpu" and not cpu_has_native_bf16():
        raise option_error("dtype", f"bf16: this CPU ({cpu_identity().label()}) has no native bf16 "
                                    "instructions (avx512_bf16 or amx_bf16), so bf16 would run emulated and "
                                    "slower than fp32; use fp32")


def _placement(request: SearchRequest, profile: LatencyProfile, target: Architecture,
               space: SearchSpace) -> Placement | None:
    """Where the target runs: GPU profiles that carry their hardware; None on a CPU profile."""

    w = space.workload
    if profile.hardware is None or profile.device != "cuda":
        if request.gpus not in (None, 1):
            raise option_error("gpus", f"applies to GPU profiles with hardware figures; the profile "
                                       f"{profile.device_name} ({profile.device}) has none")
        if request.batch is not None and profile.device == "cpu":
            check_batch_fits(target, request.dtype or profile.dtype, request.batch,
                             w.context_tokens + w.prompt_tokens + space.gamma.max + 1)
        return None

    hardware = profile.hardware

    def at(batches: tuple[int, ...]) -> Placement:
        return place(target, hardware, profile.dtype, batch_sizes=batches,
                     context_tokens=w.context_tokens, max_gamma=space.gamma.max, gpus=request.gpus,
                     draft_tp=request.draft_tp, margin=request.memory_margin)

    if request.batch is None:
        return at(w.batch_sizes)
    single = at((1,))  # the target alone at batch 1 says its own line where even that does not fit
    try:
        placement: Placement | None = at(w.batch_sizes)
    except InvalidInputError:  # the batch's activations alone overflow every degree
        placement = None
    if placement is None or request.batch > placement.max_batch:
        raise option_error("batch", f"of {request.batch} sequences does not fit: {single.summary()}")
    return placement
