"""Pruning plans: which base layers, heads, KV groups and MLP channels a drafter keeps.

A `PruningPlan` is pure, JSON-serializable data (built first, applied second,
as in Torch-Pruning's plan/apply split). `plan_pruning` measures importance on a
real model and returns a plan; `apply_plan` does the surgery by slicing weight
matrices directly and writes the config from the resulting tensor shapes.
Re-applying a plan to the same base reproduces bit-identical weights.

Widths are uniform across kept layers: `LlamaConfig` has a single
`num_attention_heads`, `num_key_value_heads` and `intermediate_size`, so
per-layer widths cannot be expressed in a loadable config. The *which*
(kept indices) is per layer; the *how many* is shared.

Importing this module does not import torch (the search builds plans' shapes
with `PruningPlan.architecture` without weights).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from draftnas.errors import PlanError
from draftnas.record import Record
from draftnas.registry import Architecture

if TYPE_CHECKING:  # pragma: no cover
    import torch  # noqa: F401

log = logging.getLogger(__name__)

LayerSelection = Literal["first", "even", "block_influence", "explicit"]
Importance = Literal["magnitude", "activation"]
LAYER_SELECTIONS: tuple[str, ...] = ("first", "even", "block_influence", "explicit")
IMPORTANCES: tuple[str, ...] = ("magnitude", "activation")

Indices = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class PruningPlan(Record):
    """A replayable recipe turning a base model into a smaller drafter.

    `layers` are base layer indices (sorted, unique). Widths (`num_attention_heads`,
    `num_key_value_heads`, `intermediate_size`) are the same for every kept layer.
    `kept_heads[i]`, `kept_kv_heads[i]`, `kept_channels[i]` are base indices (sorted)
    of the query heads, KV heads (GQA groups) and MLP channels kept in kept layer i;
    `None` means the leading ones (all of them when the width is the base's).
    Query heads are kept in whole GQA groups: every kept KV head keeps exactly
    `num_attention_heads // num_key_value_heads` of its own query heads.
    `vocab_size` is reserved for a reduced draft vocabulary (issue 7); None = base's.
    """

    base: str
    base_num_layers: int
    layers: tuple[int, ...]
    layer_selection: str
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    importance: str = "activation"
    kept_heads: Indices | None = None
    kept_kv_heads: Indices | None = None
    kept_channels: Indices | None = None
    vocab_size: int | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def label(self) -> str:
        """Short readable name, e.g. `L4bi-h6kv2-i768`."""
        sel = {"first": "f", "even": "e", "block_influence": "bi", "explicit": "x"}
        return (f"L{self.num_layers}{sel.get(self.layer_selection, '?')}-h{self.num_attention_heads}"
                f"kv{self.num_key_value_heads}-i{self.intermediate_size}")

    def problems(self, base: Architecture | None = None) -> list[str]:
        """Every inconsistency, as 'field: message (allowed: ...)' strings; `base` adds range checks."""
        out: list[str] = []
        out += _layer_problems(self)
        out += _width_problems(self, base)
        out += _index_problems(self, base)
        return out

    def validate(self, base: Architecture | None = None) -> None:
        """Raise `PlanError` naming every bad field and its allowed values."""
        problems = self.problems(base)
        if problems:
            raise PlanError("invalid pruning plan: " + "; ".join(problems))

    def architecture(self, base: Architecture) -> Architecture:
        """Shape of the drafter this plan makes from `base` (validated; no torch)."""
        self.validate(base)
        return base.with_shape(
            name=f"{base.name}:{self.label()}",
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size or base.vocab_size,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_json(cls, text: str) -> PruningPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"pruning plan is not valid JSON: {exc}") from None
        return cls.from_data(data)

    @classmethod
    def from_data(cls, data: Any) -> PruningPlan:
        """From a `to_dict()` mapping (as stored in Optuna user_attrs); one-line error if malformed."""
        required = ("base", "base_num_layers", "layers", "layer_selection", "num_attention_heads",
                    "num_key_value_heads", "intermediate_size")
        if not isinstance(data, dict):
            raise PlanError(f"pruning plan must be a JSON object, got {type(data).__name__}")
        missing = [k for k in required if k not in data]
        if missing:
            raise PlanError(f"pruning plan lacks field(s) {', '.join(missing)}")
        return cls.from_dict(data)


@dataclass(frozen=True)
class PlanOptions(Record):
    """What `plan_pruning` should keep. None widths keep the base's width.

    `num_layers` with `layer_selection` first | even | block_influence, or `layers`
    (explicit base indices, implies "explicit"). Heads are counted in the pruned
    model: `num_attention_heads` must be a multiple of `num_key_value_heads`.
    Calibration (block influence, activation importance): `calibration_sequences`
    windows of `calibration_seq_len` tokens.
    """

    num_layers: int | None = None
    layer_selection: str = "first"
    layers: tuple[int, ...] | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    importance: str = "activation"
    base: str = ""
    calibration_sequences: int = 8
    calibration_seq_len: int = 128


def load_plan(path: str | Path) -> PruningPlan:
    """Read a plan written by `PruningPlan.save` (or `draftnas.json`'s "plan")."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"plan file not found: {path}")
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "plan" in data and isinstance(data["plan"], dict):
        data = data["plan"]  # a draftnas.json from an export
    return PruningPlan.from_data(data)


# --------------------------------------------------------------------------- validation


def _layer_problems(plan: PruningPlan) -> list[str]:
    out = []
    n = plan.base_num_layers
    if n < 1:
        out.append(f"base_num_layers: must be >= 1, got {n}")
    layers = list(plan.layers)
    if not layers:
        out.append(f"layers: must keep at least 1 layer (allowed: 1..{max(n, 1)} indices in 0..{n - 1})")
    if len(layers) > n >= 1:
        out.append(f"layers: keeps {len(layers)} layers but the base has {n} (allowed: 1..{n} indices)")
    bad = [i for i in layers if not 0 <= i < n]
    if bad:
        out.append(f"layers: indices {bad} out of range (allowed: 0..{n - 1})")
    if len(set(layers)) != len(layers):
        out.append("layers: indices must be unique")
    if layers != sorted(layers):
        out.append("layers: indices must be sorted ascending (the order of the base)")
    if plan.layer_selection not in LAYER_SELECTIONS:
        out.append(f"layer_selection: {plan.layer_selection!r} (allowed: {', '.join(LAYER_SELECTIONS)})")
    if plan.importance not in IMPORTANCES:
        out.append(f"importance: {plan.importance!r} (allowed: {', '.join(IMPORTANCES)})")
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _width_problems(plan: PruningPlan, base: Architecture | None) -> list[str]:
    out = []
    h, kv, inter = plan.num_attention_heads, plan.num_key_value_heads, plan.intermediate_size
    for name, value in (("num_attention_heads", h), ("num_key_value_heads", kv),
                        ("intermediate_size", inter)):
        if value < 1:
            out.append(f"{name}: must be >= 1, got {value}")
    if h >= 1 and kv >= 1 and h % kv:
        out.append(f"num_attention_heads: {h} is not a multiple of num_key_value_heads={kv} "
                   f"(allowed: multiples of {kv})")
    if base is None:
        return out
    if plan.base_num_layers != base.num_hidden_layers:
        out.append(f"base_num_layers: {plan.base_num_layers} but the base has "
                   f"{base.num_hidden_layers} layers (allowed: {base.num_hidden_layers})")
    group = base.num_attention_heads // max(base.num_key_value_heads, 1)
    if not 1 <= kv <= base.num_key_value_heads:
        out.append(f"num_key_value_heads: {kv} (allowed: 1..{base.num_key_value_heads})")
    if kv >= 1 and h % kv == 0 and not 1 <= h // kv <= group:
        allowed = [kv * q for q in range(1, group + 1)]
        out.append(f"num_attention_heads: {h} with {kv} KV heads needs {h // kv} query heads per "
                   f"GQA group but the base has {group} (allowed: {allowed})")
    if not 1 <= inter <= base.intermediate_size:
        out.append(f"intermediate_size: {inter} (allowed: 1..{base.intermediate_size})")
    if plan.vocab_size is not None and not 1 <= plan.vocab_size <= base.vocab_size:
        out.append(f"vocab_size: {plan.vocab_size} (allowed: None or 1..{base.vocab_size})")
    return out


def _index_problems(plan: PruningPlan, base: Architecture | None) -> list[str]:
    out: list[str] = []
    k = len(plan.layers)
    checks = (("kept_kv_heads", plan.kept_kv_heads, plan.num_key_value_heads,
               base.num_key_value_heads if base else None),
              ("kept_heads", plan.kept_heads, plan.num_attention_heads,
               base.num_attention_heads if base else None),
              ("kept_channels", plan.kept_channels, plan.intermediate_size,
               base.intermediate_size if base else None))
    for name, indices, width, limit in checks:
        if indices is None:
            continue
        if len(indices) != k:
            out.append(f"{name}: {len(indices)} entries for {k} kept layers (allowed: one per kept layer)")
            continue
        for i, row in enumerate(indices):
            problem = _row_problem(row, width, limit)
            if problem:
                out.append(f"{name}[{i}]: {problem}")
                break
    if not out and base is not None and plan.kept_heads is not None:
        out += _gqa_problems(plan, base)
    return out


def _row_problem(row: Sequence[int], width: int, limit: int | None) -> str | None:
    if len(row) != width:
        return f"keeps {len(row)} indices, the plan's width is {width} (allowed: exactly {width})"
    if list(row) != sorted(set(row)):
        return "indices must be unique and sorted ascending"
    if limit is not None and row and not (0 <= row[0] and row[-1] < limit):
        return f"indices out of range (allowed: 0..{limit - 1})"
    return None


def _gqa_problems(plan: PruningPlan, base: Architecture) -> list[str]:
    """Every kept query head must belong to a kept KV group, the same number per group."""
    group = base.num_attention_heads // base.num_key_value_heads
    per_group = plan.num_attention_heads // plan.num_key_value_heads
    kv_rows = plan.kept_kv_heads or tuple(
        tuple(range(plan.num_key_value_heads)) for _ in plan.layers)
    for i, (heads, kvs) in enumerate(zip(plan.kept_heads or (), kv_rows, strict=True)):
        counts = {g: 0 for g in kvs}
        for head in heads:
            g = head // group
            if g not in counts:
                return [f"kept_heads[{i}]: head {head} belongs to KV group {g}, which is not kept "
                        f"(allowed: heads of groups {list(kvs)}, {group} per base group)"]
            counts[g] += 1
        if any(c != per_group for c in counts.values()):
            return [f"kept_heads[{i}]: keeps {list(counts.values())} heads per KV group (allowed: "
                    f"exactly {per_group} per kept group, whole GQA groups)"]
    return []


__all__ = [
    "IMPORTANCES", "LAYER_SELECTIONS", "PlanOptions", "PruningPlan", "load_plan",
]
