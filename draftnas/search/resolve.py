"""Resolving what `draftnas search` was asked: the shapes, the space, the latency profile (and
its calibration on this machine), the placement on GPUs, and how acceptance is measured or assumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from transformers import AutoTokenizer

from draftnas.acceptance.records import TraceOptions
from draftnas.acceptance.traces import same_tokenizer_files, tokenizer_fingerprint
from draftnas.acceptance.tracing import build_traces
from draftnas.core.engines import LLAMA_CPP
from draftnas.core.errors import InvalidInputError, SearchSpaceError
from draftnas.core.machine import cpu_has_native_bf16, cpu_identity, require_device
from draftnas.core.options import option_error
from draftnas.core.placement import Placement, place
from draftnas.core.prompts import Prompt, load_prompts, subsample
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.drafter.curve_fit import load_curves, shipped_curves
from draftnas.drafter.distill_records import CurveSet
from draftnas.latency.batched import check_batch_fits
from draftnas.latency.calibrate import calibrates, host_cpu_profile, host_mismatch
from draftnas.latency.corrected import CalibratedModel, TargetTimedModel
from draftnas.latency.files import SHIPPED_PROFILES, default_profile, load_profile
from draftnas.latency.hardware import SPEC_SHEETS, spec_sheet_profile
from draftnas.latency.llama_cpp import EngineModel
from draftnas.latency.model import LatencyModel
from draftnas.models.records import GGUF_WEIGHTS, weights_problem
from draftnas.models.sources import ensure_local_folder, has_weights
from draftnas.search.alpha import load_alpha_model
from draftnas.search.calibration import calibrated_predictor
from draftnas.search.candidate import reference_candidate
from draftnas.search.engine import llama_cpp_model, verdict
from draftnas.search.evaluate import Evaluator, ModelEvaluator, PriorEvaluator, WeightsEvaluator
from draftnas.search.loop import SearchOptions, run_search
from draftnas.search.predictions import FILE_NAME as PREDICTIONS_FILE
from draftnas.search.predictions import search_predictions, write_predictions
from draftnas.search.records import LatencyPredictor, SearchResult, default_study_name
from draftnas.search.requests import SearchRequest
from draftnas.search.space import SearchSpace
from draftnas.search.space_file import parse_search_space
from draftnas.search.spaces import default_space_for, load_search_space, registry_space

if TYPE_CHECKING:
    from draftnas.latency.records import LatencyProfile


log = logging.getLogger(__name__)


def fingerprint_text(data: Any) -> str:
    """Short stable hash of JSON-able data (for cache file names)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


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


