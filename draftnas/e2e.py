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
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.errors import InvalidInputError
from draftnas.prune import PruningPlan
from draftnas.record import Record
from draftnas.registry import Architecture

if TYPE_CHECKING:
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
GPU_PROFILE = "h100-sxm"


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
class MachineInfo(Record):
    cpu_model: str
    logical_cores: int
    torch_threads: int
    platform: str
    load_average_before: str
    load_average_after: str = ""
    versions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MeasuredTerms(Record):
    """Each latency of the model, measured alone (median ms over repeats) at one context length.

    verify_ms[str(g)]: the target over g + 1 new tokens; prefill_*_ms: one pass over the
    mean prompt (the analytical model ignores prefill).
    """

    context_tokens: int
    draft_ms: float
    target_ms: float
    verify_ms: dict[str, float]
    prefill_target_ms: float
    prefill_draft_ms: float
    prompt_tokens: int
    repeats: int


@dataclass(frozen=True)
class Prediction(Record):
    """The analytical model's figures for one drafter at one gamma (latencies from the profile)."""

    gamma: int
    tokens_per_step: float
    draft_ms: float
    verify_ms: float
    target_ms: float
    tokens_per_s: float
    speedup: float


@dataclass(frozen=True)
class Measured(Record):
    """Medians over repeats of the bench at one gamma."""

    gamma: int
    target_tokens_per_s: float
    tokens_per_s: float
    speedup: float
    speedup_spread: tuple[float, float]
    tokens_per_step: float
    mean_accepted_per_step: float
    bench_estimate_tokens_per_step: float | None
    lossless: bool | None
    repeats: int
    step_ms: float  # per speculative step, prefill removed
    target_token_ms: float  # per token of the target alone, prefill removed
    drafted_per_step: float


@dataclass(frozen=True)
class Decomposition(Record):
    """Predicted speedup with the model's terms replaced by measurements one at a time.

    Each `delta_*` is the change in predicted speedup that term's measurement makes;
    `overhead` is what remains (prefill, the Python loop, cache crops, generate()).
    """

    gamma: int
    predicted: float
    with_acceptance: float
    with_draft: float
    with_verify: float
    with_target: float
    measured: float
    delta_acceptance: float
    delta_draft: float
    delta_verify: float
    delta_target: float
    delta_overhead: float
    loop_overhead_ms_per_step: float
    target_overhead_ms_per_token: float
    worst_term: str


@dataclass(frozen=True)
class DrafterRow(Record):
    name: str
    role: str
    layers: tuple[int, ...]
    shape: str
    parameters: int
    non_embedding_parameters: int
    folder: str | None
    heal_top1_before: float | None
    heal_top1_after: float | None
    estimate_tokens_per_step: dict[str, float]
    estimate_per_domain: dict[str, dict[str, float]]
    predicted_best_gamma: int
    predicted: dict[str, Prediction]  # str(gamma) -> at fixed and best gamma
    measured: dict[str, Measured]
    terms: MeasuredTerms | None
    decomposition: dict[str, Decomposition]
    measured_per_domain: dict[str, dict[str, float]]
    gpu_predicted_speedup: float | None = None
    same_as: str | None = None


@dataclass(frozen=True)
class Fidelity(Record):
    """Predicted vs measured speedup across drafters (target alone excluded)."""

    n_drafters: int
    mape_fixed_gamma: float
    mape_best_gamma: float
    spearman_fixed_gamma: float | None
    spearman_best_gamma: float | None
    worst_terms: dict[str, str]


@dataclass(frozen=True)
class E2EResult(Record):
    options: E2EOptions
    machine: MachineInfo
    profile: str
    profile_heldout_mape: float | None
    n_trace_prompts: int
    n_bench_prompts: int
    search: dict[str, Any]
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


