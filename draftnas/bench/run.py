"""`draftnas bench`: real speculative decoding, measured beside the estimator's prediction.

Every arm (`bench.arms`: the target alone, draftnas's loop with each drafter, transformers'
assisted generation, and on CPU the same with routed linear layers) decodes the same prompts,
interleaved prompt by prompt (the order rotates so drift on a shared machine hits each alike),
after one warm-up run each. A reference drafter (`reference=`: the drafter a user would otherwise
pick, e.g. the family's small model) gets the same arms in the same run; `--lookup` adds lookup drafting
alone and a hybrid with the drafter in draftnas's loop (`bench.lookup_arms`).
Greedy runs are checked token for token against their baseline's own greedy output in the same
engine (``lossless`` per prompt; ``exact_match_rate`` overall). Where a speculative run departs
from it, the target's top-1 minus top-2 logit margin at that token is recorded: in bf16/fp16 a
verify pass over gamma + 1 tokens and a one-token decode may round a near-tie differently (a margin
near 0), which a bug would not need. The estimator's prediction comes from a trace of the target's
own outputs on these prompts (one teacher-forced target pass for the top-k probabilities) and one
teacher-forced pass of each drafter."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from draftnas.acceptance.accepts import AcceptsTrace
from draftnas.acceptance.estimate import estimate_acceptance, estimated_accepts
from draftnas.acceptance.records import TraceOptions
from draftnas.acceptance.traces import Traces, make_metadata, model_vocab_size, tokenizer_fingerprint
from draftnas.acceptance.tracing import record_from_continuation
from draftnas.bench.arms import MAIN, Arm, Bench, Drafter, Run, arm_names, reference_label
from draftnas.bench.batch_records import BatchedBenchResult
from draftnas.bench.batched import host_label, run_batched_bench
from draftnas.bench.head_arm import HeadArm, head_result, load_bench_head
from draftnas.bench.lookup_arms import LookupArm, lookup_arms, lookup_result
from draftnas.bench.predicted import check_predictions, exported_prediction
from draftnas.bench.recorded import write_bench_accepts
from draftnas.bench.records import ArmResult, ArmRun, BenchPrompt, BenchResult, Comparison
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.stats import (
    compare_arms,
    drafting_figures,
    drafting_split,
    first_divergence,
    interval_of,
    other_definition,
    tokens_per_s,
)
from draftnas.core.engine_kinds import HF, STATIC, engine_kind
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import load_average, require_device
from draftnas.core.options import option_error
from draftnas.core.prompts import Prompt, check_context, encode_prompt, subsample
from draftnas.core.provenance import package_versions
from draftnas.core.records import Progress
from draftnas.drafter.families import parse_drafter
from draftnas.drafter.head.folder import head_trained_prompts
from draftnas.drafter.heal.heal_records import prompt_key
from draftnas.export.folder import exported_record, load_drafter
from draftnas.models.kernel_choices import kept_choices
from draftnas.models.records import TORCH_DTYPES, quantized, weights_problem
from draftnas.models.sources import LoadedModel, load_model
from draftnas.search.predictions import read_predictions

log = logging.getLogger(__name__)


def _check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    t_fp, d_fp = tokenizer_fingerprint(target.tokenizer), tokenizer_fingerprint(draft.tokenizer)
    t_v, d_v = model_vocab_size(target.model), model_vocab_size(draft.model)
    if t_fp != d_fp or t_v != d_v:
        raise InvalidInputError(
            f"draft {draft.source.spec!r} (tokenizer {d_fp}, {d_v} ids) and target {target.source.spec!r} "
            f"(tokenizer {t_fp}, {t_v} ids) must share one tokenizer for speculative decoding"
        )


def _bench_prompt(bench: Bench, arms: Sequence[Arm], prompt: Prompt, ids: list[int],
                  index: int) -> tuple[BenchPrompt, list[int]]:
    """One prompt through every arm (order rotated by index); also returns the target's tokens."""
    order = list(arms[index % len(arms):]) + list(arms[:index % len(arms)])
    seed = bench.options.seed + index
    runs: dict[str, Run] = {a.name: a.run(ids, seed, bench.options.max_new_tokens) for a in order}
    greedy = bench.options.temperature <= 0
    out = []
    for arm in arms:
        run = runs[arm.name]
        row = ArmRun(arm=arm.name, seconds=run.elapsed_s, new_tokens=len(run.tokens), steps=run.steps,
                     accepted=run.accepted, drafted=run.drafted, draft_s=run.draft_s,
                     accepted_steps=run.accepted_steps, drafted_steps=run.drafted_steps,
                     first_step_seconds=run.first_step_s, first_step_tokens=run.first_step_tokens)
        base = runs[arm.baseline] if arm.baseline else None
        if base is not None and greedy:
            divergence = first_divergence(run.tokens, base.tokens)
            margin = (base.margins[divergence] if divergence is not None and base.margins
                      and divergence < len(base.margins) else None)
            row = replace(row, lossless=divergence is None, first_divergence=divergence,
                          divergence_margin=margin)
        out.append(row)
    return BenchPrompt(prompt_id=prompt.id, domain=prompt.domain, prompt_tokens=len(ids),
                       runs=tuple(out)), runs["target"].tokens