def trace_prompts(space: SearchSpace) -> list[Prompt]:
    """The workload's prompts the search traces: `traces.prompts` of its set, spread evenly over its
    domains (every domain of a mixed set gets its share)."""
    w, t = space.workload, space.traces
    prompts = [p for p in load_prompts(w.prompt_set) if w.domain is None or p.domain == w.domain]
    domains = sorted({p.domain for p in prompts})
    if len(domains) < 2:
        return prompts[:t.prompts]
    share = -(-t.prompts // len(domains))
    return subsample(prompts, share)[:t.prompts]


def default_traces(request: SearchRequest, space: SearchSpace, study_name: str,
                   progress: Callable[[int, int], None] | None = None, dtype: str = "fp32") -> Path:
    """Traces of the target over the space's prompt set, in `dtype` (greedy tokens differ between
    dtypes), built once on the request's device and cached in the run folder."""
    w, t = space.workload, space.traces
    prompts = trace_prompts(space)
    key = fingerprint_text([request.target, w.prompt_set, w.domain, t.prompts, t.max_new_tokens,
                            w.temperature] + ([dtype] if dtype != "fp32" else []))
    out = Path(request.study.run_dir).expanduser() / study_name / f"traces-{key}.safetensors"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    options = TraceOptions(max_new_tokens=t.max_new_tokens, temperatures=(w.temperature,),
                           batch_size=min(len(prompts), 16), shard_size=min(len(prompts), 16), dtype=dtype,
                           device=request.device)
    log.info("building traces of %s over %d %s prompts into %s", request.target, len(prompts),
             w.prompt_set, out)
    return build_traces(request.target, prompts, options, out, prompt_set=w.prompt_set, progress=progress)


def _curves(request: SearchRequest) -> CurveSet | None:
    """The request's training curves, checked to be of its target; without --curves, those shipped for
    an embedded target (acceptance after training does not depend on the host; latency is priced here)."""
    if request.curves is None:
        shipped = shipped_curves(resolve_architecture(request.target).name)
        if shipped is None and request.train_tokens is not None:
            raise option_error("train_tokens", "prices trained shapes: give their {curves} file "
                                               f"(draftnas ships none for {request.target})")
        return shipped
    curves = load_curves(request.curves)
    if resolve_architecture(curves.target).name != resolve_architecture(request.target).name:
        raise option_error("curves",
                           f"{request.curves} holds curves of {curves.target}'s drafters; this search's "
                                     f"target is {request.target}")
    return curves


def plan_search(request: SearchRequest, trace_progress: Callable[[int, int], None] | None = None,
                calibration_progress: Callable[[int, int], None] | None = None
                ) -> tuple[SearchOptions, LatencyPredictor, Evaluator]:
    """Resolve the request: shapes, space, profile, and measured or assumed acceptance."""

    request.validate()
    curves = _curves(request)  # a bad curves file is said before anything is timed
    _set_threads(request.threads)
    space, built_note = _space(request)
    require_device(request.device)
    target_arch = resolve_architecture(request.target)
    base = request.base_shape or request.base or space.base
    base_arch = resolve_architecture(base)
    references = tuple(dict.fromkeys((*space.references, *request.references)))
    problems = space.problems_for_base(base_arch)
    for role, spec in (("base", base), *(("reference", r) for r in references)):
        problems += _tokenizer_problems(role, spec, request.target, target_arch)
    if problems:
        raise InvalidInputError("; ".join(problems))
    profile, latency_profile = resolve_profile(request.profile, space, request.dtype, request.engine,
                                               calibrating=request.calibrate, device=request.device)
    _check_dtype(request.dtype, latency_profile.device)
    device, priced_dtype = latency_profile.device, request.dtype or latency_profile.dtype
    unavailable = [p for w in space.weights if (p := weights_problem(w, device, priced_dtype))]
    if unavailable:
        raise InvalidInputError(f"search space {space.name!r}, priced on {latency_profile.device} (profile "
                                f"{profile}): {unavailable[0]}")
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
    placement = _placement(request, latency_profile, target_arch, space)
    engine, dtype = None, request.dtype or latency_profile.dtype
    if request.engine == LLAMA_CPP:
        engine, dtype = LLAMA_CPP, request.dtype or "fp32"  # acceptance: fp32 over the GGUF-rounded weights
        predictor, profile_note = llama_cpp_model(
            request.target, target_arch, base_arch, space, references, request.llama_cpp, request.threads,
            calibration_progress, request.target_gguf)
        profile = f"llama.cpp ({predictor.calibration.version}, this host)"
    elif [w for w in space.weights if w in GGUF_WEIGHTS]:
        raise InvalidInputError(f"search space {space.name!r} offers GGUF weights "
                                f"({', '.join(space.weights)}); "
                                "those drafters run in llama.cpp: pass --engine llama.cpp")
    elif request.calibrate and latency_profile.device == request.device and calibrates(latency_profile):
        engine = request.engine
        stacks = [base_arch, *(resolve_architecture(r) for r in references if has_weights(r))]
        predictor, profile_note, dtype = calibrated_predictor(
            latency_profile, target_arch, space, calibration_progress, engine=engine, dtype=request.dtype,
            stacks=stacks, given=Path(request.calibration).expanduser() if request.calibration else None,
            quant_stacks=[base_arch])
        borrowed = host_mismatch(latency_profile)
        profile_note += f"; started from the profile {profile}" + (f": {borrowed}" if borrowed else "")
    quant_dtype = None
    if isinstance(predictor, CalibratedModel) and predictor.calibration.quant_dtype not in ("", dtype):
        quant_dtype = predictor.calibration.quant_dtype  # quantized drafters beside an fp32 target: bf16
    evaluator: Evaluator
    model_label = None
    if request.acceptance_model is not None:
        evaluator, model_label = _model_evaluator(request, space, base, base_arch)
    study = request.study
    if request.target_gguf and study.study_name is None:  # another file's timings: a study of its own
        study = replace(study, study_name=f"{default_study_name(request.target, space, study.sampler)}-"
                                          f"{Path(request.target_gguf).stem}")
    if built_note:
        profile_note = f"{built_note}; {profile_note}" if profile_note else built_note
    options = SearchOptions(
        target=request.target, target_arch=target_arch, base=base, base_arch=base_arch, space=space,
        profile=profile, study=study, acceptance_prior=request.assumed_acceptance,
        profile_note=profile_note, placement=placement, acceptance_model=model_label, engine=engine,
        dtype=dtype, references=references, device=request.device, quant_dtype=quant_dtype, curves=curves,
        train_tokens=request.train_tokens)
    if request.acceptance_model is not None:
        return options, predictor, evaluator
    if request.assumed_acceptance is not None:
        return options, predictor, PriorEvaluator(request.assumed_acceptance)
    return options, predictor, _measuring_evaluator(request, options, trace_progress)


def _space(request: SearchRequest) -> tuple[SearchSpace, str | None]:
    """The request's space (`_named_space`), its workload at `request.batch` where one is given."""
    space, note = _named_space(request)
    if request.batch is None:
        return space, note
    workload = replace(space.workload, batch_sizes=(request.batch,), batch_weights=(1.0,))
    # its own study: trials priced at another batch are not this one's
    return replace(space, workload=workload, name=f"{space.name}-batch{request.batch}"), note


def _named_space(request: SearchRequest) -> tuple[SearchSpace, str | None]:
    """The request's space: given, named, the target's shipped one, or (none shipped, a base shape
    given) the default one built from the registry, written as YAML into the run folder to edit."""
    if isinstance(request.space, SearchSpace):
        return request.space, None
    if request.space:
        return load_search_space(request.space), None
    try:
        return default_space_for(request.target, request.engine), None
    except SearchSpaceError:
        if request.base_shape is None:
            raise
    data = registry_space(request.target, request.base_shape)
    space = parse_search_space(data, source="the registry")
    name = request.study.study_name or default_study_name(request.target, space, request.study.sampler)
    path = Path(request.study.run_dir).expanduser() / name / "space.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return space, (f"no shipped space targets {request.target}: the default one was built from the registry "
                   f"({space.name}) and written to {path}; edit it and pass it as the space")


