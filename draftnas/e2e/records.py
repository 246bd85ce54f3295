"""What `draftnas e2e` is asked (budget presets, options) and what it hands back.
"""


from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from draftnas.bench.records import DrafterRow, Fidelity
from draftnas.core.errors import InvalidInputError
from draftnas.core.records import MachineInfo, Record
from draftnas.drafter.records import BuiltDrafter, PruningPlan
from draftnas.search.records import SearchResult

ROLES = ("winner", "first-k", "deep-narrow", "even")


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
