"""`draftnas e2e`'s stages and what they are asked: the budget presets and options, then one
function per stage (profile, traces, the search through `search.plan_search`, the winner's plan
and the baselines built through `build.build_drafter` and exported, one drafter healed on one
domain, one bench run). `draftnas.e2e.run` runs them in order and assembles the analysis.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.acceptance.records import TraceOptions, held_out
from draftnas.acceptance.traces import load_traces, split_traces
from draftnas.acceptance.tracing import build_traces
from draftnas.bench.records import BenchResult
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.run import run_bench
from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.core.prompts import DOMAINS, load_prompts
from draftnas.core.records import write_json_file
from draftnas.core.registry import Architecture
from draftnas.drafter.build import build_drafter, choose_head, heal_options
from draftnas.drafter.heal.heal_data import HealData, data_from_traces
from draftnas.drafter.heal.heal_records import HealOptions
from draftnas.drafter.prune.plan import plan_pruning
from draftnas.drafter.records import PlanOptions, PruningPlan
from draftnas.e2e.records import ROLES, Budget, E2EOptions, RoleDrafter
from draftnas.export.folder import export_drafter, load_drafter
from draftnas.export.records import ExportInfo
from draftnas.latency.files import load_profile, save_profile
from draftnas.latency.measure import measure_profile
from draftnas.latency.records import ProfileOptions
from draftnas.search.loop import run_search
from draftnas.search.records import StudySettings
from draftnas.search.resolve import SearchRequest, plan_search
from draftnas.search.space import DepthRange, GammaRange
from draftnas.search.spaces import default_space_for, load_search_space

if TYPE_CHECKING:
    from draftnas.acceptance.traces import Traces
    from draftnas.core.prompts import Prompt
    from draftnas.latency.records import LatencyProfile
    from draftnas.models.sources import LoadedModel
    from draftnas.search.records import SearchResult
    from draftnas.search.space import SearchSpace


log = logging.getLogger(__name__)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (`core.records.write_json_file`, indented as e2e's files always were)."""
    write_json_file(path, data, indent=2)


def stage_profile(options: E2EOptions, out: Path, tick: Callable[[int, int], None]
                  ) -> tuple[LatencyProfile, str]:
    """The given or shipped profile, else out/profile.json (measured here once)."""

    if options.profile:
        from draftnas.search.pricing import resolve_profile

        label, given = resolve_profile(options.profile, search_space(options))
        return given, label
    path = out / "profile.json"
    if path.is_file():
        return load_profile(path), str(path)
    mode = "cuda-graph" if options.device == "cuda" else "eager"  # how the bench's loop runs there
    profile = measure_profile(ProfileOptions(quick=options.budget.profile_quick, seed=options.seed,
                                             threads=options.threads, device=options.device, mode=mode),
                              progress=tick)
    save_profile(profile, path)
    return profile, str(path)


def split_prompts(budget: Budget) -> tuple[tuple[Prompt, ...], tuple[Prompt, ...]]:
    """(trace prompts, bench prompts): every shipped domain, disjoint sets."""

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
                 tick: Callable[[int, int], None], device: str = "cpu") -> Path:
    """The target's greedy traces of `prompts` (it is loaded on `device`), written once."""

    path = out / "traces.safetensors"
    if path.is_file():
        return path
    options = TraceOptions(max_new_tokens=budget.trace_new_tokens, temperatures=(0.0,), seed=seed,
                           batch_size=min(len(prompts), 8), device=device)
    return build_traces(target, prompts, options, path, prompt_set="all", progress=tick)


def search_space(options: E2EOptions) -> SearchSpace:
    """The target's space with the budget's depth cap, gamma range and per-trial healing."""

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

    request = SearchRequest(
        target=options.target, space=search_space(options), profile=profile_spec, traces=str(traces),
        calibrate=False, device=options.device,
        study=StudySettings(n_trials=options.budget.trials, seed=options.seed,
                            storage=f"sqlite:///{(out / 'study.db').resolve()}", study_name="e2e",
                            run_dir=str(out)))
    search_options, predictor, evaluator = plan_search(request)
    return run_search(search_options, predictor, evaluator, progress=tick)


def deep_narrow_depth(winner: Architecture, narrow: Architecture, base_layers: int) -> int:
    """Layers of the `narrow` shape with about the winner's non-embedding parameters (> winner's depth)."""
    per_layer = max(narrow.layer_parameters(), 1)
    target = winner.num_hidden_layers * winner.layer_parameters()
    depth = max(winner.num_hidden_layers + 1, round(target / per_layer))
    return min(base_layers, depth)


def baseline_options(winner: PruningPlan, base: Architecture) -> dict[str, Any]:
    """PlanOptions for the baselines (first-k, deep-narrow, even), from the winner's plan."""

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


def _heal_options(options: E2EOptions, heal_traces: Traces) -> HealOptions | None:
    b = options.budget
    return heal_options(steps=b.heal_steps, batch_size=b.heal_batch_size, lr=b.heal_lr,
                        seq_len=b.heal_seq_len, seed=options.seed, n_records=len(heal_traces.records),
                        gamma=b.fixed_gamma, device=options.device)


def build_role(role: str, plan: PruningPlan, base: LoadedModel, traces: tuple[Traces, Traces],
               options: E2EOptions, out: Path, data: HealData | None = None) -> RoleDrafter:
    """`build.build_drafter` on the heal split (the budget's steps), estimated on the held-out
    split, exported to out/drafters/<role>; a re-run reads what an earlier run wrote."""

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
    write_json(record, drafter.to_dict())
    return drafter


def heal_and_held_out(traces_path: Path) -> tuple[Traces, Traces]:
    """(heal split, held-out split) of the greedy traces: the search's own split."""

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

    d = options.tuned_domain
    if d is None:
        return
    if d not in DOMAINS:
        raise option_error("tuned_domain", f"{d!r} is not a domain (allowed: {', '.join(DOMAINS)}, or none)")
    n = sum(p.domain == d for i, p in enumerate(trace_prompts) if not held_out(i))  # one record each
    if n < 2:
        raise option_error("tuned_domain", f"{d!r}: {n} traced {d} prompt(s) in the heal split, healing "
                                           "needs 2; raise the budget's trace_per_domain or set it to none")


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


def _bench_path(out: Path, role: str, gamma: int, repeat: int) -> Path:
    return out / "bench" / f"{role}-g{gamma}-r{repeat}.json"


def bench_one(target: LoadedModel, folder: str, prompts: Sequence[Prompt], gamma: int, repeat: int,
              options: E2EOptions, out: Path) -> BenchResult:

    path = _bench_path(out, Path(folder).name, gamma, repeat)
    if path.is_file():
        return BenchResult.from_dict(json.loads(path.read_text()))
    draft = load_drafter(folder, device=options.device)
    draft.model.eval()
    result = run_bench(target, draft, prompts, BenchOptions(
        gamma=gamma, max_new_tokens=options.budget.bench_new_tokens, seed=options.seed + repeat,
        hf_assisted=False, estimate=repeat == 0, device=options.device, rounds=1))  # e2e repeats itself
    write_json(path, result.to_dict())
    return result
