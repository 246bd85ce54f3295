"""Candidates: one drafter the search proposes — the knobs chosen, and the shape they give.

A `CandidateChoice` is the point in the search space (depth, layer selection,
width ratios). `build_candidate` turns it into a `Candidate`: the drafter's
`Architecture` (HF config names) derived from the base's, plus — where widths
can be expressed as a `PruningPlan` — the plan's shape (layers picked by
"first"/"even" are known without weights; block influence is measured later by
`plan_pruning`). No torch here: the search scores thousands of these per second.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from draftnas.errors import PlanError
from draftnas.prune import PruningPlan, drafter_label
from draftnas.record import Record
from draftnas.registry import Architecture
from draftnas.space import SearchSpace


class InfeasibleCandidateError(PlanError):
    """A point of the search space that gives no usable drafter (pruned in the study, not crashed)."""


@dataclass(frozen=True)
class CandidateChoice(Record):
    """The knobs one trial chose (Optuna parameter names)."""

    depth: int
    layer_selection: str = "first"
    kv_head_ratio: float = 1.0
    query_head_ratio: float = 1.0
    mlp_ratio: float = 1.0
    hidden_ratio: float = 1.0
    vocab_size: int = 0  # rows of a reduced draft head (draftnas.vocab); 0 = the full vocabulary

    @classmethod
    def from_params(cls, params: dict[str, Any], space: SearchSpace) -> CandidateChoice:
        """From an Optuna trial's params; knobs with a single allowed value are not params."""
        w = space.width
        return cls(
            depth=int(params.get("depth", space.depth.min)),
            layer_selection=str(params.get("layer_selection", space.layer_selection[0])),
            kv_head_ratio=float(params.get("kv_head_ratio", w.kv_head_ratios[0])),
            query_head_ratio=float(params.get("query_head_ratio", w.query_head_ratios[0])),
            mlp_ratio=float(params.get("mlp_ratio", w.mlp_ratios[0])),
            hidden_ratio=float(params.get("hidden_ratio", w.hidden_ratios[0])),
            vocab_size=int(params.get("vocab_size", space.vocab_sizes[0])),
        )


@dataclass(frozen=True)
class Candidate(Record):
    """A drafter proposed by the search: its shape, the knobs, and (once planned) its plan.

    `plan`: before the drafter is built it is the shape-only plan (layer indices for
    first/even, widths, no kept indices or head ids); after, the measured plan the drafter was
    built from. None when the shape cannot be a plan (a pruned hidden size, latency-only).
    """

    name: str
    base: str
    arch: Architecture
    choice: CandidateChoice
    plan: PruningPlan | None = None

    @property
    def key(self) -> str:
        """Identity for de-duplication: same key, same drafter (the shape and layer picking)."""
        a = self.arch
        key = (f"{a.num_hidden_layers}|{self.choice.layer_selection}|{a.hidden_size}|"
               f"{a.num_attention_heads}|{a.num_key_value_heads}|{a.intermediate_size}")
        return key + (f"|v{self.choice.vocab_size}" if self.choice.vocab_size else "")

    @property
    def built_key(self) -> str:
        """Identity of the drafter actually built: the kept layers once the plan knows them (block
        influence and first-k that both keep layer 0 are one drafter), else `key`."""
        if self.plan is None:
            return self.key
        layers = self.plan.layers
        a = self.arch
        return (f"layers={','.join(map(str, layers))}|{a.hidden_size}|{a.num_attention_heads}|"
                f"{a.num_key_value_heads}|{a.intermediate_size}|v{self.choice.vocab_size}")

    @property
    def parameters(self) -> int:
        """All parameters, the reduced draft head (untied, `head_vocab_size` rows) counted as such."""
        return self.arch.parameters_with_head(self.head_vocab_size)

    @property
    def head_vocab_size(self) -> int | None:
        """Rows of the drafter's LM head: a reduced draft vocabulary, or None for the full one."""
        n = self.choice.vocab_size
        return n if n and n < self.arch.vocab_size else None

    def shape_label(self) -> str:
        """`layers x width`, e.g. `4 x 576 (q9/kv3, mlp 1536)`."""
        a = self.arch
        return (f"{a.num_hidden_layers} x {a.hidden_size} (q{a.num_attention_heads}/"
                f"kv{a.num_key_value_heads}, mlp {a.intermediate_size})")

    def with_plan(self, plan: PruningPlan, arch: Architecture | None = None) -> Candidate:
        return replace(self, plan=plan, arch=arch or self.arch)


