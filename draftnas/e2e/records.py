"""What `draftnas e2e` is asked (budget presets, options) and what it hands back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from draftnas.bench.fidelity_records import DrafterRow, Fidelity
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option
from draftnas.core.records import MachineInfo, Record
from draftnas.drafter.records import BuiltDrafter, PruningPlan
from draftnas.search.records import SearchResult

ROLES = ("winner", "first-k", "deep-narrow", "even")


@dataclass(frozen=True)
class Budget(Record):
    """How much work each stage does (`BUDGETS` holds the named presets)."""

    name: str
    profile_quick: bool = option(True, help="Measure the quick profile grid.", cli=False)
    trace_per_domain: int = option(3, help="Traced prompts per domain.", low=1, cli=False)
    trace_new_tokens: int = option(48, help="Tokens traced per prompt.", low=1, cli=False)
    trials: int = option(6, help="Search trials.", low=1, cli=False)
    depth_max: int = option(8, help="Deepest drafter searched.", low=1, cli=False)
    search_heal_steps: int = option(6, help="Healing steps per trial.", low=0, cli=False)
    search_heal_seconds: float = option(30.0, help="Healing seconds per trial.", low=0.0, cli=False)
    heal_steps: int = option(20, help="Healing steps of each compared drafter.", low=0, cli=False)
    heal_batch_size: int = option(2, help="Healing sequences per step.", low=1, cli=False)
    heal_seq_len: int = option(160, help="Longest healing sequence.", low=8, cli=False)
    heal_lr: float = option(2e-3, help="Healing learning rate.", low=0.0, low_open=True, high=1.0, cli=False)
    bench_per_domain: int = option(1, help="Benched prompts per domain.", low=1, cli=False)
    bench_new_tokens: int = option(32, help="Tokens benched per prompt.", low=1, cli=False)
    repeats: int = option(1, help="Bench repeats (median).", low=1)
    fixed_gamma: int = option(3, help="The gamma every drafter is benched at.", low=1, cli=False)
    max_gamma: int = option(6, help="The largest gamma considered.", low=1, cli=False)
    term_repeats: int = option(9, help="Repeats of each latency term timed alone.", low=1, cli=False)

    def validate(self) -> Budget:
        extra = []
        if self.fixed_gamma > self.max_gamma:
            extra.append(("fixed_gamma", f"must be <= max_gamma {self.max_gamma}, got {self.fixed_gamma}"))
        return check_options(self, extra)


BUDGETS: dict[str, Budget] = {
    # a couple of minutes on a 2-core CPU: every stage runs on this machine (a device's shakedown), no figures
    "smoke": Budget(name="smoke", trace_per_domain=3, trace_new_tokens=10, trials=2, depth_max=2,
                    search_heal_steps=1, search_heal_seconds=5.0, heal_steps=2, heal_batch_size=2,
                    heal_seq_len=32, bench_per_domain=1, bench_new_tokens=8, repeats=1, fixed_gamma=2,
                    max_gamma=3, term_repeats=3),
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
        raise InvalidInputError(f"{name!r} is not a budget (allowed: {', '.join(BUDGETS)})")
    budget = replace(BUDGETS[name], **overrides)
    budget.validate()
    return budget


def _budget(value: str | Budget) -> Budget:
    return value if isinstance(value, Budget) else budget_preset(value)


def _domain(value: str | None) -> str | None:
    return None if value is None or value.lower() == "none" else value


@dataclass(frozen=True)
class E2EOptions(Record):
    """What `draftnas e2e` was asked. `repeats` overrides the budget's bench repeats."""

    target: str = option("smollm2-135m", short="-t", help="Target (and base) with weights.")
    out_dir: str = option("runs/e2e", flag="--out", help="Run folder (re-running resumes from it).")
    budget: Budget = option(
        factory=lambda: BUDGETS["quick"], cli_type=str, cli_default="quick",
        parse=_budget, help="smoke (every stage runs here, no figures), quick (minutes, proves the "
                            "machinery) or full (the README figures).")
    seed: int = option(0, help="Seed of the search, healing and benches.")
    profile: str | None = option(None, help="Latency profile JSON or shipped name (e.g. cpu); default: "
                                            "measure one into the run folder.")
    space: str | None = option(None, help="Search space YAML or shipped name (default: the target's).")
    threads: int | None = option(None, low=1, help="torch CPU threads (1 when other jobs load the CPU; "
                                                   "recorded with the figures).")
    tuned_domain: str | None = option(
        "translation", parse=_domain,
        help="Also heal the winner's plan on this domain's traces alone and bench it, to see whether it "
             "accepts more there (chat, translation, code, math, or none).")
    device: str = option("cpu", choices=DEVICES, help="Where every stage runs (the profile is timed as CUDA "
                                                      "graphs on a GPU; traces, healing, terms and benches).")
    repeats: int | None = option(None, low=1, help="Bench repeats (median); default: the budget's.")

    def __post_init__(self) -> None:
        if self.repeats is not None and self.repeats != self.budget.repeats:
            object.__setattr__(self, "budget", replace(self.budget, repeats=self.repeats))


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
