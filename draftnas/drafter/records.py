"""What the drafter stage hands on: pruning plans (pure data, replayable), the reduced
draft head's kept ids, healing options and results, and the built drafter. No torch.

A `PruningPlan` is built first and applied second, as in Torch-Pruning's plan/apply split:
`drafter.plan.plan_pruning` measures importance and returns a plan; `drafter.surgery.apply_plan`
slices the weights. Widths are uniform across kept layers (`LlamaConfig` has one
`num_attention_heads`, `num_key_value_heads` and `intermediate_size`): the *which* (kept indices)
is per layer, the *how many* is shared.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.core.errors import InvalidInputError, PlanError
from draftnas.core.records import TRANSIENT, Record
from draftnas.core.registry import Architecture
from draftnas.drafter.heal.heal_records import HealResult
from draftnas.drafter.prune.checks import index_problems, layer_problems, width_problems
from draftnas.drafter.prune.importance import LAYER_SELECTION

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
    `vocab` is the reduced draft head's kept full-vocabulary ids (`draftnas.drafter.records.VocabSubset`,
    chosen from the target's traces when the plan was made); None keeps the base's LM head. With
    it, `apply_plan` replays the drafter bit for bit, head included, from the plan and the base.
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
    vocab: VocabSubset | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def head_rows(self) -> int:
        """Rows of the reduced draft head; 0 when the plan keeps the base's head."""
        return self.vocab.size if self.vocab is not None else 0

    def cut_neighbours(self) -> tuple[int, ...]:
        """Drafter layer positions next to a cut: each kept layer whose neighbour in the base (before or
        after it) was dropped; every kept layer when widths were pruned (each layer holds a cut)."""
        if any(k is not None for k in (self.kept_heads, self.kept_kv_heads, self.kept_channels)):
            return tuple(range(self.num_layers))
        kept = set(self.layers)
        return tuple(i for i, layer in enumerate(self.layers)
                     if any(0 <= n < self.base_num_layers and n not in kept for n in (layer - 1, layer + 1)))

    def label(self) -> str:
        """Short readable name, e.g. `L4bi-h6kv2-i768` (`-v4096` with a reduced head of that many rows)."""
        return drafter_label(self.num_layers, self.layer_selection, self.num_attention_heads,
                             self.num_key_value_heads, self.intermediate_size, self.head_rows)

    def problems(self, base: Architecture | None = None) -> list[str]:
        """Every inconsistency, as 'field: message (allowed: ...)' strings; `base` adds range checks."""
        out: list[str] = []
        out += layer_problems(self)
        out += width_problems(self, base)
        out += index_problems(self, base)
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


def drafter_label(layers: int, layer_selection: str, heads: int, kv_heads: int, intermediate_size: int,
                  head_rows: int = 0, hidden_ratio: float = 1.0) -> str:
    """The one name a drafter has everywhere (search table, export, bench, card, draftnas.json):
    `L{layers}{selection}-h{heads}kv{kv}-i{intermediate}`, then `-d{ratio}` for a narrowed hidden
    size and `-v{rows}` for a reduced LM head."""
    hidden = "" if hidden_ratio >= 1.0 else f"-d{hidden_ratio:g}"
    vocab = f"-v{head_rows}" if head_rows else ""
    code = LAYER_SELECTION[layer_selection].code if layer_selection in LAYER_SELECTION else "?"
    return f"L{layers}{code}-h{heads}kv{kv_heads}-i{intermediate_size}{hidden}{vocab}"


def load_plan(path: str | Path) -> PruningPlan:
    """Read a plan written by `PruningPlan.save` (or `draftnas.json`'s "plan")."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"plan file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlanError(f"plan file {path} is not readable JSON ({exc})") from None
    if isinstance(data, dict) and "plan" in data and isinstance(data["plan"], dict):
        data = data["plan"]  # a draftnas.json from an export
    try:
        return PruningPlan.from_data(data)
    except PlanError as exc:
        raise PlanError(f"plan file {path}: {exc}") from None


VOCAB_FILE = "draft_vocab.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class VocabSubset(Record):
    """Sorted unique full-vocabulary ids kept by a reduced draft head.

    ids: sorted kept ids (head row j predicts ``ids[j]``); vocab_size: the full
    vocabulary; source: where the ranking came from (e.g. a traces path);
    tokenizer_fingerprint: the traces' tokenizer (empty when unknown);
    coverage: share of the ranking tokens (trace continuations) inside the subset.
    """

    ids: tuple[int, ...]
    vocab_size: int
    source: str = ""
    tokenizer_fingerprint: str = ""
    coverage: float | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        ids = tuple(int(i) for i in self.ids)
        if not ids:
            raise InvalidInputError("vocab subset is empty (allowed: 1..vocab_size ids)")
        if list(ids) != sorted(set(ids)):
            raise InvalidInputError("vocab subset ids must be sorted and unique")
        if ids[0] < 0 or ids[-1] >= self.vocab_size:
            raise InvalidInputError(f"vocab subset ids must be in [0, {self.vocab_size - 1}]")
        object.__setattr__(self, "ids", ids)

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of the kept ids and the full vocabulary size."""
        payload = json.dumps([self.vocab_size, list(self.ids)]).encode()
        return hashlib.sha256(payload).hexdigest()[:16]

    def to_full(self, head_ids: Sequence[int]) -> list[int]:
        return [self.ids[int(i)] for i in head_ids]

    def to_head(self, full_ids: Sequence[int]) -> list[int]:
        """Head rows of full ids; -1 for ids outside the subset."""
        index = {t: j for j, t in enumerate(self.ids)}
        return [index.get(int(t), -1) for t in full_ids]

    def contains(self, full_id: int) -> bool:
        return int(full_id) in set(self.ids)

    def save(self, folder_or_file: str | Path) -> Path:
        path = Path(folder_or_file)
        if path.is_dir() or not path.suffix:
            path = path / VOCAB_FILE
        data = self.to_dict()
        data["fingerprint"] = self.fingerprint
        data["size"] = self.size
        path.write_text(json.dumps(data) + "\n")
        return path


def load_vocab_subset(folder_or_file: str | Path) -> VocabSubset:
    """Read a `draft_vocab.json` (a folder holding one, or the file)."""
    path = Path(folder_or_file)
    if path.is_dir():
        path = path / VOCAB_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidInputError(f"no draft vocabulary at {path} (expected {VOCAB_FILE})") from None
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or "ids" not in data or "vocab_size" not in data:
        raise InvalidInputError(f"{path}: a draft vocabulary needs 'ids' and 'vocab_size'")
    data.pop("fingerprint", None)
    data.pop("size", None)
    return VocabSubset.from_dict(data)


@dataclass(frozen=True)
class BuiltDrafter(Record):
    """A drafter built from a plan: the plan, what healing did, its acceptance on held-out traces
    (None when none were given), its parameter count (the reduced head counted as such), and the
    model itself (in memory only)."""

    plan: PruningPlan
    heal: HealResult | None = None
    estimate: AcceptanceEstimate | None = None
    parameters: int = 0
    model: Any = field(default=None, compare=False, repr=False, metadata=TRANSIENT)

    @property
    def name(self) -> str:
        return self.plan.label()