def _kept(ratio: float, total: int) -> int:
    return max(1, min(total, round(ratio * total)))


def _rounded(ratio: float, total: int, multiple: int) -> int:
    if ratio >= 1.0:
        return total
    return max(multiple, min(total, round(ratio * total / multiple) * multiple))


def drafter_shape(base: Architecture, choice: CandidateChoice, channel_multiple: int = 8) -> Architecture:
    """The drafter's shape: `choice.depth` layers, widths from the ratios (see `WidthChoices`)."""
    group = base.num_attention_heads // max(base.num_key_value_heads, 1)
    kv = _kept(choice.kv_head_ratio, base.num_key_value_heads)
    q_per_group = _kept(choice.query_head_ratio, group)
    hidden = _rounded(choice.hidden_ratio, base.hidden_size, base.head_dim)
    intermediate = _rounded(choice.mlp_ratio, base.intermediate_size, channel_multiple)
    return base.with_shape(
        name=f"{base.name}:{_label(choice, kv * q_per_group, kv, intermediate)}",
        num_hidden_layers=choice.depth,
        hidden_size=hidden,
        num_attention_heads=kv * q_per_group,
        num_key_value_heads=kv,
        intermediate_size=intermediate,
    )


def _label(choice: CandidateChoice, heads: int, kv: int, intermediate_size: int) -> str:
    return drafter_label(choice.depth, choice.layer_selection, heads, kv, intermediate_size,
                         choice.vocab_size, choice.hidden_ratio)


def shape_plan(base: Architecture, base_spec: str, choice: CandidateChoice,
               arch: Architecture) -> PruningPlan | None:
    """The shape-only `PruningPlan` for this choice, or None if no plan can express it."""
    if arch.hidden_size != base.hidden_size:
        return None
    n, k = base.num_hidden_layers, choice.depth
    if choice.layer_selection == "first":
        layers: tuple[int, ...] = tuple(range(k))
    elif choice.layer_selection == "even":
        layers = tuple(sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})) if k > 1 else (0,)
    else:  # block influence is measured on weights by plan_pruning
        layers = tuple(range(k))
    return PruningPlan(base=base_spec, base_num_layers=n, layers=layers,
                       layer_selection=choice.layer_selection, num_attention_heads=arch.num_attention_heads,
                       num_key_value_heads=arch.num_key_value_heads,
                       intermediate_size=arch.intermediate_size)


def build_candidate(space: SearchSpace, base: Architecture, base_spec: str, choice: CandidateChoice,
                    target: Architecture | None = None) -> Candidate:
    """A candidate for `choice`; raises `InfeasibleCandidateError` with the reason if unusable."""
    problems = []
    if not 1 <= choice.depth <= base.num_hidden_layers:
        problems.append(f"depth {choice.depth} outside 1..{base.num_hidden_layers} layers of {base.name}")
    if choice.vocab_size and not 1 <= choice.vocab_size <= base.vocab_size:
        problems.append(f"draft vocabulary {choice.vocab_size} outside 1..{base.vocab_size}")
    if choice.layer_selection not in space.layer_selection:
        problems.append(f"layer selection {choice.layer_selection!r} not in the space "
                        f"({', '.join(space.layer_selection)})")
    if problems:
        raise InfeasibleCandidateError("; ".join(problems))
    arch = drafter_shape(base, choice, space.width.channel_multiple)
    problems = arch.problems()
    # a reduced draft head costs far less than its parameter count says (the full input embedding is
    # a lookup): the search's latency bound judges those instead
    if target is not None and not choice.vocab_size and arch.count_parameters() >= target.count_parameters():
        problems.append(f"drafter has {arch.count_parameters():,} parameters, not fewer than the "
                        f"target's {target.count_parameters():,}")
    if problems:
        raise InfeasibleCandidateError("; ".join(problems))
    return Candidate(name=arch.name.split(":", 1)[-1], base=base_spec, arch=arch, choice=choice,
                     plan=shape_plan(base, base_spec, choice, arch))