def bench_traces(target: LoadedModel, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
                 continuations: Sequence[list[int]], options: BenchOptions) -> Traces:
    """In-memory traces of the target's own outputs (one teacher-forced pass each for top-k)."""
    topts = TraceOptions(max_new_tokens=options.max_new_tokens, temperatures=(options.temperature,),
                         top_k=options.top_k, seed=options.seed)
    meta = make_metadata(target, prompts, topts, "bench")
    records = [record_from_continuation(target.model, p, ids, cont, temperature=options.temperature,
                                        top_k=options.top_k, eos_ids=meta.eos_token_ids)
               for p, ids, cont in zip(prompts, encoded, continuations, strict=True) if cont]
    return Traces(replace(meta, n_records=len(records)), records)


def _arm_result(arm: Arm, rows: Sequence[BenchPrompt], bench: Bench) -> ArmResult:
    """One arm's figures over every prompt and round (its speedup against its baseline's run of the same
    prompt in the same round)."""
    runs = [p.run(arm.name) for p in rows]
    tokens = sum(r.new_tokens for r in runs)
    tps, tps_interval = interval_of(rows, lambda p: tokens_per_s(p.run(arm.name)))
    result = other_definition(ArmResult(
        name=arm.name, engine=arm.engine, tokens_per_s=tps, tokens_per_s_interval=tps_interval,
        pooled_tokens_per_s=tokens / sum(r.seconds for r in runs), baseline=arm.baseline), rows)
    if arm.baseline is None:
        return result
    if isinstance(arm, LookupArm):
        return lookup_result(arm, rows, result, compare_arms(rows, arm.name, arm.baseline))
    if isinstance(arm, HeadArm):
        return head_result(arm, rows, result, compare_arms(rows, arm.name, arm.baseline))
    d = bench.drafters[arm.drafter or ""]
    loop = arm.name == arm_names(d.label)[0]  # only draftnas's loop counts and times its drafts
    share, free, free_interval = drafting_split(rows, arm.name, arm.baseline) if loop else (None, None, ())
    gamma, p_min = d.plain if arm.engine == HF and d.plain else (d.gamma, d.p_min)  # a plain load's own
    figures = drafting_figures(runs, compare_arms(rows, arm.name, arm.baseline), counted=loop, timed=loop)
    return replace(
        result, **figures, drafter=d.loaded.source.spec,
        draft_share=share, free_draft_speedup=free, free_draft_speedup_interval=free_interval,
        draft_vocab_size=d.subset.size if d.subset is not None else None,
        draft_weights=d.weights if arm.engine in (STATIC, "hf-routed") else "dense", gamma=gamma, p_min=p_min,
        divergence_margins=tuple(r.divergence_margin for r in runs if r.divergence_margin is not None))


