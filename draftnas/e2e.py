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

Size: still about 690 lines, not the ~250-line orchestrator asked for: its stage functions (baseline
plans, bench and term jobs, row assembly) have not moved out yet; the arithmetic, rendering, drafter
building and machine facts have.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.bench import measure_terms, per_domain_measured, summarize_bench
from draftnas.build import BuiltDrafter, build_drafter, choose_head, heal_options
from draftnas.distill import HealData, HealOptions
from draftnas.errors import InvalidInputError
from draftnas.fidelity import (
    DrafterRow,
    Fidelity,
    MeasuredTerms,
    best_predicted_gamma,
    decompose,
    fidelity,
    predict,
)
from draftnas.machine import MachineInfo, load_average, machine_info
from draftnas.prune import PruningPlan
from draftnas.record import Record
from draftnas.registry import Architecture
from draftnas.report import E2E_GPU_PROFILE, honest_notes, results_markdown
from draftnas.search import SearchResult

if TYPE_CHECKING:
    from draftnas.acceptance import AcceptanceEstimate
    from draftnas.bench import BenchResult
    from draftnas.latency import LatencyModel, LatencyProfile
    from draftnas.prompts import Prompt
    from draftnas.search import SearchResult
    from draftnas.sources import LoadedModel
    from draftnas.space import SearchSpace
    from draftnas.traces import Traces

log = logging.getLogger(__name__)

StageProgress = Callable[[str, int, int], None]
ROLES = ("winner", "first-k", "deep-narrow", "even")


# ---------------------------------------------------------------- options and records


@dataclass(frozen=True)
class Budget(Record):
    """How much work each stage does (`BUDGETS` holds the named presets)."""

    name: str
    profile_quick: bool = True
    trace_per_domain: int = 3
    trace_new_tokens: int = 48
    trials: int = 6
    depth_max: int = 8
    search_heal_steps: int = 6
    search_heal_seconds: float = 30.0
    heal_steps: int = 20
    heal_batch_size: int = 2
    heal_seq_len: int = 160
    heal_lr: float = 2e-3
    bench_per_domain: int = 1
    bench_new_tokens: int = 32
    repeats: int = 1
    fixed_gamma: int = 3
    max_gamma: int = 6
    term_repeats: int = 9

    def validate(self) -> None:
        problems = [f"{k} must be >= 1, got {getattr(self, k)}" for k in (
            "trace_per_domain", "trace_new_tokens", "trials", "depth_max", "heal_batch_size",
            "bench_per_domain", "bench_new_tokens", "repeats", "fixed_gamma", "max_gamma", "term_repeats")
            if getattr(self, k) < 1]
        if self.fixed_gamma > self.max_gamma:
            problems.append(f"fixed_gamma {self.fixed_gamma} must be <= max_gamma {self.max_gamma}")
        if problems:
            raise InvalidInputError("invalid e2e budget: " + "; ".join(problems))


BUDGETS: dict[str, Budget] = {
    # minutes on a loaded 2-core CPU: proves the machinery, not the figures
    "quick": Budget(name="quick", trace_per_domain=3, trace_new_tokens=32, trials=4, depth_max=6,
                    search_heal_steps=4, search_heal_seconds=20.0, heal_steps=12, bench_per_domain=1,
                    bench_new_tokens=32, repeats=1, fixed_gamma=3, max_gamma=6, term_repeats=7),
    # the README figures: under an hour on a quiet 2-core CPU
    # (healing is data-bound: on 24 traced prompts a 1-layer drafter overfit by step 40 at top-1
    # 0.06-0.14; on all 112 non-bench prompts x 96 tokens it reaches 0.20, 2 layers 0.24)
    "full": Budget(name="full", profile_quick=True, trace_per_domain=28, trace_new_tokens=96, trials=12,
                   depth_max=8, search_heal_steps=30, search_heal_seconds=30.0, heal_steps=150,
                   heal_batch_size=8, heal_seq_len=256, bench_per_domain=3, bench_new_tokens=48, repeats=3,
                   fixed_gamma=3, max_gamma=6, term_repeats=15),
}


