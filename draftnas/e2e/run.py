"""`draftnas e2e`: the whole pipeline on one target, then the winner against baselines, measured.

Stages (each writes into the run folder; a re-run skips what is already there):

1. profile  - the device's latency profile (measured, or a given/shipped one);
2. traces   - the target's own greedy outputs over the shipped prompt sets;
3. search   - the Optuna study with healing inside each trial (real weights);
4. drafters - the winner's plan and the baselines' plans, each healed with the SAME
              budget on the traces and exported as a Hugging Face folder:
              (a) the first k layers of the base (the winner's k, full width),
              (b) a deep-narrow drafter of about the winner's parameter count,
              (c) k evenly spaced layers (full width);
5. terms    - each latency the analytical model uses, measured alone on the live models;
6. bench    - real speculative decoding (greedy, batch 1) of each exported drafter beside
              the target alone, at a fixed gamma and at the predicted best gamma, repeated;
7. analysis - measured vs predicted speedup per drafter (MAPE, Spearman), and where the
              prediction is off, which term is off (`decompose`).

Beside the comparison, the winner's plan is healed a second time on ONE domain's traces only
(`tuned_domain`, default translation: self-distillation for a domain) and benched at the fixed
gamma, so the per-domain table answers whether the domain-tuned drafter accepts more there.

Bench prompts are shipped prompts NOT used for the traces, so no drafter is benched on the
text it was healed on.

The stages themselves and their options are in `draftnas.e2e.stages`; this module runs them in
order and assembles the analysis.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftnas.bench.fidelity import best_predicted_gamma, decompose, fidelity, predict
from draftnas.bench.fidelity_records import DrafterRow, MeasuredTerms
from draftnas.bench.terms import measure_terms, per_domain_measured, summarize_bench
from draftnas.core.errors import DraftnasError, InvalidInputError
from draftnas.core.machine import load_average, machine_info, require_device
from draftnas.core.prompts import encode_prompt
from draftnas.core.records import MachineInfo
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.drafter.vocab import maybe_apply_saved_subset
from draftnas.e2e.records import ROLES, E2EOptions, E2EResult, RoleDrafter
from draftnas.e2e.render import E2E_GPU_PROFILE, honest_notes, results_markdown
from draftnas.e2e.stages import (
    bench_one,
    check_tuned_domain,
    heal_and_held_out,
    split_prompts,
    stage_drafters,
    stage_profile,
    stage_search,
    stage_traces,
    stage_tuned,
    write_json,
)
from draftnas.export.folder import load_drafter
from draftnas.latency.files import default_profile
from draftnas.latency.model import LatencyModel
from draftnas.models.sources import load_model
from draftnas.search.records import SearchResult

if TYPE_CHECKING:
    from draftnas.acceptance.records import AcceptanceEstimate
    from draftnas.bench.records import BenchResult
    from draftnas.core.prompts import Prompt
    from draftnas.latency.records import LatencyProfile
    from draftnas.models.sources import LoadedModel


log = logging.getLogger(__name__)
StageProgress = Callable[[str, int, int], None]


class _Stages:
    """Times stages and forwards progress under each stage's name."""

    def __init__(self, progress: StageProgress | None) -> None:
        self.progress = progress
        self.seconds: dict[str, float] = {}
        self._t, self._name = 0.0, ""

    def start(self, name: str, total: int = 1) -> Callable[[int, int], None]:
        self._t = time.perf_counter()
        self._name = name
        if self.progress:
            self.progress(name, 0, total)
        progress = self.progress
        return (lambda done, tot: progress(name, done, tot)) if progress else (lambda done, tot: None)

    def done(self) -> None:
        self.seconds[self._name] = round(self.seconds.get(self._name, 0.0) + time.perf_counter() - self._t, 1)


@dataclass
class _Context:
    options: E2EOptions
    out: Path
    target: LoadedModel
    target_arch: Architecture
    latency: LatencyModel
    bench_prompts: tuple[Prompt, ...]
    context_tokens: int
    prompt_tokens: int
    sample_ids: list[int]