def _load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_info() -> MachineInfo:
    import torch

    from draftnas.provenance import package_versions

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return MachineInfo(cpu_model=cpu, logical_cores=os.cpu_count() or 1,
                       torch_threads=torch.get_num_threads(), platform=platform.platform(),
                       load_average_before=_load_average(),
                       versions=package_versions())


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None below 3 points or with no spread."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return None if sx == 0 or sy == 0 else cov / (sx * sy)


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error of `predicted` against `measured` (in %)."""
    pairs = [(p, m) for p, m in zip(predicted, measured, strict=True) if m]
    return 100.0 * statistics.fmean(abs(p - m) / abs(m) for p, m in pairs) if pairs else float("nan")


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
    from draftnas.latency import default_profile, load_profile, save_profile
    from draftnas.profile import ProfileOptions, measure_profile

    if options.profile:
        path = Path(options.profile).expanduser()
        if path.suffix == ".json" or path.is_file():
            return load_profile(path), str(path)
        return default_profile(options.profile), f"shipped {options.profile}"
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


def stage_search(options: E2EOptions, profile: LatencyProfile, label: str, traces: Path, out: Path,
                 tick: Callable[[int, int], None]) -> SearchResult:
    """The study (SQLite in the run folder: a re-run resumes it, a finished one returns at once)."""
    from draftnas.latency import LatencyModel
    from draftnas.search import SearchOptions, WeightsEvaluator, resolve_architecture, run_search

    space = search_space(options)
    target_arch = resolve_architecture(options.target)
    search_options = SearchOptions(
        target=options.target, target_arch=target_arch, base=options.target, base_arch=target_arch,
        space=space, profile=label, n_trials=options.budget.trials,
        storage=f"sqlite:///{(out / 'study.db').resolve()}", study_name="e2e", seed=options.seed,
        run_dir=str(out))
    evaluator = WeightsEvaluator(options.target, target_arch, traces, space, seed=options.seed)
    return run_search(search_options, LatencyModel.from_profile(profile), evaluator, progress=tick)


def search_summary(result: SearchResult) -> dict[str, Any]:
    top = [{"trial": r.number, "candidate": r.candidate.name, "shape": r.candidate.shape_label(),
            "parameters": r.candidate.parameters,
            "top1": r.acceptance.acceptance_rate,
            "predicted_speedup": r.throughput.speedup, "gamma": r.primary.gamma} for r in result.ranked[:8]]
    return {"study": result.study_name, "storage": result.storage, "counts": result.counts,
            "wall_s": result.wall_s, "top": top}


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


def _plan_key(plan: PruningPlan, vocab_size: int = 0) -> tuple[Any, ...]:
    return (plan.layers, plan.num_attention_heads, plan.num_key_value_heads, plan.intermediate_size,
            plan.kept_heads, plan.kept_kv_heads, plan.kept_channels, vocab_size)


@dataclass(frozen=True)
class BuiltDrafter(Record):
    """A healed, exported drafter and its acceptance estimate on the held-out traces."""

    role: str
    plan: PruningPlan
    folder: str
    heal: dict[str, Any] | None
    estimate: dict[str, Any]
    same_as: str | None = None
    vocab_size: int = 0  # rows of a reduced draft head (draftnas.vocab); 0 = the full vocabulary

    @property
    def head_vocab_size(self) -> int | None:
        return self.vocab_size or None

    @property
    def name(self) -> str:
        return self.plan.label(self.vocab_size or 0)


def heal_options(budget: Budget, seed: int, n_records: int) -> Any:
    from draftnas.distill import HealOptions

    return HealOptions(steps=max(budget.heal_steps, 1), batch_size=budget.heal_batch_size, lr=budget.heal_lr,
                       eval_every=0, max_seq_len=budget.heal_seq_len, seed=seed,
                       heldout_every=max(2, min(4, n_records)), gamma=budget.fixed_gamma)


def build_drafter(role: str, plan: PruningPlan, base: LoadedModel, traces: tuple[Traces, Traces],
                  options: E2EOptions, out: Path, data: Any = None, vocab_size: int = 0) -> BuiltDrafter:
    """apply_plan (+ the reduced draft head of `vocab_size` rows, chosen from the heal split's
    tokens as the search did) -> heal on the traces (the budget's steps) -> export -> estimate
    on held-out traces."""
    from draftnas.acceptance import estimate_acceptance
    from draftnas.distill import heal
    from draftnas.export import ExportInfo, export_drafter
    from draftnas.prune import apply_plan

    record = out / "drafters" / f"{role}.json"
    folder = out / "drafters" / role
    if record.is_file() and (folder / "draftnas.json").is_file():
        return BuiltDrafter.from_dict(json.loads(record.read_text()))
    heal_traces, held = traces
    drafter = apply_plan(base.model, plan)
    if vocab_size:
        from draftnas.vocab import apply_vocab_subset, subset_from_traces

        apply_vocab_subset(drafter, subset_from_traces(heal_traces, vocab_size, base.tokenizer,
                                                       source="e2e heal split"))
    h_options = heal_options(options.budget, options.seed, len(heal_traces.records))
    result = None
    if options.budget.heal_steps > 0:
        result = heal(drafter, heal_traces, h_options, tokenizer=base.tokenizer, data=data,
                      checkpoint_dir=out / "heal" / role)
    drafter.eval()
    estimate = estimate_acceptance(drafter, held, max_gamma=options.budget.max_gamma)
    info = ExportInfo(base=options.target, target=options.target, plan=plan, heal=result,
                      source=f"draftnas e2e ({role})", seed=options.seed, gamma=options.budget.fixed_gamma,
                      measured={"top1_agreement_heldout": estimate.top1_agreement})
    export_drafter(drafter, base.tokenizer, folder, info, force=True)
    built = BuiltDrafter(role=role, plan=plan, folder=str(folder), heal=result.to_dict() if result else None,
                         estimate=estimate.to_dict(), vocab_size=vocab_size)
    _write_json(record, built.to_dict())
    return built


def heal_and_held_out(traces_path: Path) -> tuple[Traces, Traces]:
    """(heal split, held-out split) of the greedy traces: the search's own split."""
    from draftnas.search import split_traces
    from draftnas.traces import load_traces

    held, rest = split_traces(load_traces(traces_path).select(temperature=0.0))
    return rest, held


def stage_drafters(winner: PruningPlan, base: LoadedModel, base_arch: Architecture,
                   traces: tuple[Traces, Traces], options: E2EOptions, out: Path,
                   tick: Callable[[int, int], None], winner_vocab: int = 0) -> list[BuiltDrafter]:
    """The winner and the three baselines, healed alike; a baseline equal to the winner is not rebuilt.

    `traces`: (heal split, held-out split). The winner keeps the reduced draft head the search
    chose (`winner_vocab` rows); the baselines are what one would build without a search: pruned
    layers under the base's full LM head.
    """
    from draftnas.distill import data_from_traces
    from draftnas.prune import plan_pruning

    plans: dict[str, PruningPlan] = {"winner": winner}
    for role, plan_options in baseline_options(winner, base_arch).items():
        plans[role] = plan_pruning(base.model, plan_options, tokenizer=base.tokenizer)
    data = data_from_traces(traces[0], heal_options(options.budget, options.seed, len(traces[0].records)))
    built: list[BuiltDrafter] = []
    vocab = {"winner": winner_vocab}
    for i, role in enumerate(ROLES):
        key = _plan_key(plans[role], vocab.get(role, 0))
        twin = next((b for b in built if _plan_key(b.plan, b.vocab_size) == key), None)
        if twin is not None:
            built.append(replace(twin, role=role, same_as=twin.role))
        else:
            built.append(build_drafter(role, plans[role], base, traces, options, out, data,
                                       vocab_size=vocab.get(role, 0)))
        tick(i + 1, len(ROLES))
    return built


def tuned_role(domain: str) -> str:
    return f"winner-{domain}"


def check_tuned_domain(options: E2EOptions, trace_prompts: Sequence[Prompt]) -> None:
    """Refuse, before any work, a tuned domain that is unknown or has too few traces to heal on."""
    from draftnas.prompts import DOMAINS
    from draftnas.search import held_out

    d = options.tuned_domain
    if d is None:
        return
    if d not in DOMAINS:
        raise InvalidInputError(f"tuned domain {d!r} unknown (allowed: {', '.join(DOMAINS)}, or none)")
    n = sum(p.domain == d for i, p in enumerate(trace_prompts) if not held_out(i))  # one record each
    if n < 2:
        raise InvalidInputError(f"tuned domain {d!r}: {n} traced {d} prompt(s) in the heal split, healing "
                                f"needs 2; raise the budget's trace_per_domain or pass --tuned-domain none")


def stage_tuned(winner: BuiltDrafter, base: LoadedModel, traces: tuple[Traces, Traces], domain: str,
                options: E2EOptions, out: Path) -> BuiltDrafter:
    """The winner's plan (and head size) healed with the same budget on ONE domain's heal traces.

    Held-out traces stay all four domains, so its per-domain estimate sits beside the winner's.
    The reduced head, if any, is chosen from that domain's tokens: part of tuning for it.
    """
    rest, held = traces
    return build_drafter(tuned_role(domain), winner.plan, base, (rest.select(domains=[domain]), held),
                         options, out, vocab_size=winner.vocab_size)


# ---------------------------------------------------------------- stage 5: each term measured alone


def _timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall ms of `fn` over `repeats` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def _forward_ms(model: Any, prompt: list[int], new_tokens: int, repeats: int) -> float:
    """One cached forward over `new_tokens` tokens after `prompt` (cache cropped back each call)."""
    import torch
    from transformers import DynamicCache

    from draftnas.speculative import crop_cache

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        feed = torch.tensor([prompt[-new_tokens:] if len(prompt) >= new_tokens else [0] * new_tokens])

        def step() -> None:
            model(input_ids=feed, past_key_values=cache, use_cache=True, logits_to_keep=new_tokens)
            crop_cache(cache, len(prompt))

        return _timed(step, repeats)


def _prefill_ms(model: Any, prompt: list[int], repeats: int) -> float:
    import torch

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        return _timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1), max(3, repeats // 3))


def measure_terms(target: Any, drafter: Any, prompt_ids: Sequence[int], context_tokens: int,
                  gammas: Sequence[int], repeats: int, prompt_tokens: int) -> MeasuredTerms:
    """Each latency the analytical model uses, timed alone at `context_tokens` of KV cache."""
    ids = list(prompt_ids)
    context = (ids * (context_tokens // max(len(ids), 1) + 1))[:context_tokens]
    prompt = (ids * (prompt_tokens // max(len(ids), 1) + 1))[:prompt_tokens]
    return MeasuredTerms(
        context_tokens=context_tokens, draft_ms=_forward_ms(drafter, context, 1, repeats),
        target_ms=_forward_ms(target, context, 1, repeats),
        verify_ms={str(g): _forward_ms(target, context, g + 1, repeats) for g in sorted(set(gammas))},
        prefill_target_ms=_prefill_ms(target, prompt, repeats),
        prefill_draft_ms=_prefill_ms(drafter, prompt, repeats),
        prompt_tokens=prompt_tokens, repeats=repeats)


# ---------------------------------------------------------------- predictions and the analysis (pure)


def predict(model: LatencyModel, drafter: Architecture, target: Architecture, tokens_per_step: float,
            gamma: int, context_tokens: int, head_vocab_size: int | None = None) -> Prediction:
    """`head_vocab_size`: rows of the drafter's reduced LM head (None: the full vocabulary)."""
    from draftnas.throughput import predict_throughput

    draft_ms = model.predict_ms(drafter, new_tokens=1, context_tokens=context_tokens,
                                head_vocab_size=head_vocab_size)
    target_ms = model.predict_ms(target, new_tokens=1, context_tokens=context_tokens)
    verify_ms = model.predict_ms(target, new_tokens=gamma + 1, context_tokens=context_tokens)
    est = predict_throughput(gamma=gamma, draft_ms=draft_ms, target_ms=target_ms, verify_ms=verify_ms,
                             tokens_per_step=min(max(tokens_per_step, 1.0), gamma + 1.0))
    return Prediction(gamma=gamma, tokens_per_step=est.tokens_per_step, draft_ms=draft_ms,
                      verify_ms=est.verify_ms, target_ms=target_ms, tokens_per_s=est.tokens_per_s,
                      speedup=est.speedup)


def best_predicted_gamma(model: LatencyModel, drafter: Architecture, target: Architecture,
                         tokens_per_step: dict[str, float], max_gamma: int, context_tokens: int,
                         head_vocab_size: int | None = None) -> int:
    """The gamma >= 1 with the highest predicted tokens/s (gamma 0 is the target alone, benched anyway)."""
    def tokens_per_s(g: int) -> float:
        return predict(model, drafter, target, tokens_per_step[str(g)], g, context_tokens,
                       head_vocab_size).tokens_per_s

    return max(range(1, max_gamma + 1), key=tokens_per_s)


def _speedup(tokens: float, gamma: float, draft_ms: float, verify_ms: float, target_ms: float) -> float:
    return tokens * target_ms / (gamma * draft_ms + verify_ms)


def decompose(pred: Prediction, meas: Measured, terms: MeasuredTerms) -> Decomposition:
    """Swap the model's terms for measured ones in order acceptance, draft, verify, target.

    The acceptance swap also uses the loop's real drafts per step (fewer than gamma at the
    end of a budget or after an end-of-sequence token). What is left is overhead the model
    omits: prefill and per-step Python/cache work (`loop_overhead_ms_per_step`, from the
    loop's measured step time minus its measured forwards).
    """
    g, d = pred.gamma, meas.drafted_per_step
    verify = terms.verify_ms.get(str(g), pred.verify_ms)
    s0 = pred.speedup
    s1 = _speedup(meas.tokens_per_step, d, pred.draft_ms, pred.verify_ms, pred.target_ms)
    s2 = _speedup(meas.tokens_per_step, d, terms.draft_ms, pred.verify_ms, pred.target_ms)
    s3 = _speedup(meas.tokens_per_step, d, terms.draft_ms, verify, pred.target_ms)
    s4 = _speedup(meas.tokens_per_step, d, terms.draft_ms, verify, terms.target_ms)
    deltas = {"acceptance": s1 - s0, "draft latency": s2 - s1, "verify latency": s3 - s2,
              "target latency": s4 - s3, "loop overheads": meas.speedup - s4}
    return Decomposition(
        gamma=g, predicted=s0, with_acceptance=s1, with_draft=s2, with_verify=s3, with_target=s4,
        measured=meas.speedup, delta_acceptance=deltas["acceptance"], delta_draft=deltas["draft latency"],
        delta_verify=deltas["verify latency"], delta_target=deltas["target latency"],
        delta_overhead=deltas["loop overheads"],
        loop_overhead_ms_per_step=meas.step_ms - (d * terms.draft_ms + verify),
        target_overhead_ms_per_token=meas.target_token_ms - terms.target_ms,
        worst_term=max(deltas, key=lambda k: abs(deltas[k])))


def fidelity(rows: Sequence[DrafterRow], fixed_gamma: int) -> Fidelity:
    """MAPE and Spearman of predicted vs measured speedup at the fixed and the best gamma."""
    distinct = [r for r in rows if r.same_as is None and r.measured]
    out: dict[str, Any] = {}
    worst: dict[str, str] = {}
    for key, pick in (("fixed", lambda r: str(fixed_gamma)), ("best", lambda r: str(r.predicted_best_gamma))):
        pred = [r.predicted[pick(r)].speedup for r in distinct]
        meas = [r.measured[pick(r)].speedup for r in distinct]
        out[f"mape_{key}_gamma"] = mape(pred, meas) if distinct else float("nan")
        out[f"spearman_{key}_gamma"] = spearman(pred, meas)
        for r in distinct:
            dec = r.decomposition.get(pick(r))
            if dec is not None and abs(dec.predicted - dec.measured) > 0.10 * abs(dec.measured):
                worst[f"{r.role}@{pick(r)}"] = dec.worst_term
    return Fidelity(n_drafters=len(distinct), worst_terms=worst, **out)


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


def summarize_bench(runs: Sequence[BenchResult], terms: MeasuredTerms) -> Measured:
    """Medians over repeats; per-step and per-token times with the measured prefill taken out."""
    rows = [p for r in runs for p in r.prompts]
    steps = max(sum(p.steps for p in rows), 1)
    prefill_spec = (terms.prefill_target_ms + terms.prefill_draft_ms) * len(rows)
    step_ms = (sum(p.draftnas_s for p in rows) * 1000.0 - prefill_spec) / steps
    target_token_ms = ((sum(p.target_s for p in rows) * 1000.0 - terms.prefill_target_ms * len(rows))
                       / max(sum(p.new_tokens for p in rows), 1))
    speedups = [r.draftnas_speedup for r in runs]
    estimate = next((r.predicted_tokens_per_step for r in runs if r.predicted_tokens_per_step is not None),
                    None)
    return Measured(
        gamma=runs[0].gamma, target_tokens_per_s=statistics.median(r.target_tokens_per_s for r in runs),
        tokens_per_s=statistics.median(r.draftnas_tokens_per_s for r in runs),
        speedup=statistics.median(speedups), speedup_spread=(min(speedups), max(speedups)),
        tokens_per_step=statistics.median(r.tokens_per_step for r in runs),
        mean_accepted_per_step=statistics.median(r.mean_accepted_per_step for r in runs),
        bench_estimate_tokens_per_step=estimate,
        lossless=None if runs[0].lossless is None else all(bool(r.lossless) for r in runs),
        repeats=len(runs), step_ms=step_ms, target_token_ms=target_token_ms,
        drafted_per_step=sum(p.drafted for p in rows) / steps)


def per_domain_measured(runs: Sequence[BenchResult]) -> dict[str, dict[str, float]]:
    by: dict[str, list[Any]] = {}
    for p in (p for r in runs for p in r.prompts):
        by.setdefault(p.domain, []).append(p)
    return {d: {"tokens_per_step": sum(p.draftnas_tokens for p in ps) / max(sum(p.steps for p in ps), 1),
                "acceptance_rate": sum(p.accepted for p in ps) / max(sum(p.drafted for p in ps), 1),
                "prompts": float(len({p.prompt_id for p in ps}))} for d, ps in sorted(by.items())}


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


def _row_for(ctx: _Context, built: BuiltDrafter, gpu: LatencyModel | None,
             runs: dict[int, list[BenchResult]], terms: MeasuredTerms | None, best: int) -> DrafterRow:
    arch = built.plan.architecture(ctx.target_arch)
    est = built.estimate
    tps: dict[str, float] = {str(k): float(v) for k, v in est["tokens_per_step"].items()}
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
    heal = built.heal or {}
    per_domain = {d: {"top1": float(v["top1_agreement"]),
                      "tokens_per_step": float(v["tokens_per_step"][str(fixed)]),
                      "prompts": float(v["n_prompts"])} for d, v in est.get("per_domain", {}).items()}
    head = f", head {built.vocab_size}" if built.vocab_size else ""
    return DrafterRow(
        name=built.name, role=built.role, layers=built.plan.layers,
        shape=f"{arch.num_hidden_layers} x {arch.hidden_size} (q{arch.num_attention_heads}/"
              f"kv{arch.num_key_value_heads}, mlp {arch.intermediate_size}{head})",
        parameters=arch.parameters_with_head(built.head_vocab_size),
        non_embedding_parameters=arch.non_embedding_parameters(),
        folder=built.folder, heal_top1_before=heal.get("top1_before"), heal_top1_after=heal.get("top1_after"),
        estimate_tokens_per_step=tps, estimate_per_domain=per_domain, predicted_best_gamma=best,
        predicted=predicted, measured=measured, terms=terms, decomposition=decomposition,
        measured_per_domain=per_domain_measured(runs.get(fixed, [])), gpu_predicted_speedup=gpu_speedup,
        same_as=built.same_as)


def _gpu_model() -> LatencyModel | None:
    from draftnas.errors import DraftnasError
    from draftnas.latency import LatencyModel, default_profile

    try:
        return LatencyModel.from_profile(default_profile(GPU_PROFILE))
    except DraftnasError:
        return None


def _bench_all(ctx: _Context, built: Sequence[BuiltDrafter], bests: dict[str, int],
               tick: Callable[[int, int], None],
               extra: Sequence[BuiltDrafter] = ()) -> dict[str, dict[int, list[BenchResult]]]:
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


def _terms_for(ctx: _Context, built: BuiltDrafter, gammas: Sequence[int]) -> MeasuredTerms:
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
    search = stage_search(options, profile, label, traces_path, out,
                          stages.start("search", options.budget.trials))
    stages.done()
    if search.best is None or search.best.candidate.plan is None:
        raise InvalidInputError(f"the search finished no trial with a pruning plan (study "
                                f"{search.study_name}); see its storage for the failures")
    winner = PruningPlan.from_data(search.best.candidate.plan)
    target_arch = resolve_architecture(options.target)
    traces = heal_and_held_out(traces_path)
    built = stage_drafters(winner, target, target_arch, traces, options, out,
                           stages.start("heal + export", len(ROLES)),
                           winner_vocab=search.best.candidate.head_vocab_size or 0)
    stages.done()
    tuned: BuiltDrafter | None = None
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
        {str(k): float(v) for k, v in b.estimate["tokens_per_step"].items()},
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
              machine: MachineInfo, built: Sequence[BuiltDrafter], bests: dict[str, int],
              runs: dict[str, dict[int, list[BenchResult]]], terms: dict[str, MeasuredTerms],
              stages: _Stages, started: float, n_traced: int,
              tuned: BuiltDrafter | None = None) -> E2EResult:
    gpu = _gpu_model()
    rows = tuple(_row_for(ctx, b, gpu, runs[b.role], terms.get(b.role), bests[b.role]) for b in built)
    tuned_row = None if tuned is None else _row_for(ctx, tuned, None, runs[tuned.role], terms.get(tuned.role),
                                                     ctx.options.budget.fixed_gamma)
    all_runs = [r for b in built if b.same_as is None for rs in runs[b.role].values() for r in rs]
    target_tps = statistics.median(r.target_tokens_per_s for r in all_runs) if all_runs else float("nan")
    target_pred = 1000.0 / ctx.latency.predict_ms(ctx.target_arch, context_tokens=ctx.context_tokens)
    fid = fidelity(rows, ctx.options.budget.fixed_gamma)
    result = E2EResult(
        options=ctx.options, machine=replace(machine, load_average_after=_load_average()), profile=label,
        profile_heldout_mape=getattr(profile, "heldout_mape", None), n_trace_prompts=n_traced,
        n_bench_prompts=len(ctx.bench_prompts), search=search_summary(search), rows=rows,
        target_tokens_per_s=target_tps, target_predicted_tokens_per_s=target_pred, fidelity=fid, notes=(),
        stage_s=dict(stages.seconds), wall_s=round(time.perf_counter() - started, 1), out_dir=str(ctx.out),
        tuned=tuned_row)
    return replace(result, notes=tuple(honest_notes(result)))


# ---------------------------------------------------------------- what the figures say, and the files


def _best_measured(row: DrafterRow) -> Measured | None:
    return max(row.measured.values(), key=lambda m: m.speedup, default=None)


def honest_notes(result: E2EResult) -> list[str]:
    """Plain sentences on what was measured: who won, whether speculation paid, what a GPU implies."""
    notes = []
    scored = [(r, m) for r in result.rows if r.same_as is None and (m := _best_measured(r)) is not None]
    if not scored:
        return ["no drafter was benched"]
    top, top_m = max(scored, key=lambda rm: rm[1].speedup)
    winner = result.row("winner")
    verdict = "has" if top.role == "winner" else f"does NOT have (the {top.role} baseline does)"
    notes.append(f"the draftnas winner {winner.name} {verdict} the highest measured speedup: "
                 f"{top.name} {top_m.speedup:.3f}x at gamma {top_m.gamma}.")
    others = [(r, m) for r, m in scored if r is not top]
    if others:
        best_other = max(m.speedup_spread[1] for _, m in others)
        runner = max(m.speedup for _, m in others)
        apart = "apart" if top_m.speedup_spread[0] > best_other else "overlapping"
        notes.append(f"margin over the next drafter: {top_m.speedup / runner - 1:+.1%} (medians); repeats "
                     f"{apart}: the top's slowest {top_m.speedup_spread[0]:.3f}x vs the others' fastest "
                     f"{best_other:.3f}x.")
    if top_m.speedup < 1.0:
        notes.append(f"on this CPU speculative decoding does NOT beat the target alone for this target: best "
                     f"{top_m.tokens_per_s:.1f} tokens/s vs {top_m.target_tokens_per_s:.1f} tokens/s alone "
                     f"({top_m.speedup:.3f}x); acceptance after this healing budget is below break-even.")
    else:
        lo, hi = top_m.speedup_spread
        same = {True: "identical to", False: "NOT identical to", None: "not compared with"}[top_m.lossless]
        verdict = ("beats the target alone on this machine" if lo > 1.0 else
                   "only breaks even with the target alone on this machine (its repeats straddle 1x)")
        notes.append(f"speculative decoding with {top.name} {verdict}: "
                     f"{top_m.tokens_per_s:.1f} tokens/s vs {top_m.target_tokens_per_s:.1f} tokens/s alone "
                     f"({top_m.speedup:.3f}x, {lo:.3f}-{hi:.3f} over {top_m.repeats} repeats); greedy output "
                     f"{same} the target's.")
    notes += _edge_notes(result, winner)
    notes += _tuned_notes(result, winner)
    gpu = [(r, r.gpu_predicted_speedup) for r, _ in scored if r.gpu_predicted_speedup is not None]
    if gpu:
        r, s = max(gpu, key=lambda x: x[1] or 0.0)
        notes.append(f"with the measured acceptance, the {GPU_PROFILE} spec-sheet profile predicts "
                     f"{s:.2f}x for {r.name} (a GPU decode step of a 135M target costs about as much as a "
                     "few drafter layers, so depth, not parameters, sets the drafter's cost there).")
    f = result.fidelity
    notes.append(f"prediction fidelity over {f.n_drafters} drafters: MAPE {f.mape_best_gamma:.1f}% at the "
                 f"best gamma, {f.mape_fixed_gamma:.1f}% at the fixed gamma; Spearman "
                 f"{_fmt_opt(f.spearman_best_gamma)} / {_fmt_opt(f.spearman_fixed_gamma)}.")
    if f.worst_terms:
        terms = sorted(set(f.worst_terms.values()), key=list(f.worst_terms.values()).count, reverse=True)
        notes.append(f"off by more than 10%: {', '.join(f.worst_terms)}; largest term: {', '.join(terms)} "
                     "(see the decomposition table).")
    close = [r.name for r, m in scored if r is not top and m.speedup >= 0.98 * top_m.speedup]
    if close:
        notes.append(f"{', '.join(close)} measured within 2% of the top: a tie within noise here.")
    return notes


def _edge_notes(result: E2EResult, winner: DrafterRow) -> list[str]:
    """Where the winner's speedup over each baseline comes from: its draft step or its acceptance."""
    w = _best_measured(winner)
    if w is None or winner.terms is None:
        return []
    notes = []
    for row in result.rows:
        b = _best_measured(row)
        if row.role == "winner" or row.same_as or b is None or row.terms is None:
            continue
        notes.append(f"winner vs {row.role} {row.name}: {w.speedup:.3f}x vs {b.speedup:.3f}x; draft step "
                     f"{winner.terms.draft_ms:.1f} vs {row.terms.draft_ms:.1f} ms, tokens/step "
                     f"{w.tokens_per_step:.2f} (γ {w.gamma}) vs {b.tokens_per_step:.2f} (γ {b.gamma}).")
    return notes


def _tuned_notes(result: E2EResult, winner: DrafterRow) -> list[str]:
    """Does the drafter healed on one domain accept more there than the all-domain winner?"""
    t, d = result.tuned, result.options.tuned_domain
    if t is None or d is None:
        return []

    def top1(row: DrafterRow) -> dict[str, float]:
        return {k: v["top1"] for k, v in row.estimate_per_domain.items() if "top1" in v}

    tt, wt = top1(t), top1(winner)
    if d not in tt or d not in wt:
        return [f"the {d}-only drafter has no held-out {d} traces to score"]
    ranked = ", ".join(f"{k} {v:.3f}" for k, v in sorted(tt.items(), key=lambda kv: -kv[1]))
    others = [k for k in tt if k != d and k in wt]
    o_t = statistics.fmean(tt[k] for k in others) if others else float("nan")
    o_w = statistics.fmean(wt[k] for k in others) if others else float("nan")
    rival = max(others, key=lambda k: tt[k], default=None)
    where = (f"more on {d} than on any other domain" if rival is None or tt[d] > tt[rival] else
             f"NOT most on {d} ({rival} is as high or higher)")
    notes = [f"healed on {d} only ({t.role}, same plan and head size as the winner), the drafter accepts "
             f"{where}; top-1 on held-out traces: {ranked}.",
             f"against the winner healed on all four domains: {d} top-1 {tt[d]:.3f} vs {wt[d]:.3f} "
             f"({tt[d] - wt[d]:+.3f}); the other domains {o_t:.3f} vs {o_w:.3f} (mean, {o_t - o_w:+.3f})."]
    g = str(result.options.budget.fixed_gamma)
    tm, wm = t.measured_per_domain.get(d), winner.measured_per_domain.get(d)
    if g in t.measured and tm and wm:
        notes.append(f"benched at γ {g}: tokens/step on the {d} bench prompts {tm['tokens_per_step']:.2f} "
                     f"vs the winner's {wm['tokens_per_step']:.2f}; over all bench prompts "
                     f"{t.measured[g].speedup:.3f}x vs {winner.measured[g].speedup:.3f}x.")
    return notes


def _fmt_opt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def results_markdown(result: E2EResult) -> str:
    """The results table, the winner's per-domain acceptance, the decomposition and the notes."""
    b, m = result.options.budget, result.machine
    lines = [f"## draftnas e2e: {result.options.target} ({b.name} budget, seed {result.options.seed})", "",
             f"Machine: {m.cpu_model}, {m.logical_cores} logical cores, {m.torch_threads} torch threads; "
             f"load average {m.load_average_before} before, {m.load_average_after} after. "
             f"Profile: {result.profile}. Greedy, batch 1, {result.n_bench_prompts} bench prompts x "
             f"{b.bench_new_tokens} new tokens (not traced), median of {b.repeats} repeat(s); heal "
             f"{b.heal_steps} steps on {result.n_trace_prompts} traced prompts for every drafter. "
             f"Wall {result.wall_s / 60:.1f} min.", ""]
    head = ("| drafter | role | layers x width | params | draft ms (pred / meas) | tok/step meas (est) "
            "| γ | tok/s meas | speedup meas | tok/s pred | speedup pred | error |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    lines.append(f"| target alone | target | 30 layers | - | - | 1 | 0 | {result.target_tokens_per_s:.1f} | "
                 f"1.000x | {result.target_predicted_tokens_per_s:.1f} | 1.000x | - |")
    for r in result.rows:
        for g in sorted(r.measured, key=int):
            meas, pred = r.measured[g], r.predicted[g]
            tag = "fixed" if int(g) == b.fixed_gamma else "best"
            if int(g) == b.fixed_gamma and int(g) == r.predicted_best_gamma:
                tag = "fixed=best"
            draft_meas = f"{r.terms.draft_ms:.1f}" if r.terms else "-"
            err = 100.0 * (pred.speedup - meas.speedup) / meas.speedup
            same = f" (= {r.same_as})" if r.same_as else ""
            lines.append(
                f"| {r.name}{same} | {r.role} | {r.shape} | {r.parameters / 1e6:.1f}M | "
                f"{pred.draft_ms:.1f} / {draft_meas} | {meas.tokens_per_step:.2f} "
                f"({pred.tokens_per_step:.2f}) | {g} ({tag}) | {meas.tokens_per_s:.1f} | "
                f"{meas.speedup:.3f}x | {pred.tokens_per_s:.1f} | {pred.speedup:.3f}x | {err:+.1f}% |")
    lines += ["", *_domain_lines(result), "", *_decomposition_lines(result), "",
              "### What the figures say", ""]
    lines += [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def _domain_lines(result: E2EResult) -> list[str]:
    w = result.row("winner")
    g = result.options.budget.fixed_gamma
    lines = [f"### Per-domain acceptance of the winner {w.name} (γ = {g})", "",
             "| domain | top-1 (held-out traces) | tok/step est | tok/step measured (bench) "
             "| accept rate measured |",
             "|---|---|---|---|---|"]
    for d in sorted(set(w.estimate_per_domain) | set(w.measured_per_domain)):
        e, mm = w.estimate_per_domain.get(d, {}), w.measured_per_domain.get(d, {})
        lines.append(f"| {d} | {_fmt_opt(e.get('top1'), '.3f')} | {_fmt_opt(e.get('tokens_per_step'))} | "
                     f"{_fmt_opt(mm.get('tokens_per_step'))} | "
                     f"{_fmt_opt(mm.get('acceptance_rate'), '.3f')} |")
    t, dom = result.tuned, result.options.tuned_domain
    if t is None:
        return lines
    lines += ["", f"### The winner's plan healed on {dom} only ({t.role}: {t.name}, γ = {g})", "",
              f"Same layers, widths and head size as the winner and the same heal budget, on the {dom} "
              f"traces of the heal split only; scored on the same held-out traces (all domains) and benched "
              f"on the same prompts.", "",
              "| domain | top-1 all domains | top-1 " + f"{dom} only | tok/step measured all domains | "
              f"tok/step measured {dom} only |", "|---|---|---|---|---|"]
    for d in sorted(set(w.estimate_per_domain) | set(t.estimate_per_domain)):
        we, te = w.estimate_per_domain.get(d, {}), t.estimate_per_domain.get(d, {})
        wm, tm = w.measured_per_domain.get(d, {}), t.measured_per_domain.get(d, {})
        lines.append(f"| {d} | {_fmt_opt(we.get('top1'), '.3f')} | {_fmt_opt(te.get('top1'), '.3f')} | "
                     f"{_fmt_opt(wm.get('tokens_per_step'))} | {_fmt_opt(tm.get('tokens_per_step'))} |")
    m = t.measured.get(str(g))
    if m is not None:
        lines += ["", f"Over all bench prompts at γ = {g}: {m.speedup:.3f}x measured "
                      f"({m.speedup_spread[0]:.3f}-{m.speedup_spread[1]:.3f}), "
                      f"{t.predicted[str(g)].speedup:.3f}x predicted."]
    return lines


def _decomposition_lines(result: E2EResult) -> list[str]:
    lines = ["### Where the predicted speedup goes wrong (each term measured alone)", "",
             "| drafter | γ | predicted | + meas. acceptance | + meas. draft ms | + meas. verify ms | "
             "+ meas. target ms | measured | loop overhead ms/step | generate overhead ms/token | largest |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.rows:
        if r.same_as:
            continue
        for g, d in sorted(r.decomposition.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {r.name} | {g} | {d.predicted:.3f} | {d.with_acceptance:.3f} | "
                         f"{d.with_draft:.3f} | {d.with_verify:.3f} | {d.with_target:.3f} | "
                         f"{d.measured:.3f} | "
                         f"{d.loop_overhead_ms_per_step:.1f} | {d.target_overhead_ms_per_token:.1f} | "
                         f"{d.worst_term} |")
    return lines


def write_results(result: E2EResult, out: Path) -> tuple[Path, Path]:
    json_path, md_path = out / "results.json", out / "results.md"
    _write_json(json_path, result.to_dict())
    md_path.write_text(results_markdown(result))
    return json_path, md_path


__all__ = [
    "BUDGETS", "Budget", "DrafterRow", "E2EOptions", "E2EResult", "Fidelity", "MeasuredTerms",
    "budget_preset", "decompose", "fidelity", "machine_info", "mape", "results_markdown", "run_e2e",
    "spearman",
]
