"""`draftnas profile` as one call: measure this device's decoder shapes, load a profile, add a
target's real shape to one, or time a GGUF in llama.cpp's llama-bench (`ProfileRequest` says which)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from draftnas.core.engine_kinds import LLAMA_CPP
from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Progress, write_json_file
from draftnas.core.registry import get_architecture, resolve_architecture
from draftnas.latency.files import default_profile, load_profile, save_profile
from draftnas.latency.host_profile import host_cpu_profile
from draftnas.latency.records import ProfileOutcome, ProfileRequest


def profile_from_request(request: ProfileRequest, *, progress: Progress | None = None,
                         command: str | None = None) -> ProfileOutcome:
    """Do what the request asks (see the module docstring) and write its file; `command`: the command
    line recorded in a measured profile."""
    request = request.validate()
    if request.engine == LLAMA_CPP:
        return _llama_cpp(request, progress)
    if request.target is not None:
        return _add_target(request, progress)
    if request.from_file is not None:
        return ProfileOutcome(path=request.from_file, profile=load_profile(request.from_file))
    from draftnas.latency.measure import measure_profile

    options = request.options.validate()
    profile = measure_profile(options, progress=progress)
    if command is not None:
        profile = dataclasses.replace(profile, command=command)
    path = request.out or (f"draftnas-profile-{options.device}-{options.resolved_dtype()}"
                           f"{'' if options.mode == 'eager' else '-' + options.mode}.json")
    save_profile(profile, path)
    return ProfileOutcome(path=str(path), profile=profile)


def _add_target(request: ProfileRequest, progress: Progress | None) -> ProfileOutcome:
    """The target's first layers timed, extrapolated to its depth and merged into the profile."""
    from draftnas.latency.measure import measure_target

    assert request.target is not None
    arch = resolve_architecture(request.target)
    asked = request.options
    base = (load_profile(request.from_file) if request.from_file is not None
            else default_profile(host_cpu_profile() if asked.device == "cpu" else asked.device))
    options = dataclasses.replace(asked, dtype=asked.dtype or base.dtype).validate()
    if base.device != asked.device or base.dtype != options.resolved_dtype():
        raise InvalidInputError(f"the profile is {base.device} {base.dtype}; time the target on the same "
                                f"device and dtype ({base.device}, {base.dtype}) or start from another "
                                "profile")
    timing = measure_target(options, arch, layer_counts=list(request.layers),
                            batch_sizes=list(request.batch_sizes),
                            max_gamma=request.max_gamma, context_tokens=request.context, gpus=request.tp,
                            progress=progress)
    key = arch.name if request.tp == 1 else f"{arch.name}/tp{request.tp}"
    profile = dataclasses.replace(base, targets={**base.targets, key: timing})
    path = request.out or f"draftnas-profile-{asked.device}-{base.dtype}-{arch.name}.json"
    save_profile(profile, path)
    return ProfileOutcome(path=str(path), profile=profile, target=arch.name,
                          next_command=f"draftnas search --target {arch.name} --profile {path}")


def _llama_cpp(request: ProfileRequest, progress: Progress | None) -> ProfileOutcome:
    """The GGUF (and random drafters of the base per quant type) timed by llama-bench."""
    from draftnas.core.machine import cpu_count
    from draftnas.latency.llama_cpp import calibrate_llama_cpp, probe_flags
    from draftnas.models.ggml_quants import WRITTEN
    from draftnas.models.llama_cpp import find_llama_cpp

    assert request.model is not None
    model = Path(request.model)
    if not model.is_file():
        raise InvalidInputError(f"the GGUF file {model} does not exist")
    if unknown := [q for q in request.quants if q not in WRITTEN]:
        raise InvalidInputError(f"quant types {', '.join(unknown)}: random drafters are written in "
                                f"{', '.join(WRITTEN)}")
    arch = get_architecture(request.base) if request.base else None
    threads = cpu_count()
    llama = probe_flags(find_llama_cpp(request.llama_cpp), model, threads)
    calibration = calibrate_llama_cpp(llama, model, arch or get_architecture("qwen2.5-coder-0.5b"),
                                      list(request.quants) if arch else [], request.context,
                                      max(request.max_gamma + 1, 8), {}, threads, progress)
    path = request.out or f"draftnas-profile-llama-cpp-{model.stem}.json"
    write_json_file(path, calibration.to_dict())
    return ProfileOutcome(path=str(path), calibration=calibration)