def budget_preset(name: str, **overrides: Any) -> Budget:
    if name not in BUDGETS:
        raise InvalidInputError(f"budget {name!r} unknown (allowed: {', '.join(BUDGETS)})")
    budget = replace(BUDGETS[name], **overrides)
    budget.validate()
    return budget


@dataclass(frozen=True)
class E2EOptions(Record):
    """What `draftnas e2e` was asked. `profile`: a profile JSON or shipped name (None = measure one).

    `space`: a search space YAML / shipped name (None = the target's shipped space).
    """

    target: str = "smollm2-135m"
    out_dir: str = "runs/e2e"
    budget: Budget = field(default_factory=lambda: BUDGETS["quick"])
    seed: int = 0
    profile: str | None = None
    space: str | None = None
    threads: int | None = None  # torch CPU threads (None: torch's default); 1 on an oversubscribed CPU
    tuned_domain: str | None = "translation"  # also heal the winner's plan on this domain alone


@dataclass(frozen=True)
class E2EResult(Record):
    options: E2EOptions
    machine: MachineInfo
    profile: str
    profile_heldout_mape: float | None
    n_trace_prompts: int
    n_bench_prompts: int
    search: SearchResult
    rows: tuple[DrafterRow, ...]
    target_tokens_per_s: float
    target_predicted_tokens_per_s: float
    fidelity: Fidelity
    notes: tuple[str, ...]
    stage_s: dict[str, float]
    wall_s: float
    out_dir: str
    tuned: DrafterRow | None = None  # the winner's plan healed on `options.tuned_domain` alone

    def row(self, role: str) -> DrafterRow:
        return next(r for r in self.rows if r.role == role)


# ---------------------------------------------------------------- small helpers


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


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


# ---------------------------------------------------------------- stages 1-3: profile, traces, search


def stage_profile(options: E2EOptions, out: Path, tick: Callable[[int, int], None]
                  ) -> tuple[LatencyProfile, str]:
    """The given or shipped profile, else out/profile.json (measured here once)."""
    from draftnas.latency import load_profile, save_profile
    from draftnas.profile import ProfileOptions, measure_profile

    if options.profile:
        from draftnas.search import resolve_profile

        label, given = resolve_profile(options.profile, search_space(options))
        return given, label
    path = out / "profile.json"
    if path.is_file():
        return load_profile(path), str(path)
    profile = measure_profile(ProfileOptions(quick=options.budget.profile_quick, seed=options.seed,
                                             threads=options.threads), progress=tick)
    save_profile(profile, path)
    return profile, str(path)