def _row_for(ctx: _Context, built: RoleDrafter, gpu: LatencyModel | None,
             runs: dict[int, list[BenchResult]], terms: MeasuredTerms | None, best: int) -> DrafterRow:
    arch = built.plan.architecture(ctx.target_arch)
    est = _estimate(built)
    tps = dict(est.tokens_per_step)
    fixed = ctx.options.budget.fixed_gamma
    gammas = sorted({fixed, best})
    predicted = {str(g): predict(ctx.latency, arch, ctx.target_arch, tps[str(g)], g, ctx.context_tokens,
                                 built.head_vocab_size) for g in gammas}
    measured = {str(g): summarize_bench(runs[g], terms) for g in gammas if runs.get(g) and terms}
    decomposition = {g: decompose(predicted[g], m, terms) for g, m in measured.items() if terms}
    gpu_speedup = None
    if gpu is not None and str(best) in measured:
        gpu_speedup = predict(gpu, arch, ctx.target_arch, measured[str(best)].tokens_per_step, best,
                              ctx.context_tokens, built.head_vocab_size).speedup
    heal = built.built.heal
    per_domain = {d: {"top1": v.top1_agreement, "tokens_per_step": v.tokens_per_step[str(fixed)],
                      "prompts": float(v.n_prompts)} for d, v in est.per_domain.items()}
    head = f", head {built.head_vocab_size}" if built.head_vocab_size else ""
    return DrafterRow(
        name=built.name, role=built.role, layers=built.plan.layers,
        shape=f"{arch.num_hidden_layers} x {arch.hidden_size} (q{arch.num_attention_heads}/"
              f"kv{arch.num_key_value_heads}, mlp {arch.intermediate_size}{head})",
        parameters=arch.parameters_with_head(built.head_vocab_size),
        non_embedding_parameters=arch.non_embedding_parameters(),
        folder=built.folder, heal_top1_before=heal.top1_before if heal else None,
        heal_top1_after=heal.top1_after if heal else None,
        estimate_tokens_per_step=tps, estimate_per_domain=per_domain, predicted_best_gamma=best,
        predicted=predicted, measured=measured, terms=terms, decomposition=decomposition,
        measured_per_domain=per_domain_measured(runs.get(fixed, [])), gpu_predicted_speedup=gpu_speedup,
        same_as=built.same_as)


def _estimate(drafter: RoleDrafter) -> AcceptanceEstimate:
    assert drafter.built.estimate is not None  # build_role always estimates on the held-out split
    return drafter.built.estimate


def _gpu_model() -> LatencyModel | None:
    try:
        return LatencyModel.from_profile(default_profile(E2E_GPU_PROFILE))
    except DraftnasError:
        return None


def _bench_all(ctx: _Context, built: Sequence[RoleDrafter], bests: dict[str, int],
               tick: Callable[[int, int], None],
               extra: Sequence[RoleDrafter] = ()) -> dict[str, dict[int, list[BenchResult]]]:
    """Every distinct drafter at the fixed and its best gamma (`extra` ones at the fixed gamma only),
    repeats outermost (drift hits all alike)."""
    fixed = ctx.options.budget.fixed_gamma
    jobs = [(b, g) for b in built if b.same_as is None for g in sorted({fixed, bests[b.role]})]
    jobs += [(b, fixed) for b in extra]
    runs: dict[str, dict[int, list[BenchResult]]] = {b.role: {} for b in (*built, *extra)}
    total, done = len(jobs) * ctx.options.budget.repeats, 0
    for repeat in range(ctx.options.budget.repeats):
        for b, g in jobs:
            result = bench_one(ctx.target, b.folder, ctx.bench_prompts, g, repeat, ctx.options, ctx.out)
            runs[b.role].setdefault(g, []).append(result)
            done += 1
            tick(done, total)
    for b in built:
        if b.same_as is not None:
            runs[b.role] = runs[b.same_as]
    return runs


def _terms_for(ctx: _Context, built: RoleDrafter, gammas: Sequence[int]) -> MeasuredTerms:
    path = ctx.out / "terms" / f"{built.role}.json"
    if path.is_file():
        return MeasuredTerms.from_dict(json.loads(path.read_text()))

    loaded = load_drafter(built.folder, device=ctx.options.device)
    draft = loaded.model.eval()
    maybe_apply_saved_subset(draft, loaded.folder)  # time the head the loop uses
    terms = measure_terms(ctx.target.model, draft, ctx.sample_ids, ctx.context_tokens, gammas,
                          ctx.options.budget.term_repeats, ctx.prompt_tokens)
    write_json(path, terms.to_dict())
    return terms