def _comparisons(arms: Sequence[Arm], rows: Sequence[BenchPrompt],
                 drafters: Sequence[Drafter]) -> tuple[Comparison, ...]:
    """The drafter's arms over each reference's, engine by engine (loop, transformers, routed), and each
    lookup arm over the drafter's loop arm."""
    names = {a.name for a in arms}
    return tuple(compare_arms(rows, mine, theirs)
                 for d in drafters if d.label != MAIN
                 for mine, theirs in zip(arm_names(MAIN), arm_names(d.label), strict=True)
                 if mine in names and theirs in names) + tuple(
        compare_arms(rows, a.name, a.rival) for a in arms if isinstance(a, LookupArm) and a.rival in names)


def _load_drafters(draft: str | LoadedModel | None, references: Sequence[str | LoadedModel],
                   target: LoadedModel, load: dict[str, Any], options: BenchOptions,
                   policies: Mapping[int, tuple[int, float]]) -> list[Drafter]:
    """Each drafter at its γ and stop: the main one at the options', a reference at `policies`' (reference
    index -> (γ, p_min)), else its folder's own, else the reference options'; run plainly, its folder's.
    `draft` None: the main drafter is no model (a head, `bench.head_arm`)."""
    out = []
    for index, spec in ([(-1, draft)] if draft is not None else []) + list(enumerate(references)):
        label = MAIN if index < 0 else reference_label(index)
        own = {**load, "dtype": TORCH_DTYPES[_drafter_dtype(label, spec, options)]}
        loaded = load_drafter(spec, **own) if isinstance(spec, str) else spec
        _check_same_tokenizer(target, loaded)
        record = (exported_record(loaded.folder) if loaded.folder is not None else None) or {}
        own_gamma, own_stop = record.get("gamma"), record.get("p_min")
        gamma, p_min = (options.gamma, options.p_min) if label == MAIN else policies.get(index, (
            own_gamma if isinstance(own_gamma, int) else options.reference_gamma or options.gamma,
            float(own_stop) if isinstance(own_stop, int | float) else options.reference_p_min))
        plain = record.get("plain_gamma")  # a quantized export's settings run dense (a plain load's)
        out.append(replace(Drafter.of(label, loaded, _weights(label, loaded, options), gamma,
                                      p_min if options.temperature <= 0 and not options.batch_sizes else 0.0),
                           plain=(plain, float(record.get("plain_p_min") or 0)) if plain else None))
    return out


def _drafter_dtype(label: str, spec: str | LoadedModel, options: BenchOptions) -> str:
    """The dtype a drafter runs in: the bench's, but a quantized drafter whose folder records other
    activations (bf16 beside an fp32 target, where the int8/int4 kernels are fast that way) runs in those."""
    folder = _folder(spec) if isinstance(spec, str) else None  # a loaded drafter keeps its dtype
    asked = options.draft_weights if label == MAIN else options.reference_weights
    if folder is None or asked == "dense":
        return options.dtype
    record = exported_record(folder) or {}
    dtype = record.get("dtype")
    return str(dtype) if quantized(str(record.get("weights", "dense"))) and dtype in TORCH_DTYPES \
        else options.dtype


