"""`draftnas export`: a study trial or a plan file -> the drafter built from the base, healed,
re-priced on the study's scored traces, written as a folder (and pushed).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.acceptance.traces import load_traces, split_traces
from draftnas.core.errors import ExportError
from draftnas.core.machine import require_device
from draftnas.core.options import option_error
from draftnas.core.records import Progress
from draftnas.drafter.build import build_drafter
from draftnas.drafter.heal.heal_records import HealOptions, prompt_key
from draftnas.drafter.records import PruningPlan, load_plan
from draftnas.export.card import searched_tokens
from draftnas.export.folder import check_destination, export_drafter
from draftnas.export.gguf import check_gguf_export, export_gguf
from draftnas.export.hub import push_to_hub
from draftnas.export.records import (
    DEFAULT_EXPORT_HEAL_STEPS,
    DEFAULT_GAMMA,
    EXPORT_TEACHER_TOPK,
    EXPORT_WRITTEN_PROMPTS,
    MIN_GAMMA,
    BestExport,
    ExportInfo,
    ExportRequest,
    ExportResult,
    drafter_name,
)
from draftnas.models.records import GGUF_WEIGHTS, TORCH_DTYPES, quantized
from draftnas.models.sources import load_model
from draftnas.search.records import RankedTrial, SearchResult, StudyInfo, WorkloadPrediction
from draftnas.search.scoring import measured_acceptance, predict_workload
from draftnas.search.storage import load_trial

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Source:
    """Where an export's plan came from: a study trial (with what the study was made for) or a file."""

    plan: PruningPlan
    label: str
    trial: RankedTrial | None = None
    info: StudyInfo | None = None


def _resolve_plan(request: ExportRequest) -> _Source:
    if request.plan_file is not None:
        return _Source(plan=load_plan(request.plan_file), label=f"plan {request.plan_file}")

    study = str(request.study)
    storage = request.storage
    if not storage:  # `draftnas search`'s default: runs/<study>/study.db
        default = Path("runs") / study / "study.db"
        if not default.is_file():
            raise option_error("storage", f"not given, so study {request.study!r} is looked for in "
                                          f"{default}, which does not exist; give the storage URL "
                                          "(sqlite:///F, postgresql://..., journal:F)")
        storage = f"sqlite:///{default.resolve()}"
    info, trial = load_trial(study, storage, request.trial)
    plan = trial.candidate.plan
    if plan is None:
        raise ExportError(f"trial {trial.number} of study {request.study!r} holds no pruning plan "
                          "(latency-only candidates cannot be exported)")
    if trial.candidate.head_vocab_size and plan.vocab is None:
        raise ExportError(f"trial {trial.number} was stored by a draftnas whose plans did not carry the "
                          "reduced head's token ids; re-run `draftnas search` to export it")
    return _Source(plan=plan, label=study_source(study, trial.number), trial=trial, info=info)


def _drafting(request: ExportRequest, trial: RankedTrial | None,
              prediction: WorkloadPrediction | None) -> tuple[int, float]:
    """(gamma, confidence stop): --gamma with no stop, else the best policy at the workload's main batch
    size for the drafter as exported (`prediction`), else the search's, else gamma 4 with no stop; never
    gamma 0 (a folder is for speculating).

    (This once looked for top-level keys the stored prediction does not have, so every
    exported drafter said gamma 4 whatever the search found.)
    """
    if request.gamma is not None:
        return request.gamma, 0.0
    for source in (prediction, trial.throughput if trial is not None else None):
        if source is not None and source.primary().gamma >= MIN_GAMMA:
            return source.primary().gamma, source.primary().p_min
    return DEFAULT_GAMMA, 0.0


