"""Resolving what `draftnas search` was asked: the shapes, the space, the latency profile (and
its calibration on this machine), the placement on GPUs, and how acceptance is measured or assumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from transformers import AutoTokenizer

from draftnas.acceptance.records import TraceOptions
from draftnas.acceptance.shipped import copy_shipped
from draftnas.acceptance.traces import same_tokenizer_files, tokenizer_fingerprint
from draftnas.acceptance.tracing import build_traces
from draftnas.core.errors import DraftnasError, InvalidInputError, SearchSpaceError
from draftnas.core.machine import require_device
from draftnas.core.options import option_error
from draftnas.core.prompts import Prompt, load_prompts, subsample
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.drafter.training.curve_fit import load_curves, shipped_curves
from draftnas.drafter.training.distill_records import CurveSet
from draftnas.latency.llama_cpp import EngineModel
from draftnas.models.gguf_file import gguf_of, tokenizer_digest
from draftnas.models.sources import ensure_local_folder, has_weights, resolve_source
from draftnas.search.alpha import load_alpha_model
from draftnas.search.candidate import reference_candidate
from draftnas.search.evaluate import Evaluator, ModelEvaluator, PriorEvaluator, WeightsEvaluator
from draftnas.search.llama_cpp import verdict
from draftnas.search.loop import SearchOptions, run_search
from draftnas.search.predictions import FILE_NAME as PREDICTIONS_FILE
from draftnas.search.predictions import search_predictions, write_predictions
from draftnas.search.pricing import Pricing, pricing
from draftnas.search.records import LatencyPredictor, SearchResult
from draftnas.search.requests import SearchRequest
from draftnas.search.run_options import default_study_name
from draftnas.search.space import SearchSpace
from draftnas.search.space_file import parse_search_space
from draftnas.search.spaces import default_space_for, load_search_space, registry_space

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)


def fingerprint_text(data: Any) -> str:
    """Short stable hash of JSON-able data (for cache file names)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


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
    dtypes), built once on the request's device and cached in the run folder; for an embedded target,
    the ones shipped with draftnas where they fit (`acceptance.shipped`)."""
    w, t = space.workload, space.traces
    prompts = trace_prompts(space)
    key = fingerprint_text([request.target, w.prompt_set, w.domain, t.prompts, t.max_new_tokens,
                            w.temperature] + ([dtype] if dtype != "fp32" else []))
    out = Path(request.study.run_dir).expanduser() / study_name / f"traces-{key}.safetensors"
    if out.is_file():
        return out
    if copy_shipped(resolve_architecture(request.target).name, key, out) is not None:
        log.info("traces of %s: shipped with draftnas for its embedded weights (%s)", request.target, out)
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


@dataclass(frozen=True)
class _Shapes:
    """The request's shapes: its space, target, base and references, checked to draft for the target."""

    space: SearchSpace
    built_note: str | None  # how a space built from the registry was built
    target_arch: Architecture
    base: str
    base_arch: Architecture
    references: tuple[str, ...]


def plan_search(request: SearchRequest, trace_progress: Callable[[int, int], None] | None = None,
                calibration_progress: Callable[[int, int], None] | None = None
                ) -> tuple[SearchOptions, LatencyPredictor, Evaluator]:
    """Resolve the request in named steps: its shapes, what prices drafters here (`search.pricing`), how
    acceptance is read (an α(drafter) model, a stated rate, or measured on the target's traces), and the
    search's options."""
    request.validate()
    curves = _curves(request)  # a bad curves file is said before anything is timed
    _set_threads(request.threads)
    shapes = _shapes(request)
    priced = pricing(request, shapes.space, shapes.target_arch, shapes.base_arch, shapes.references,
                     calibration_progress, curves)
    model = _model_evaluator(request, shapes.space, shapes.base, shapes.base_arch) \
        if request.acceptance_model is not None else None  # acceptance from an α(drafter) model
    options = _options(request, shapes, priced, curves, model[1] if model else None)
    if model is not None:
        return options, priced.predictor, model[0]
    if request.assumed_acceptance is not None:
        return options, priced.predictor, PriorEvaluator(request.assumed_acceptance)
    return options, priced.predictor, _measuring_evaluator(request, options, trace_progress)


def _shapes(request: SearchRequest) -> _Shapes:
    """The space, target, base and references; one line naming every base or reference that cannot draft
    for the target."""
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
    return _Shapes(space, built_note, target_arch, base, base_arch, references)


def _options(request: SearchRequest, shapes: _Shapes, priced: Pricing, curves: CurveSet | None,
             model_label: str | None) -> SearchOptions:
    study = request.study
    if request.target_gguf and study.study_name is None:  # another file's timings: a study of its own
        name = default_study_name(request.target, shapes.space, study.sampler)
        study = replace(study, study_name=f"{name}-{Path(request.target_gguf).stem}")
    note = "; ".join(n for n in (shapes.built_note, priced.note) if n)
    return SearchOptions(
        target=request.target, target_arch=shapes.target_arch, base=shapes.base, base_arch=shapes.base_arch,
        space=shapes.space, profile=priced.profile, study=study, acceptance_prior=request.assumed_acceptance,
        profile_note=note, placement=priced.placement,
        acceptance_model=model_label,
        engine=priced.engine, dtype=priced.dtype, references=shapes.references, device=request.device,
        quant_dtype=priced.quant_dtype, curves=curves, train_tokens=request.train_tokens)


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
    if _same_gguf_tokenizer(spec, target):  # the embedded pairs: no conversion of the target's weights
        return []
    folders = [ensure_local_folder(s)[1] for s in (spec, target)]
    if same_tokenizer_files(*folders):  # the embedded pairs: no tokenizer loaded (6 s a pair on 2 cores)
        return []
    prints = [tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(f))) for f in folders]
    if prints[0] != prints[1]:
        return [f"{role} {spec} has another tokenizer than target {target} (fingerprints {prints[0]} and "
                f"{prints[1]}); a drafter must share the target's tokenizer"]
    return []


def _same_gguf_tokenizer(spec: str, target: str) -> bool:
    """Whether both specs run from GGUF files (embedded or given) whose tokenizer keys are one
    (`tokenizer_digest`): read from their headers, where the folder check would first convert the
    target's weights (1.5 min for the 1.5B on a 2-core Zen 3), which a search on shipped traces need not
    load (the embedded pair's main job, run on that host, loaded none)."""
    try:
        if not all(resolve_source(s).kind in ("embedded", "gguf") for s in (spec, target)):
            return False
    except DraftnasError:  # not a model source (a registry name): the folder check decides
        return False
    return bool(tokenizer_digest(gguf_of(spec)) == tokenizer_digest(gguf_of(target)))


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
           calibration_progress: Callable[[int, int], None] | None = None,
           standings: Callable[[list[str]], None] | None = None) -> SearchResult:
    """`draftnas search`: resolve the request, then run (or resume, or join) the study (`standings`: the
    ranking so far while it runs, `loop.run_search`)."""
    options, predictor, evaluator = plan_search(request, trace_progress, calibration_progress)
    result = run_search(options, predictor, evaluator, progress=progress, standings=standings)
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
