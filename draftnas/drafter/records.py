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
from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option
from draftnas.core.records import TRANSIENT, Record
from draftnas.core.registry import Architecture
from draftnas.drafter.checks import index_problems, layer_problems, width_problems
from draftnas.drafter.importance import LAYER_SELECTION

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
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "plan" in data and isinstance(data["plan"], dict):
        data = data["plan"]  # a draftnas.json from an export
    return PruningPlan.from_data(data)


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
class HealOptions(Record):
    """How to heal. `steps` optimizer steps of `batch_size` sequences (prompt + continuation).

    lr: peak AdamW learning rate after `warmup_steps` (default: 10% of steps), cosine to 0.
    train: "layers" (kept decoder layers + final norm; embedding/LM head frozen), "all", or "lowrank"
    (rank-`rank` adapters over the decoder layers' linear layers, merged at the end; `drafter.adapters`).
    eval_every: steps between held-out readings (0: only before and after).
    heldout_every: every n-th prompt (or trace record) is held out for the readings.
    prompts / prompts_per_domain / max_new_tokens / data_temperature: self-distillation data in
    live mode (the target's continuations; generating them is most of a short run's cost).
    exclude_prompts: ids of prompts kept out of the live data altogether (e.g. the ones an
    acceptance estimate will be made on).
    written_prompts: in live mode, this many more user turns the target writes itself (each opening
    with the first words of a training prompt of the set), answered like the set's prompts and
    added to the training sequences only (chat models; other targets write none).
    teacher_topk: in live mode, keep the target's top-k probabilities at every continuation position
    while generating the data and train on them (the trace teacher's loss) instead of running the
    target at every step; 0 runs it at every step (full-vocabulary KL).
    max_seconds: stop early after this much training wall time (the search's budget).
    checkpoint_every: steps between checkpoints when a checkpoint folder is given.
    device: where the drafter trains; `heal` moves it (and a live teacher) there.
    """

    steps: int = option(150, help="Optimizer steps.", low=1)
    batch_size: int = option(4, help="Sequences per step.", low=1)
    lr: float = option(2e-3, help="Peak AdamW learning rate (cosine schedule).", low=0.0, low_open=True,
                       high=1.0)
    weight_decay: float = option(0.0, help="AdamW weight decay.", low=0.0, cli=False)
    warmup_steps: int | None = option(None, help="Warm-up steps (default: 10% of steps).", low=0, cli=False)
    train: str = option(
        "layers", help="What trains: layers (the kept layers and the final norm), all, or lowrank (a rank "
                       "--rank update on every linear layer of the decoder layers, merged into the weights "
                       "at the end: the healed drafter keeps its shape and kernels).",
        choices=("layers", "all", "lowrank"))
    rank: int = option(8, help="Rank of the low-rank updates (--train lowrank).", low=1, high=1024)
    # train "layers" on these drafter layer positions only (the final norm too): the layers next to a cut,
    # which a search healing within a budget trains (`drafter.plan.cut_neighbours`); () = every kept layer
    only_layers: tuple[int, ...] = option((), help="Drafter layers that train (default: all kept).",
                                          cli=False)
    eval_every: int = option(25, help="Steps between held-out readings (0: ends).", low=0)
    heldout_every: int = option(5, help="Every n-th prompt is held out for the readings.", low=2, cli=False)
    prompts: str = option("all", help="Prompt set for self-distillation data (live).")
    prompts_per_domain: int | None = option(10, flag="--per-domain", help="Prompts per domain for live data.",
                                            low=1)
    exclude_prompts: tuple[str, ...] = option((), help="Prompts kept out of the data.", cli=False)
    max_new_tokens: int = option(96, help="Target continuation length (live).", low=1)
    data_temperature: float = option(0.0, help="Temperature of the live data (0: greedy).", low=0.0,
                                     high=10.0, cli=False)
    written_prompts: int = option(
        0, low=0, help="Live: this many more training prompts the target writes itself, each opening with "
                       "the first words of a training prompt (chat models; export uses 128).")
    teacher_topk: int = option(
        0, low=0, help="Live: keep the target's top-k while making the data and train on it, with no target "
                       "forward per step (export uses 64); 0 runs the target at every step.")
    max_seq_len: int = option(384, help="Longest training sequence (tokens).", low=8, cli=False)
    gamma: int = option(4, help="Gamma of the held-out tokens-per-step reading.", low=1, cli=False)
    seed: int = option(0, help="Seed of the data order (and sampled data).")
    max_seconds: float | None = option(None, flag="--max-minutes", scale=60.0, low=0.0, low_open=True,
                                       help="Stop after this much training (minutes).")
    checkpoint_every: int = option(25, help="Steps between checkpoints.", low=1, cli=False)
    device: str = option("cpu", help="Device the drafter trains on (and a live teacher runs on).",
                         choices=DEVICES)

    def validate(self) -> HealOptions:
        extra = []
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            extra.append(("warmup_steps", f"must be in [0, steps={self.steps}], got {self.warmup_steps}"))
        return check_options(self, extra)


@dataclass(frozen=True)
class HealReading(Record):
    """A held-out reading: top-1 agreement and greedy tokens per step at `gamma`."""

    step: int
    train_s: float
    loss: float | None
    top1_agreement: float
    tokens_per_step: float


@dataclass(frozen=True)
class HealResult(Record):
    """What a healing run did and how much acceptance it bought."""

    teacher: str  # "live" | "target top-k" (live data, cached teacher) | "traces"
    steps: int
    resumed_from_step: int
    train_s: float
    data_s: float
    top1_before: float
    top1_after: float
    tokens_per_step_before: float
    tokens_per_step_after: float
    gamma: int
    top1_rise_per_minute: float
    n_train_sequences: int
    n_heldout_sequences: int
    n_heldout_positions: int
    trained_tokens: int
    trainable_parameters: int
    readings: tuple[HealReading, ...] = ()
    options: HealOptions = field(default_factory=HealOptions)
    kept: bool = True  # False: healing lowered held-out top-1, so the export kept the unhealed weights
    trained_prompts: tuple[str, ...] = ()  # `prompt_key` of every prompt the drafter was trained on
    n_written_sequences: int = 0  # of n_train_sequences, those whose prompt the target wrote itself


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A prompt's identity by its token ids (sha256, 12 hex digits): what healing records of the
    prompts it trained on, so an acceptance estimate can leave them out wherever its text came from."""
    return hashlib.sha256(json.dumps([int(i) for i in prompt_ids]).encode()).hexdigest()[:12]


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