def plain_drafting(request: ExportRequest, trial: RankedTrial | None, info: StudyInfo | None,
                   estimate: AcceptanceEstimate | None) -> tuple[int, float] | None:
    """(gamma, confidence stop) for a quantized trial's drafter run dense, as a plain load runs it: the best
    policy on its dense latency at the exported drafter's acceptance (else the search's); None for a dense
    trial, one priced before draftnas kept its dense latency, or a --gamma given."""
    if request.gamma is not None or trial is None or info is None or trial.dense_latency is None:
        return None
    reading = measured_acceptance(estimate) if estimate is not None else trial.acceptance
    dense = predict_workload(trial.dense_latency, reading, info.space.workload, info.space.gamma)
    best = dense.primary()
    return (best.gamma, best.p_min) if best.gamma >= MIN_GAMMA else (MIN_GAMMA, 0.0)


def _same_trial(record: dict[str, Any], trial: RankedTrial) -> bool:
    """Whether a folder's draftnas.json was exported from `trial` as the study holds it now, not from a
    trial of the same number in an earlier study of that name (deleted and searched again)."""
    stored = (record.get("trial") or {}).get("throughput")
    # read back as a record: fields added or dropped since the folder was written do not make it another trial
    return isinstance(stored, dict) and WorkloadPrediction.from_dict(stored) == trial.throughput


def study_source(study: str, trial: int) -> str:
    """How an export from a study trial names its source (ExportInfo.source, draftnas.json)."""
    return f"study {study} trial {trial}"


def study_traces(info: StudyInfo | None) -> Any:
    """The trace records a study scored acceptance on (its held-out split, at the workload's
    temperature), or None: an assumed-acceptance study, a study stored before draftnas recorded
    its traces, or a moved file."""
    if info is None or info.acceptance_assumed or not info.traces:
        return None
    if not Path(info.traces).is_file():
        log.warning("the study's traces %s are gone; the export is not re-scored", info.traces)
        return None
    scored, _ = split_traces(load_traces(info.traces).select(temperature=info.space.workload.temperature))
    return scored


def searched_prompts(info: StudyInfo | None) -> tuple[str, ...]:
    """`prompt_key`s of the prompts a study's traces hold (none when it has no traces here)."""
    if info is None or not info.traces or not Path(info.traces).is_file():
        return ()
    return tuple(sorted({prompt_key(r.prompt_ids.tolist()) for r in load_traces(info.traces).records}))


def rescore(trial: RankedTrial, info: StudyInfo, estimate: AcceptanceEstimate) -> WorkloadPrediction:
    """The trial's latency (as the search priced it) at the exported drafter's measured acceptance."""
    reading = measured_acceptance(estimate)
    return predict_workload(trial.latency, reading, info.space.workload, info.space.gamma)


def workload_heal_options(info: StudyInfo | None, scored: Any = None) -> HealOptions:
    """Healing data for an export: the target's continuations of the study's workload prompt set
    (self-distillation on the text the drafter will serve; up to 40 prompts per domain), or of the
    default mixed set (10 per domain) for a plan file or a workload of every set; never the
    prompts of `scored`, the traces its acceptance will be estimated on. Training also gets
    EXPORT_WRITTEN_PROMPTS prompts the target writes itself, opening like the training prompts, and
    the teacher is the target's top-EXPORT_TEACHER_TOPK kept while the data is made. The learning
    rate is the study space's (`heal.learning_rate`), the one its trials were healed with."""
    exclude = tuple(r.info.prompt_id for r in scored.records) if scored is not None else ()
    options = HealOptions(exclude_prompts=exclude, written_prompts=EXPORT_WRITTEN_PROMPTS,
                          teacher_topk=EXPORT_TEACHER_TOPK)
    if info is None:
        return options
    options = replace(options, lr=info.space.heal.learning_rate)
    if info.space.workload.prompt_set == "all":
        return options
    return replace(options, prompts=info.space.workload.prompt_set, prompts_per_domain=40)