def _weights(label: str, loaded: LoadedModel, options: BenchOptions) -> str:
    """How a drafter's linear layers run: as asked (--draft-weights, --reference-weights), else as its
    folder's draftnas.json records (an export of an int8 trial says "int8", of a per-layer one its groups)."""
    asked = options.draft_weights if label == MAIN else options.reference_weights
    if asked is not None:
        weights = asked
    else:
        record = exported_record(loaded.folder) if loaded.folder is not None else None
        weights = str((record or {}).get("weights", "dense"))
    field = "draft_weights" if label == MAIN else "reference_weights"
    if quantized(weights) and not engine_kind(options.resolved_engine()).quantized_kernels:
        raise option_error(field, f"{weights} ({label} drafter) runs in draftnas's loop in its static engine "
                                  "only: set {engine} static, or dense weights")
    problem = weights_problem(weights, options.device, options.dtype)
    if problem:
        raise option_error(field, f"{label} drafter: {problem}")
    return weights


def load_for_bench(target: str | LoadedModel, draft: str | LoadedModel | None,
                    references: Sequence[str | LoadedModel], prompts: Sequence[Prompt], options: BenchOptions,
                    policies: Mapping[int, tuple[int, float]] | None = None, head_folder: str | None = None
                    ) -> tuple[LoadedModel, list[Drafter], list[Prompt], list[list[int]], tuple[str, ...]]:
    """What every bench starts from: the options checked, the target and drafters loaded in the
    options' dtype and device (one tokenizer), and the prompts no drafter (nor the head in `head_folder`,
    where the main drafter is a head) was healed, trained or searched on
    -> (target, drafters, prompts, their ids, ids left out)."""
    options.validate()
    if not prompts:
        raise InvalidInputError("no prompts to bench")
    require_device(options.device)
    load = {"dtype": TORCH_DTYPES[options.dtype], "device": options.device}
    t_model = load_model(target, **load) if isinstance(target, str) else target
    drafters = _load_drafters(draft, references, t_model, load, options, policies or {})
    folders = [d.loaded.folder for d in drafters] + ([Path(head_folder)] if head_folder else [])
    kept, encoded, left_out = unseen_prompts(prompts, t_model.tokenizer, folders, options.per_domain)
    return t_model, drafters, kept, encoded, left_out


def run_bench(
    target: str | LoadedModel,
    draft: str | LoadedModel,
    prompts: Sequence[Prompt],
    options: BenchOptions,
    *,
    reference: str | LoadedModel | None = None,
    references: Sequence[str | LoadedModel] = (),
    progress: Progress | None = None,
    policies: Mapping[int, tuple[int, float]] | None = None,
) -> BenchResult:
    """Decode `prompts` with every arm (`bench.arms`) for `draft` and each reference (`reference`, then
    `references`); compare. progress(done, total): (0, total) as the timed runs start, then after each
    prompt (total = prompts × rounds + 1 for the estimate). `policies`: reference index -> (γ, p_min) it
    runs at instead of its folder's (and is then not checked against its folder's prediction)."""
    started, load_before = time.perf_counter(), load_average()
    predictions = read_predictions(options.predictions) if options.predictions else None
    refs = [*([reference] if reference is not None else []), *references]
    with kept_choices():  # the kernel choices a calibration on this host made are reused, and kept
        result = _run_bench(target, draft, prompts, options, refs, progress, started, load_before, policies)
    if predictions is None:
        return result
    folder = _folder(draft)
    record = exported_record(folder) if folder is not None else None
    folders = {reference_label(i): _folder(r) for i, r in enumerate(refs) if i not in (policies or {})}
    priced = {label: exported_prediction(exported_record(f)) for label, f in folders.items() if f is not None}
    return replace(result, predictions=check_predictions(
        result, predictions, exported_prediction(record), {k: p for k, p in priced.items() if p is not None}))


def _folder(draft: str | LoadedModel) -> Path | None:
    path = draft.folder if isinstance(draft, LoadedModel) else Path(draft).expanduser()
    return path if path is not None and path.is_dir() else None