def _set_threads(threads: int | None) -> None:
    """torch's CPU threads for the search (each figure records the count it ran with)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


def _check_dtype(dtype: str | None, device: str) -> None:
    """Refuse in one line a dtype the device has no kernels for (bf16 on a CPU without native bf16)."""
    if dtype == "bf16" and device == "cpu" and not cpu_has_native_bf16():
        raise option_error("dtype", f"bf16: this CPU ({cpu_identity().label()}) has no native bf16 "
                                    "instructions (avx512_bf16 or amx_bf16), so bf16 would run emulated and "
                                    "slower than fp32; use fp32")


def _tokenizer_problems(role: str, spec: str, target: str, target_arch: Architecture) -> list[str]:
    """Why a base or reference cannot draft for the target: another vocabulary, or (both with weights
    here) another tokenizer. One family's embeddings padded to different sizes (Qwen2.5's 151,936 and
    152,064 rows over one tokenizer) count as one vocabulary."""
    arch = resolve_architecture(spec)
    padded = (arch.family == target_arch.family
              and abs(arch.vocab_size - target_arch.vocab_size) <= 0.01 * target_arch.vocab_size)
    if arch.vocab_size != target_arch.vocab_size and not padded:
        return [f"{role} {spec} reads {arch.vocab_size} token ids but target {target} "
                f"{target_arch.vocab_size}; a drafter must share the target's tokenizer"]
    if not (has_weights(spec) and has_weights(target)) or spec == target:
        return []
    folders = [ensure_local_folder(s)[1] for s in (spec, target)]
    if same_tokenizer_files(*folders):  # the embedded pairs: no tokenizer loaded (6 s a pair on 2 cores)
        return []
    prints = [tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(f))) for f in folders]
    if prints[0] != prints[1]:
        return [f"{role} {spec} has another tokenizer than target {target} (fingerprints {prints[0]} and "
                f"{prints[1]}); a drafter must share the target's tokenizer"]
    return []


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


def _model_evaluator(request: SearchRequest, space: SearchSpace, base: str,
                     base_arch: Architecture) -> tuple[Evaluator, str]:
    """The alpha(drafter) model's evaluator and its label; healing as the space's budget, or (a
    latency-only space heals nothing) the largest budget the model was fitted on."""

    assert request.acceptance_model is not None
    path = Path(request.acceptance_model).expanduser()
    model = load_alpha_model(path)
    heal = space.heal.steps or round(math.expm1(model.ranges["log1p_heal_steps"][1]))
    anchor = None
    label = model.label() + f" ({path.name} {fingerprint_text(path.read_text())}, at {heal} heal steps)"
    if request.acceptance_anchor is not None:
        if not space.references:
            raise option_error("acceptance_anchor", "sets the alpha of the space's first reference drafter; "
                                                    f"search space {space.name!r} lists none (`references:`)")
        anchor = (reference_candidate(space.references[0], base, base_arch), request.acceptance_anchor)
        label += f"; level ASSUMED: alpha {request.acceptance_anchor:g} for {space.references[0]}"
    return ModelEvaluator(model, base_arch, heal, space.workload.domain, anchor), label


def _measuring_evaluator(request: SearchRequest, options: SearchOptions,
                         trace_progress: Callable[[int, int], None] | None) -> Evaluator:
    space = options.space
    if space.latency_only:
        raise option_error("acceptance_prior", f"must be given for search space {space.name!r}: it is "
                                               "latency-only (it prunes the hidden size); e.g. 0.7 searches "
                                               "it with an assumed acceptance")
    missing = []
    if request.base_shape or not has_weights(options.base):
        missing.append(f"base weights ({{base}} FOLDER; {options.base!r} has none here)")
    if request.traces is None and not has_weights(request.target):
        missing.append(f"target traces ({{traces}} FILE from `draftnas trace`; {request.target!r} has no "
                       "weights here to build them)")
    if missing:
        raise option_error("acceptance_prior", "is needed: measuring acceptance needs "
                           + " and ".join(missing) + "; or give a number to search on latency with an "
                           "assumed acceptance")
    name = options.study_name
    traces = (Path(request.traces) if request.traces
              else default_traces(request, space, name, trace_progress, dtype=options.dtype))
    if not traces.is_file():
        raise option_error("traces", f"{traces} is not a file")
    return WeightsEvaluator(options.base, options.base_arch, traces, space, seed=request.study.seed or 0,
                            dtype=options.dtype, device=options.device, quant_dtype=options.quant_dtype,
                            heals=request.study.heal_budget_s is not None)


def search(request: SearchRequest, *, progress: Callable[[int, int], None] | None = None,
           trace_progress: Callable[[int, int], None] | None = None,
           calibration_progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """`draftnas search`: resolve the request, then run (or resume, or join) the study."""
    options, predictor, evaluator = plan_search(request, trace_progress, calibration_progress)
    result = run_search(options, predictor, evaluator, progress=progress)
    if result.best is None or result.interrupted:
        return result
    if isinstance(predictor, EngineModel):  # llama.cpp: whether any drafter can pay there, from its steps
        ref = result.references[0] if result.references else None
        said = verdict(predictor, options.space, ref.reference or "" if ref else "",
                       ref.throughput.speedup if ref else None, result.best.throughput.speedup,
                       result.best.candidate.name)
        result = replace(result, verdict=said.to_dict())
    path = write_predictions(Path(result.run_dir) / PREDICTIONS_FILE,
                             search_predictions(result, predictor, options))
    return replace(result, predictions_file=str(path))