def default_heal_steps(source_space: Any) -> tuple[int, str]:
    """Heal steps when --heal-steps is not given, with why: none when the study's space heals none
    (its authors found short healing lowers that family's acceptance: the shipped Gemma-3 space),
    else DEFAULT_EXPORT_HEAL_STEPS."""
    if source_space is not None and source_space.heal.steps == 0:
        return 0, f"the search space {source_space.name} heals no drafter (heal.steps: 0)"
    return DEFAULT_EXPORT_HEAL_STEPS, "the stated default"


def export_from_request(request: ExportRequest, *, progress: Progress | None = None,
                        data_progress: Progress | None = None) -> ExportResult:
    """Resolve the plan, build the drafter from the base (healed unless 0 steps), export, push
    (optional)."""
    request.validate()
    if request.quant is not None:
        from draftnas.models.llama_cpp import check_quant

        check_quant(request.quant)  # a type llama.cpp lacks is said before anything runs
    if request.device is not None:
        require_device(request.device)
    check_destination(request.out_dir, request.force)  # fail before minutes of work
    source = _resolve_plan(request)
    plan, trial = source.plan, source.trial
    base = request.base or plan.base
    if not base:
        raise option_error("base", "must be given: the plan names no base model")
    target = request.target or (source.info.target if source.info else None) or base
    weights = trial.candidate.choice.weights if trial is not None else "dense"  # how it was searched to run
    searched = weights if weights in GGUF_WEIGHTS else None
    quant = searched if request.gguf == "default" else request.gguf or searched
    if request.gguf == "default" and quant is None:
        quant = "Q8_0"
    if quant is not None:
        quant = check_gguf_export(quant, target, plan.head_rows, request.llama_cpp)
    dtype = source.info.dtype if source.info else "fp32"  # what the study timed and estimated in
    steps = request.heal_steps
    if steps is None:
        steps, why = default_heal_steps(source.info.space if source.info else None)
        log.info("healing %d steps: %s (--heal-steps N to choose)", steps, why)
    loaded = load_model(base, dtype=TORCH_DTYPES["fp32" if steps > 0 else dtype])  # healing trains in fp32
    held = study_traces(source.info) if trial is not None else None
    options = None
    if steps > 0:
        device = request.device or (source.info.device if source.info else "cpu")
        options = replace(request.heal or workload_heal_options(source.info, held), steps=steps,
                          seed=request.seed, device=device)
    checkpoint = Path(request.out_dir + ".heal-checkpoint")
    draft_dtype = dtype  # its activations: a quantized drafter's may be bf16 beside an fp32 target
    if quantized(weights) and source.info is not None and source.info.quant_dtype:
        draft_dtype = source.info.quant_dtype
    scoring: dict[str, Any] = {}
    if held is not None and source.info is not None:
        scoring = {"held": held, "max_gamma": max(source.info.space.gamma.max, 1),
                   "temperature": source.info.space.workload.temperature,
                   "p_mins": source.info.space.gamma.p_min}
    teacher = teacher_for(request.traces, target, base, loaded, dtype) if options else None
    built = build_drafter(plan, loaded, heal=options, teacher=teacher,
                          checkpoint_dir=checkpoint, progress=progress, data_progress=data_progress,
                          dtype=draft_dtype, weights=weights, **scoring)
    heal_result = built.heal
    if heal_result is not None and heal_result.top1_after < heal_result.top1_before:
        # healing made it worse on held-out text: export the pruned weights, and say so in the card
        log.warning("healing lowered held-out top-1 agreement (%.3f -> %.3f): exporting the unhealed "
                    "drafter", heal_result.top1_before, heal_result.top1_after)
        built = build_drafter(plan, loaded, dtype=draft_dtype, weights=weights, **scoring)
        heal_result = replace(heal_result, kept=False)
    prediction = None
    if built.estimate is not None and trial is not None and source.info is not None:
        prediction = rescore(trial, source.info, built.estimate)
    measured = None
    if heal_result is not None:
        measured = ({"top1_agreement_after_healing": heal_result.top1_after} if heal_result.kept
                    else {"top1_agreement": heal_result.top1_before})
    gamma, p_min = _drafting(request, trial, prediction)
    plain = plain_drafting(request, trial, source.info, built.estimate)
    info = ExportInfo(
        base=base, target=target, plan=plan, trial=trial,
        profile=source.info.profile if source.info else None,
        heal=heal_result, source=source.label, seed=request.seed, gamma=gamma, p_min=p_min,
        measured=measured, acceptance=built.estimate, prediction=prediction,
        searched_prompts=searched_prompts(source.info), weights=weights, dtype=draft_dtype,
        plain_gamma=plain[0] if plain else None, plain_p_min=plain[1] if plain else 0.0,
    )
    # stored in the dtype the drafter runs in (healing trains in fp32; a bf16 search's drafter runs in bf16)
    model = built.model.to(getattr(torch, TORCH_DTYPES[draft_dtype]))
    out = export_drafter(model, loaded.tokenizer, request.out_dir, info, force=request.force,
                         full_head=request.full_head)
    if heal_result is not None:
        shutil.rmtree(checkpoint, ignore_errors=True)
    gguf = (str(export_gguf(model, target, out, drafter_name(info), quant, request.llama_cpp))
            if quant else None)
    hub_url = push_to_hub(out, request.push_to_hub) if request.push_to_hub else None
    return ExportResult(out_dir=str(out), plan=plan, parameters=built.parameters, heal=heal_result, gguf=gguf,
                        hub_url=hub_url, source=source.label, name=drafter_name(info), gamma=info.gamma,
                        p_min=info.p_min, acceptance=built.estimate, prediction=prediction,
                        searched_tokens_per_step=searched_tokens(trial, info.gamma, info.p_min))