def _run_bench(target: str | LoadedModel, draft: str | LoadedModel, prompts: Sequence[Prompt],
               options: BenchOptions, references: Sequence[str | LoadedModel], progress: Progress | None,
               started: float, load_before: str, policies: Mapping[int, tuple[int, float]] | None
               ) -> BenchResult:
    head_spec = draft if isinstance(draft, str) and parse_drafter(draft).family == "head" else None
    t_model, drafters, prompts, encoded, left_out = load_for_bench(
        target, None if head_spec else draft, references, prompts, options, policies,
        head_folder=parse_drafter(head_spec).model if head_spec else None)
    head = load_bench_head(head_spec, t_model.model, options.gamma) if head_spec else None
    bench = Bench(t_model, drafters, options)
    check_context(prompts, encoded, options.max_new_tokens + bench.max_gamma + 1,
                  t_model.model.config.max_position_embeddings, options.resolved_engine())
    if options.resolved_engine() == STATIC:
        bench.build_engines(max(len(ids) for ids in encoded) + options.max_new_tokens + bench.max_gamma + 1)
    bench.prepare(encoded)
    arms = bench.arms()
    arms = arms[:1] + ([HeadArm(bench, head)] if head else []) + arms[1:] + lookup_arms(bench)
    bench.warm(arms, encoded)
    rows: list[BenchPrompt] = []
    continuations: list[list[int]] = []
    timing_before = bench.choice_timing_s()
    total = options.rounds * len(prompts) + (1 if options.estimate else 0)
    if progress:
        progress(0, total)  # the timed runs start: a log says so, and its heartbeat counts them from here
    for r in range(options.rounds):
        for i, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True)):
            row, tokens = _bench_prompt(bench, arms, prompt, ids, i + r)  # the arms' order rotates by round
            rows.append(replace(row, round=r))
            if r == 0:
                continuations.append(tokens)
            if progress:
                progress(r * len(prompts) + i + 1, total)
    results = [_arm_result(arm, rows, bench) for arm in arms]
    choice_timing = bench.choice_timing_s() - timing_before
    if choice_timing > 0:
        log.warning("%.2f s of the timed runs went to timing the products of shapes met there first",
                    choice_timing)
    estimated: list[AcceptsTrace] = []
    if options.estimate:
        results, estimated = _with_predictions(results, bench, prompts, encoded, continuations, options)
        if progress:
            progress(total, total)
    param = next(t_model.model.parameters())
    result = BenchResult(
        target=t_model.source.spec,
        drafters=({MAIN: head.spec} if head else {}) | {d.label: d.loaded.source.spec for d in drafters},
        gamma=options.gamma, temperature=options.temperature, max_new_tokens=options.max_new_tokens,
        n_prompts=len(prompts), device=str(param.device), dtype=str(param.dtype).removeprefix("torch."),
        threads=torch.get_num_threads(), engine=options.resolved_engine(), arms=tuple(results),
        prompts=tuple(rows), versions=package_versions(), left_out=left_out,
        choice_timing_s=round(choice_timing, 3), load_average_before=load_before,
        host=host_label(options.device), rounds=options.rounds,
        comparisons=_comparisons(arms, rows, drafters),
        wall_s=round(time.perf_counter() - started, 2),
    )
    if options.write_accepts:
        write_bench_accepts(options.write_accepts, result, estimated)
    return result


def run_batch_sizes(
    target: str | LoadedModel,
    draft: str | LoadedModel,
    prompts: Sequence[Prompt],
    options: BenchOptions,
    *,
    reference: str | LoadedModel | None = None,
    progress: Progress | None = None,
) -> BatchedBenchResult:
    """`draftnas bench --batch-size`: the target alone and each drafter's batched loop at every batch
    size of `options.batch_sizes` (`bench.batched`), on the prompts no drafter was healed on."""
    refs = [reference] if reference is not None else []
    t_model, drafters, kept, encoded, _ = load_for_bench(target, draft, refs, prompts, options)
    return run_batched_bench(t_model, drafters, kept, encoded, options, progress=progress)