def split_prompts(budget: Budget) -> tuple[tuple[Prompt, ...], tuple[Prompt, ...]]:
    """(trace prompts, bench prompts): every shipped domain, disjoint sets."""
    from draftnas.prompts import load_prompts

    traced = load_prompts("all", per_domain=budget.trace_per_domain)
    ids = {p.id for p in traced}
    by_domain: dict[str, list[Prompt]] = {}
    for p in load_prompts("all"):
        if p.id not in ids:
            by_domain.setdefault(p.domain, []).append(p)
    if not by_domain:
        raise InvalidInputError("no shipped prompts left for the bench; lower trace_per_domain")
    bench = [p for items in by_domain.values()
             for p in items[:: max(1, len(items) // budget.bench_per_domain)][:budget.bench_per_domain]]
    return traced, tuple(bench)


def stage_traces(target: LoadedModel, prompts: Sequence[Prompt], budget: Budget, seed: int, out: Path,
                 tick: Callable[[int, int], None]) -> Path:
    from draftnas.traces import TraceOptions, build_traces

    path = out / "traces.safetensors"
    if path.is_file():
        return path
    options = TraceOptions(max_new_tokens=budget.trace_new_tokens, temperatures=(0.0,), seed=seed,
                           batch_size=min(len(prompts), 8))
    return build_traces(target, prompts, options, path, prompt_set="all", progress=tick)


def search_space(options: E2EOptions) -> SearchSpace:
    """The target's space with the budget's depth cap, gamma range and per-trial healing."""
    from draftnas.space import DepthRange, GammaRange, default_space_for, load_search_space

    space = load_search_space(options.space) if options.space else default_space_for(options.target)
    b = options.budget
    depth = DepthRange(min=space.depth.min, max=max(space.depth.min, min(space.depth.max, b.depth_max)),
                       step=space.depth.step)
    heal = replace(space.heal, steps=b.search_heal_steps, max_seconds=b.search_heal_seconds)
    return replace(space, depth=depth, heal=heal, gamma=GammaRange(min=1, max=b.max_gamma))


def stage_search(options: E2EOptions, profile_spec: str, traces: Path, out: Path,
                 tick: Callable[[int, int], None]) -> SearchResult:
    """The study, resolved by `search.plan_search` like `draftnas search` (SQLite in the run folder: a
    re-run resumes it, a finished one returns at once). No host calibration: the profile is this run's."""
    from draftnas.search import SearchRequest, StudySettings, plan_search, run_search

    request = SearchRequest(
        target=options.target, space=search_space(options), profile=profile_spec, traces=str(traces),
        calibrate=False, study=StudySettings(n_trials=options.budget.trials, seed=options.seed,
                                             storage=f"sqlite:///{(out / 'study.db').resolve()}",
                                             study_name="e2e", run_dir=str(out)))
    search_options, predictor, evaluator = plan_search(request)
    return run_search(search_options, predictor, evaluator, progress=tick)


# ---------------------------------------------------------------- stage 4: baselines, heal, export


def deep_narrow_depth(winner: Architecture, narrow: Architecture, base_layers: int) -> int:
    """Layers of the `narrow` shape with about the winner's non-embedding parameters (> winner's depth)."""
    per_layer = max(narrow.layer_parameters(), 1)
    target = winner.num_hidden_layers * winner.layer_parameters()
    depth = max(winner.num_hidden_layers + 1, round(target / per_layer))
    return min(base_layers, depth)


def baseline_options(winner: PruningPlan, base: Architecture) -> dict[str, Any]:
    """PlanOptions for the baselines (first-k, deep-narrow, even), from the winner's plan."""
    from draftnas.prune import PlanOptions

    k = winner.num_layers
    narrow_kv = 1  # one whole GQA group (its query heads), a quarter of the MLP: narrow, so deep
    narrow_q = base.num_attention_heads // max(base.num_key_value_heads, 1) * narrow_kv
    narrow_mlp = max(8, (base.intermediate_size // 4) // 8 * 8)
    narrow = base.with_shape(num_attention_heads=narrow_q, num_key_value_heads=narrow_kv,
                             intermediate_size=narrow_mlp)
    winner_arch = winner.architecture(base)
    depth = deep_narrow_depth(winner_arch, narrow, base.num_hidden_layers)
    common = PlanOptions(base=winner.base, calibration_sequences=4, calibration_seq_len=96)
    return {
        "first-k": replace(common, num_layers=k, layer_selection="first"),
        "deep-narrow": replace(common, num_layers=depth, layer_selection="first",
                               num_attention_heads=narrow_q, num_key_value_heads=narrow_kv,
                               intermediate_size=narrow_mlp),
        "even": replace(common, num_layers=k, layer_selection="even"),
    }


@dataclass(frozen=True)
class RoleDrafter(Record):
    """One drafter of the comparison: its role, the builder's record and its exported folder."""

    role: str
    built: BuiltDrafter
    folder: str
    same_as: str | None = None

    @property
    def plan(self) -> PruningPlan:
        return self.built.plan

    @property
    def name(self) -> str:
        return self.built.name

    @property
    def head_vocab_size(self) -> int | None:
        return self.plan.head_rows or None


def _heal_options(options: E2EOptions, heal_traces: Traces) -> HealOptions | None:
    b = options.budget
    return heal_options(steps=b.heal_steps, batch_size=b.heal_batch_size, lr=b.heal_lr,
                        seq_len=b.heal_seq_len, seed=options.seed, n_records=len(heal_traces.records),
                        gamma=b.fixed_gamma)


def build_role(role: str, plan: PruningPlan, base: LoadedModel, traces: tuple[Traces, Traces],
               options: E2EOptions, out: Path, data: HealData | None = None) -> RoleDrafter:
    """`build.build_drafter` on the heal split (the budget's steps), estimated on the held-out
    split, exported to out/drafters/<role>; a re-run reads what an earlier run wrote."""
    from draftnas.export import ExportInfo, export_drafter

    record = out / "drafters" / f"{role}.json"
    folder = out / "drafters" / role
    if record.is_file() and (folder / "draftnas.json").is_file():
        return RoleDrafter.from_dict(json.loads(record.read_text()))
    heal_traces, held = traces
    built = build_drafter(plan, base, heal=_heal_options(options, heal_traces), teacher=heal_traces,
                          data=data, held=held, max_gamma=options.budget.max_gamma,
                          checkpoint_dir=out / "heal" / role)
    assert built.estimate is not None
    info = ExportInfo(base=options.target, target=options.target, plan=plan, heal=built.heal,
                      source=f"draftnas e2e ({role})", seed=options.seed, gamma=options.budget.fixed_gamma,
                      measured={"top1_agreement_heldout": built.estimate.top1_agreement})
    export_drafter(built.model, base.tokenizer, folder, info, force=True)
    drafter = RoleDrafter(role=role, built=built, folder=str(folder))
    _write_json(record, drafter.to_dict())
    return drafter


def heal_and_held_out(traces_path: Path) -> tuple[Traces, Traces]:
    """(heal split, held-out split) of the greedy traces: the search's own split."""
    from draftnas.traces import load_traces, split_traces

    held, rest = split_traces(load_traces(traces_path).select(temperature=0.0))
    return rest, held


def stage_drafters(winner: PruningPlan, base: LoadedModel, base_arch: Architecture,
                   traces: tuple[Traces, Traces], options: E2EOptions, out: Path,
                   tick: Callable[[int, int], None]) -> list[RoleDrafter]:
    """The winner and the three baselines, healed alike; a baseline equal to another is not rebuilt.

    `traces`: (heal split, held-out split). The winner keeps the reduced draft head its plan
    carries; the baselines are what one would build without a search: pruned layers under the
    base's full LM head.
    """
    from draftnas.distill import data_from_traces
    from draftnas.prune import plan_pruning

    plans: dict[str, PruningPlan] = {"winner": winner}
    for role, plan_options in baseline_options(winner, base_arch).items():
        plans[role] = plan_pruning(base.model, plan_options, tokenizer=base.tokenizer)
    h = _heal_options(options, traces[0])
    data = data_from_traces(traces[0], h) if h is not None else None
    built: list[RoleDrafter] = []
    for i, role in enumerate(ROLES):
        twin = next((b for b in built if b.plan == plans[role]), None)
        if twin is not None:
            built.append(replace(twin, role=role, same_as=twin.role))
        else:
            built.append(build_role(role, plans[role], base, traces, options, out, data))
        tick(i + 1, len(ROLES))
    return built


def tuned_role(domain: str) -> str:
    return f"winner-{domain}"


def check_tuned_domain(options: E2EOptions, trace_prompts: Sequence[Prompt]) -> None:
    """Refuse, before any work, a tuned domain that is unknown or has too few traces to heal on."""
    from draftnas.prompts import DOMAINS
    from draftnas.traces import held_out

    d = options.tuned_domain
    if d is None:
        return
    if d not in DOMAINS:
        raise InvalidInputError(f"tuned domain {d!r} unknown (allowed: {', '.join(DOMAINS)}, or none)")
    n = sum(p.domain == d for i, p in enumerate(trace_prompts) if not held_out(i))  # one record each
    if n < 2:
        raise InvalidInputError(f"tuned domain {d!r}: {n} traced {d} prompt(s) in the heal split, healing "
                                f"needs 2; raise the budget's trace_per_domain or pass --tuned-domain none")


def stage_tuned(winner: RoleDrafter, base: LoadedModel, traces: tuple[Traces, Traces], domain: str,
                options: E2EOptions, out: Path) -> RoleDrafter:
    """The winner's plan healed with the same budget on ONE domain's heal traces.

    Held-out traces stay all four domains, so its per-domain estimate sits beside the winner's.
    A reduced head is chosen again from that domain's tokens (same size): part of tuning for it.
    """
    rest, held = traces
    domain_traces = rest.select(domains=[domain])
    plan = choose_head(winner.plan, winner.plan.head_rows, domain_traces, base.tokenizer,
                       source=f"e2e heal split, {domain} only")
    return build_role(tuned_role(domain), plan, base, (domain_traces, held), options, out)


# ---------------------------------------------------------------- stage 5: each term measured alone


# ---------------------------------------------------------------- predictions and the analysis (pure)


# ---------------------------------------------------------------- stage 6: bench


def _bench_path(out: Path, role: str, gamma: int, repeat: int) -> Path:
    return out / "bench" / f"{role}-g{gamma}-r{repeat}.json"


def bench_one(target: LoadedModel, folder: str, prompts: Sequence[Prompt], gamma: int, repeat: int,
              options: E2EOptions, out: Path) -> BenchResult:
    from draftnas.bench import BenchOptions, BenchResult, run_bench
    from draftnas.sources import load_model

    path = _bench_path(out, Path(folder).name, gamma, repeat)
    if path.is_file():
        return BenchResult.from_dict(json.loads(path.read_text()))
    draft = load_model(folder)
    draft.model.eval()
    result = run_bench(target, draft, prompts, BenchOptions(
        gamma=gamma, max_new_tokens=options.budget.bench_new_tokens, seed=options.seed + repeat,
        hf_assisted=False, estimate=repeat == 0))
    _write_json(path, result.to_dict())
    return result


# ---------------------------------------------------------------- the pipeline


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
    from draftnas.errors import DraftnasError
    from draftnas.latency import LatencyModel, default_profile

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
    from draftnas.sources import load_model

    path = ctx.out / "terms" / f"{built.role}.json"
    if path.is_file():
        return MeasuredTerms.from_dict(json.loads(path.read_text()))
    from draftnas.vocab import maybe_apply_saved_subset

    loaded = load_model(built.folder)
    draft = loaded.model.eval()
    maybe_apply_saved_subset(draft, loaded.folder)  # time the head the loop uses
    terms = measure_terms(ctx.target.model, draft, ctx.sample_ids, ctx.context_tokens, gammas,
                          ctx.options.budget.term_repeats, ctx.prompt_tokens)
    _write_json(path, terms.to_dict())
    return terms


def run_e2e(options: E2EOptions, *, progress: StageProgress | None = None) -> E2EResult:
    """Profile -> traces -> search -> heal + export winner and baselines -> terms -> bench -> analysis.

    Writes into `options.out_dir`: profile.json, traces.safetensors, study.db, drafters/,
    terms/, bench/, results.json and results.md. Returns the result record.
    """
    import torch

    from draftnas.latency import LatencyModel
    from draftnas.prompts import encode_prompt
    from draftnas.search import resolve_architecture
    from draftnas.sources import load_model

    options.budget.validate()
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
    target = load_model(options.target)
    target.model.eval()
    traces_path = stage_traces(target, trace_prompts, options.budget, options.seed, out,
                               stages.start("traces", len(trace_prompts)))
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
    target_tps = statistics.median(r.target_tokens_per_s for r in all_runs) if all_runs else float("nan")
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


# ---------------------------------------------------------------- what the figures say, and the files


def write_results(result: E2EResult, out: Path) -> tuple[Path, Path]:
    json_path, md_path = out / "results.json", out / "results.md"
    _write_json(json_path, result.to_dict())
    md_path.write_text(results_markdown(result))
    return json_path, md_path


__all__ = [
    "BUDGETS", "Budget", "DrafterRow", "E2EOptions", "E2EResult", "Fidelity", "MeasuredTerms",
    "budget_preset", "decompose", "fidelity", "machine_info", "results_markdown", "run_e2e",
]