def teacher_for(traces: str | None, target: str, base: str, loaded: Any, dtype: str = "fp32") -> Any:
    """Traces when given, else the live target in `dtype` (the already `loaded` base when they are the
    same): its greedy tokens are the ones it serves in that dtype."""
    if traces:
        from draftnas.acceptance.traces import load_traces

        return load_traces(traces).select(temperature=0.0)
    if loaded is not None and target in (base, loaded.source.spec):
        return loaded.model
    return load_model(target, dtype=TORCH_DTYPES[dtype]).model


def export_best(result: SearchResult, root: Path, *, progress: Progress | None = None,
                data_progress: Progress | None = None, device: str | None = None,
                trial: RankedTrial | None = None) -> BestExport:
    """A search's best trial (or `trial`, another ranked one: the hand-made best) exported as `draftnas
    export` would (its default healing) into root/<name> and priced again at its acceptance as exported.
    A folder that already holds that trial is kept (its `draftnas.json` is the record); one holding
    another study's drafter of the same name is kept too, and this one goes beside it
    (root/<name>-<study>)."""
    from draftnas.export.folder import exported_record
    from draftnas.search.explain import exportable

    b = trial or result.best
    if b is None or not exportable(result):
        raise ExportError("exporting the best trial needs a search that pruned real weights and measured "
                          "acceptance; this study has no such drafter to export")
    for out in (root / b.candidate.name, root / f"{b.candidate.name}-{result.study_name}"):
        record = exported_record(out)
        if record is not None and record.get("source") == study_source(result.study_name, b.number) \
                and _same_trial(record, b):
            return BestExport(folder=str(out), gamma=int(record.get("gamma", b.primary.gamma)), record=record,
                              p_min=float(record.get("p_min", 0.0)))
        if not out.exists() or not any(out.iterdir()):
            break
    request = ExportRequest(out_dir=str(out), study=result.study_name, storage=result.storage, trial=b.number,
                            device=device or result.info.device)
    exported = export_from_request(request, progress=progress, data_progress=data_progress)
    return BestExport(folder=exported.out_dir, gamma=exported.gamma, record=exported.to_dict(),
                      result=exported, p_min=exported.p_min)