def unseen_prompts(prompts: Sequence[Prompt], tokenizer: Any, folders: Sequence[Path | None],
                   per_domain: int | None) -> tuple[list[Prompt], list[list[int]], tuple[str, ...]]:
    """The prompts no drafter folder (`folders`: None for a drafter without one) healed on and whose
    search did not trace them (by token ids,
    as `draftnas.json` records them), then at most `per_domain` of each domain -> (prompts, their
    ids, ids left out). A bench on a drafter's own training or scoring text would overstate its
    acceptance."""
    trained: set[str] = set()
    for folder in folders:
        record = exported_record(folder) if folder is not None else None
        heal = (record or {}).get("heal") or {}
        trained |= set(heal.get("trained_prompts") or ()) if heal.get("kept", True) else set()
        trained |= set((record or {}).get("searched_prompts") or ())
        trained |= set(head_trained_prompts(folder)) if folder is not None else set()
    pairs = [(p, encode_prompt(tokenizer, p.text)) for p in prompts]
    seen = [prompt_key(ids) in trained for _, ids in pairs]
    kept = [pair for pair, was in zip(pairs, seen, strict=True) if not was]
    left_out = tuple(p.id for (p, _), was in zip(pairs, seen, strict=True) if was)
    if not kept:
        raise option_error("prompts", f"are all ones the drafter was healed on or searched with (every one "
                                      f"of the {len(pairs)} given): bench it on other prompts")
    if left_out:
        log.warning("left out %d prompt(s) a drafter was healed on or its search traced: %s", len(left_out),
                    ", ".join(left_out))
    if per_domain is not None:
        chosen = {p.id for p in subsample([p for p, _ in kept], per_domain)}
        kept = [(p, ids) for p, ids in kept if p.id in chosen]
    return [p for p, _ in kept], [ids for _, ids in kept], left_out


def _with_predictions(results: list[ArmResult], bench: Bench, prompts: Sequence[Prompt],
                      encoded: Sequence[list[int]], continuations: Sequence[list[int]],
                      options: BenchOptions) -> tuple[list[ArmResult], list[AcceptsTrace]]:
    """Each drafter's loop arm with the estimator's prediction on these prompts, from traces of the
    target's own runs (greedy: the target's continuations; sampling: its sampled outputs are samples of
    p, which is what a sampled trace holds), and with `write_accepts` the estimator's counts per step."""
    traces = bench_traces(bench.target, prompts, encoded, continuations, options)
    by_name = {r.name: r for r in results}
    estimated: list[AcceptsTrace] = []
    for d in bench.drafters.values():
        name, g = arm_names(d.label)[0], str(d.gamma)
        with d.own_products():  # its weight format's products, as it drafts
            est = estimate_acceptance(d.loaded, traces, max_gamma=d.gamma, temperature=options.temperature,
                                      p_mins=(d.p_min,))
            if options.write_accepts:
                estimated.append(estimated_accepts(d.loaded, traces, gamma=d.gamma, p_min=d.p_min,
                                                   label=f"{d.label}-estimate", drafter=d.loaded.source.spec))
        walk = est.policy(d.gamma, d.p_min)  # greedy: each prompt's walk at the arm's policy
        stop = walk if d.p_min > 0 else None  # a stop's walk has no interval here
        prompts_walked = (walk.prompt_tokens_per_step, walk.prompt_drafted_per_step) if walk else ((), ())
        by_name[name] = replace(by_name[name], predicted_tokens_per_step=stop.tokens_per_step if stop
                                else est.tokens_per_step[g], predicted_ci_low=None if stop else est.ci_low[g],
                                predicted_ci_high=None if stop else est.ci_high[g],
                                predicted_acceptance_rate=est.acceptance_rate, estimator_s=est.elapsed_s,
                                predicted_prompt_tokens_per_step=prompts_walked[0],
                                predicted_prompt_drafted_per_step=prompts_walked[1])
    return [by_name[r.name] for r in results], estimated