def run_e2e(options: E2EOptions, *, progress: StageProgress | None = None) -> E2EResult:
    """Profile -> traces -> search -> heal + export winner and baselines -> terms -> bench -> analysis.

    Writes into `options.out_dir`: profile.json, traces.safetensors, study.db, drafters/,
    terms/, bench/, results.json and results.md. Returns the result record.
    """

    options.budget.validate()
    require_device(options.device)
    trace_prompts, bench_prompts = split_prompts(options.budget)
    check_tuned_domain(options, trace_prompts)  # a user's mistake: refused before any folder exists
    started = time.perf_counter()
    out = Path(options.out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(options.seed)
    if options.threads is not None:  # OpenMP spin-waits collapse when other jobs hold the cores
        torch.set_num_threads(options.threads)
    machine = machine_info()
    stages = _Stages(progress)

    profile, label = stage_profile(options, out, stages.start("profile"))
    stages.done()
    target = load_model(options.target, device=options.device)
    target.model.eval()
    traces_path = stage_traces(target, trace_prompts, options.budget, options.seed, out,
                               stages.start("traces", len(trace_prompts)), device=options.device)
    stages.done()
    search = stage_search(options, options.profile or str(out / "profile.json"), traces_path, out,
                          stages.start("search", options.budget.trials))
    stages.done()
    if search.best is None or search.best.candidate.plan is None:
        raise InvalidInputError(f"the search finished no trial with a pruning plan (study "
                                f"{search.study_name}); see its storage for the failures")
    winner = search.best.candidate.plan
    target_arch = resolve_architecture(options.target)
    traces = heal_and_held_out(traces_path)
    built = stage_drafters(winner, target, target_arch, traces, options, out,
                           stages.start("heal + export", len(ROLES)))
    stages.done()
    tuned: RoleDrafter | None = None
    if options.tuned_domain is not None:
        tick = stages.start(f"heal on {options.tuned_domain} only")
        tuned = stage_tuned(built[0], target, traces, options.tuned_domain, options, out)
        tick(1, 1)
        stages.done()

    encoded = [encode_prompt(target.tokenizer, p.text) for p in bench_prompts]
    prompt_tokens = round(statistics.fmean(len(e) for e in encoded))
    ctx = _Context(options=options, out=out, target=target, target_arch=target_arch,
                   latency=LatencyModel.from_profile(profile), bench_prompts=bench_prompts,
                   context_tokens=prompt_tokens + options.budget.bench_new_tokens // 2,
                   prompt_tokens=prompt_tokens, sample_ids=[t for e in encoded for t in e])
    bests = {b.role: best_predicted_gamma(
        ctx.latency, b.plan.architecture(target_arch), target_arch,
        _estimate(b).tokens_per_step,
        options.budget.max_gamma, ctx.context_tokens, b.head_vocab_size) for b in built}
    tick = stages.start("latency terms", len(built))
    terms: dict[str, MeasuredTerms] = {}
    for i, b in enumerate(built):
        src = b.same_as or b.role
        if src not in terms:
            terms[src] = _terms_for(ctx, b if b.same_as is None else next(x for x in built if x.role == src),
                                    sorted({options.budget.fixed_gamma, bests[src]}))
        terms[b.role] = terms[src]
        tick(i + 1, len(built))
    stages.done()
    if tuned is not None:  # same layers, widths and head size as the winner: the winner's timed terms hold
        terms[tuned.role] = terms["winner"]
    runs = _bench_all(ctx, built, bests, stages.start("bench", 1), extra=[tuned] if tuned else [])
    stages.done()
    result = _assemble(ctx, search, label, profile, machine, built, bests, runs, terms, stages, started,
                       len(trace_prompts), tuned)
    write_results(result, out)
    return result


def _assemble(ctx: _Context, search: SearchResult, label: str, profile: LatencyProfile,
              machine: MachineInfo, built: Sequence[RoleDrafter], bests: dict[str, int],
              runs: dict[str, dict[int, list[BenchResult]]], terms: dict[str, MeasuredTerms],
              stages: _Stages, started: float, n_traced: int,
              tuned: RoleDrafter | None = None) -> E2EResult:
    gpu = _gpu_model()
    rows = tuple(_row_for(ctx, b, gpu, runs[b.role], terms.get(b.role), bests[b.role]) for b in built)
    tuned_row = None if tuned is None else _row_for(ctx, tuned, None, runs[tuned.role], terms.get(tuned.role),
                                                     ctx.options.budget.fixed_gamma)
    all_runs = [r for b in built if b.same_as is None for rs in runs[b.role].values() for r in rs]
    target_tps = (statistics.median(r.arm("target").tokens_per_s for r in all_runs) if all_runs
                  else float("nan"))
    target_pred = 1000.0 / ctx.latency.predict_ms(ctx.target_arch, context_tokens=ctx.context_tokens)
    fid = fidelity(rows, ctx.options.budget.fixed_gamma)
    result = E2EResult(
        options=ctx.options, machine=replace(machine, load_average_after=load_average()), profile=label,
        profile_heldout_mape=getattr(profile, "heldout_mape", None), n_trace_prompts=n_traced,
        n_bench_prompts=len(ctx.bench_prompts), search=search, rows=rows,
        target_tokens_per_s=target_tps, target_predicted_tokens_per_s=target_pred, fidelity=fid, notes=(),
        stage_s=dict(stages.seconds), wall_s=round(time.perf_counter() - started, 1), out_dir=str(ctx.out),
        tuned=tuned_row)
    return replace(result, notes=tuple(honest_notes(result)))


def write_results(result: E2EResult, out: Path) -> tuple[Path, Path]:
    json_path, md_path = out / "results.json", out / "results.md"
    write_json(json_path, result.to_dict())
    md_path.write_text(results_markdown(result))
    return json_path, md_path
