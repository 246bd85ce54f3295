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

Size: plans, their validation and the surgery that applies them (layers, GQA groups, channels, head)
plus importance measurement; apply and validate must agree field by field.
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
from draftnas.vocab import VocabSubset

if TYPE_CHECKING:  # pragma: no cover
    import torch

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
    `vocab` is the reduced draft head's kept full-vocabulary ids (`draftnas.vocab.VocabSubset`,
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

    def label(self) -> str:
        """Short readable name, e.g. `L4bi-h6kv2-i768` (`-v4096` with a reduced head of that many rows)."""
        return drafter_label(self.num_layers, self.layer_selection, self.num_attention_heads,
                             self.num_key_value_heads, self.intermediate_size, self.head_rows)

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


LAYER_SELECTION_CODES = {"first": "f", "even": "e", "block_influence": "bi", "explicit": "x"}


def drafter_label(layers: int, layer_selection: str, heads: int, kv_heads: int, intermediate_size: int,
                  head_rows: int = 0, hidden_ratio: float = 1.0) -> str:
    """The one name a drafter has everywhere (search table, export, bench, card, draftnas.json):
    `L{layers}{selection}-h{heads}kv{kv}-i{intermediate}`, then `-d{ratio}` for a narrowed hidden
    size and `-v{rows}` for a reduced LM head."""
    hidden = "" if hidden_ratio >= 1.0 else f"-d{hidden_ratio:g}"
    vocab = f"-v{head_rows}" if head_rows else ""
    return (f"L{layers}{LAYER_SELECTION_CODES.get(layer_selection, '?')}-h{heads}kv{kv_heads}"
            f"-i{intermediate_size}{hidden}{vocab}")


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
    if kv > base.num_key_value_heads:
        out.append(f"num_key_value_heads: {kv} (allowed: 1..{base.num_key_value_heads})")
    if kv >= 1 and h % kv == 0 and not 1 <= h // kv <= group:
        allowed = [kv * q for q in range(1, group + 1)]
        out.append(f"num_attention_heads: {h} with {kv} KV heads needs {h // kv} query heads per "
                   f"GQA group but the base has {group} (allowed: {allowed})")
    if inter > base.intermediate_size:
        out.append(f"intermediate_size: {inter} (allowed: 1..{base.intermediate_size})")
    if plan.vocab is not None and plan.vocab.vocab_size != base.vocab_size:
        out.append(f"vocab: ids of a {plan.vocab.vocab_size}-token vocabulary (allowed: the base's "
                   f"{base.vocab_size})")
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




# --------------------------------------------------------------------------- calibration

FALLBACK_TEXTS: tuple[str, ...] = (
    "What are three good habits for staying focused while working from home? Keep a fixed "
    "schedule, set up a quiet workspace, and take short breaks away from the screen.",
    "Explain the difference between weather and climate. Weather is what the sky does today; "
    "climate is the pattern of weather over many years in one place.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "Solve for x: 3x + 7 = 22. Subtract 7 from both sides to get 3x = 15, then divide by 3: x = 5.",
    "Translate to English: Le chat dort sur le canapé pendant que la pluie tombe dehors. "
    "The cat sleeps on the sofa while the rain falls outside.",
    "Write a short, friendly email asking a colleague to reschedule a meeting to Thursday. "
    "Hi Sam, would Thursday afternoon work for our meeting instead? Thanks a lot!",
    "The mitochondria is the powerhouse of the cell: it turns nutrients into ATP, the energy "
    "currency that every living cell uses to grow, move and divide.",
    "SELECT name, COUNT(*) AS orders FROM customers JOIN orders USING (customer_id) "
    "GROUP BY name ORDER BY orders DESC LIMIT 10;",
)


def calibration_texts() -> list[str]:
    """The shipped prompt set (`draftnas.prompts.load_prompts("all")`) when present, else a fallback."""
    try:
        from draftnas.prompts import load_prompts
    except ImportError:
        return list(FALLBACK_TEXTS)
    try:
        texts = [p.text for p in load_prompts("all")]
    except Exception as exc:  # noqa: BLE001 - a broken prompt set must not break pruning
        log.warning("prompt set unavailable (%s); using built-in calibration text", exc)
        return list(FALLBACK_TEXTS)
    return texts or list(FALLBACK_TEXTS)


def calibration_ids(tokenizer: Any, texts: Sequence[str] | None = None, *,
                    sequences: int = 8, seq_len: int = 128) -> torch.Tensor:
    """Token windows for calibration: texts joined with EOS, cut into `[sequences, seq_len]` ids.

    Short corpora are cycled so the shape is always the one asked for (no padding).
    """
    import torch

    texts = list(texts) if texts is not None else calibration_texts()
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    stream: list[int] = []
    for text in texts:
        stream += list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [eos]
    if not stream:
        raise PlanError("calibration: no tokens in the calibration text (allowed: non-empty texts)")
    need = sequences * seq_len
    while len(stream) < need:
        stream = stream + stream
    return torch.tensor(stream[:need], dtype=torch.long).view(sequences, seq_len)


# --------------------------------------------------------------------------- model access


def _decoder(model: Any) -> Any:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise PlanError(f"{type(model).__name__}: pruning needs a LLaMA-like decoder with "
                        "model.model.layers (allowed families: llama, qwen2)")
    return inner


def _check_llama_layer(layer: Any) -> None:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    if attn is None or mlp is None or not all(hasattr(attn, n) for n in names) or not all(
            hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        raise PlanError(f"{type(layer).__name__}: width pruning needs q/k/v/o_proj and "
                        "gate/up/down_proj (allowed families: llama, qwen2)")


def base_architecture(model: Any, name: str = "") -> Architecture:
    """Shape of a loaded model, read from its config."""
    return Architecture.from_hf_config(model.config, name=name)


# --------------------------------------------------------------------------- importance


@dataclass
class _Stats:
    """Per-layer calibration statistics gathered by forward hooks."""

    block_influence: list[float]
    channel_sq: list[Any]  # [I] sum of squared activations entering down_proj
    head_sq: list[Any]  # [H] sum of squared per-head contributions to o_proj's output
    tokens: int


def _collect_stats(model: Any, ids: torch.Tensor, *, width: bool) -> _Stats:
    """One forward pass over `ids` [B, T] with hooks on every decoder layer."""
    import torch

    layers = _decoder(model).layers
    n = len(layers)
    stats = _Stats([0.0] * n, [None] * n, [None] * n, int(ids.numel()))
    handles = []

    def block_hook(i: int) -> Any:
        def hook(_mod: Any, args: tuple, kwargs: dict, out: Any) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)  # [B, T]
            stats.block_influence[i] = float((1.0 - cos).mean())
        return hook

    def channel_hook(i: int) -> Any:
        def hook(_mod: Any, args: tuple) -> None:
            a = args[0].float()  # [B, T, I]
            stats.channel_sq[i] = a.pow(2).sum(dim=(0, 1))
        return hook

    def head_hook(i: int, o_proj: Any, head_dim: int) -> Any:
        def hook(_mod: Any, args: tuple) -> None:
            x = args[0].float()  # [B, T, H*d]
            heads = x.shape[-1] // head_dim
            x = x.reshape(-1, heads, head_dim)  # [N, H, d]
            w = o_proj.weight.float().reshape(-1, heads, head_dim)  # [hidden, H, d]
            contrib = torch.einsum("nhd,ohd->nho", x, w)  # [N, H, hidden]
            stats.head_sq[i] = contrib.pow(2).sum(dim=(0, 2))
        return hook

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(block_hook(i), with_kwargs=True))
        if width:
            _check_llama_layer(layer)
            attn = layer.self_attn
            handles.append(layer.mlp.down_proj.register_forward_pre_hook(channel_hook(i)))
            handles.append(attn.o_proj.register_forward_pre_hook(
                head_hook(i, attn.o_proj, attn.head_dim)))
    try:
        with torch.no_grad():
            model(input_ids=ids.to(next(model.parameters()).device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return stats


def _magnitude_scores(layer: Any) -> tuple[Any, Any]:
    """Weight-L2 importance: (heads [H], channels [I])."""
    attn, mlp = layer.self_attn, layer.mlp
    d = attn.head_dim
    q = attn.q_proj.weight.float()  # [H*d, hidden]
    o = attn.o_proj.weight.float()  # [hidden, H*d]
    heads = q.shape[0] // d
    head_sq = q.reshape(heads, d, -1).pow(2).sum(dim=(1, 2)) + o.reshape(
        o.shape[0], heads, d).pow(2).sum(dim=(0, 2))
    ch_sq = (mlp.gate_proj.weight.float().pow(2).sum(1) + mlp.up_proj.weight.float().pow(2).sum(1)
             + mlp.down_proj.weight.float().pow(2).sum(0))
    return head_sq.sqrt(), ch_sq.sqrt()


def _activation_scores(layer: Any, stats: _Stats, i: int) -> tuple[Any, Any]:
    """Activation-aware importance: per head ‖its contribution to o_proj's output‖,
    per channel ‖a_j‖·‖W_down[:, j]‖ (the norm of the channel's rank-1 contribution)."""
    down = layer.mlp.down_proj.weight.float()  # [hidden, I]
    channels = stats.channel_sq[i].sqrt() * down.norm(dim=0)
    return stats.head_sq[i].sqrt(), channels


def _top(scores: Any, k: int) -> tuple[int, ...]:
    """Indices of the k largest scores, ties to the lower index, returned ascending."""
    order = sorted(range(len(scores)), key=lambda j: (-float(scores[j]), j))
    return tuple(sorted(order[:k]))


def _select_heads(head_scores: Any, base_heads: int, base_kv: int, heads: int,
                  kv: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Keep the `kv` GQA groups with the largest summed head importance, then the
    `heads // kv` most important query heads inside each kept group."""
    group = base_heads // base_kv
    group_scores = [float(sum(head_scores[g * group:(g + 1) * group])) for g in range(base_kv)]
    kept_groups = _top(group_scores, kv)
    per_group = heads // kv
    kept: list[int] = []
    for g in kept_groups:
        local = _top([float(head_scores[g * group + j]) for j in range(group)], per_group)
        kept += [g * group + j for j in local]
    return tuple(kept), kept_groups


# --------------------------------------------------------------------------- planning


def _select_layers(options: PlanOptions, n: int, block_influence: Sequence[float] | None
                   ) -> tuple[tuple[int, ...], str]:
    if options.layers is not None:
        return tuple(options.layers), "explicit"
    k = n if options.num_layers is None else options.num_layers
    if not 1 <= k <= n:
        raise PlanError(f"num_layers: {k} (allowed: 1..{n})")
    sel = options.layer_selection
    if sel == "explicit":
        raise PlanError("layers: layer_selection 'explicit' needs the list of base layer indices "
                        f"(allowed: sorted unique indices in 0..{n - 1})")
    if sel == "first":
        return tuple(range(k)), sel
    if sel == "even":
        if k == 1:
            return (0,), sel
        return tuple(round(i * (n - 1) / (k - 1)) for i in range(k)), sel
    if sel == "block_influence":
        assert block_influence is not None
        return _top(list(block_influence), k), sel
    raise PlanError(f"layer_selection: {sel!r} (allowed: {', '.join(LAYER_SELECTIONS)})")


def block_influence(model: Any, ids: torch.Tensor) -> list[float]:
    """Block influence per layer, 1 − cos(layer input, layer output), mean over tokens of `ids` [B, T].

    Measured with hooks on each decoder layer (not `output_hidden_states`, whose last
    entry is taken after the final norm).
    """
    return _collect_stats(model, ids, width=False).block_influence


def plan_pruning(model: Any, options: PlanOptions, calibration: Any = None, *,
                 tokenizer: Any = None) -> PruningPlan:
    """Measure importance on `model` and return the plan `options` asks for.

    `calibration`: token ids `[B, T]`, or texts (with `tokenizer`), or None (the
    shipped prompts, with `tokenizer`). Needed only for block influence and
    activation importance.
    """
    base = base_architecture(model, options.base)
    heads = options.num_attention_heads or base.num_attention_heads
    kv = options.num_key_value_heads or base.num_key_value_heads
    inter = options.intermediate_size or base.intermediate_size
    prune_width = (heads, kv, inter) != (base.num_attention_heads, base.num_key_value_heads,
                                         base.intermediate_size)
    if options.importance not in IMPORTANCES:
        raise PlanError(f"importance: {options.importance!r} (allowed: {', '.join(IMPORTANCES)})")
    needs_data = (options.layers is None and options.layer_selection == "block_influence") or (
        prune_width and options.importance == "activation")
    stats = None
    if needs_data:
        ids = _calibration_tensor(calibration, tokenizer, options)
        stats = _collect_stats(model, ids, width=prune_width and options.importance == "activation")
        log.info("block influence: %s", [round(b, 3) for b in stats.block_influence])
    layers, selection = _select_layers(options, base.num_hidden_layers,
                                       stats.block_influence if stats else None)
    plan = PruningPlan(
        base=options.base or str(getattr(model.config, "name_or_path", "") or ""),
        base_num_layers=base.num_hidden_layers, layers=layers, layer_selection=selection,
        num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
        importance=options.importance,
    )
    plan.validate(base)
    if prune_width:
        plan = _with_width_indices(plan, model, base, stats)
        plan.validate(base)
    return plan


def _calibration_tensor(calibration: Any, tokenizer: Any, options: PlanOptions) -> torch.Tensor:
    import torch

    if isinstance(calibration, torch.Tensor):
        return calibration
    if tokenizer is None:
        raise PlanError("calibration: block influence and activation importance need token ids "
                        "or a tokenizer (allowed: a [B, T] id tensor, or texts with tokenizer=)")
    return calibration_ids(tokenizer, calibration, sequences=options.calibration_sequences,
                           seq_len=options.calibration_seq_len)


def _with_width_indices(plan: PruningPlan, model: Any, base: Architecture,
                        stats: _Stats | None) -> PruningPlan:
    from dataclasses import replace

    layers = _decoder(model).layers
    kept_heads, kept_kv, kept_ch = [], [], []
    for i in plan.layers:
        _check_llama_layer(layers[i])
        if plan.importance == "activation" and stats is not None:
            head_scores, ch_scores = _activation_scores(layers[i], stats, i)
        else:
            head_scores, ch_scores = _magnitude_scores(layers[i])
        h, g = _select_heads(head_scores.tolist(), base.num_attention_heads,
                             base.num_key_value_heads, plan.num_attention_heads,
                             plan.num_key_value_heads)
        kept_heads.append(h)
        kept_kv.append(g)
        kept_ch.append(_top(ch_scores.tolist(), plan.intermediate_size))
    return replace(plan, kept_heads=tuple(kept_heads), kept_kv_heads=tuple(kept_kv),
                   kept_channels=tuple(kept_ch))


# --------------------------------------------------------------------------- surgery


def _leading(plan: PruningPlan, base: Architecture) -> tuple[Indices, Indices, Indices]:
    """Kept indices per kept layer, filling `None` with the leading heads/groups/channels."""
    k = plan.num_layers
    group = base.num_attention_heads // base.num_key_value_heads
    per_group = plan.num_attention_heads // plan.num_key_value_heads
    kv = plan.kept_kv_heads or tuple(tuple(range(plan.num_key_value_heads)) for _ in range(k))
    heads = plan.kept_heads or tuple(
        tuple(g * group + j for g in row for j in range(per_group)) for row in kv)
    ch = plan.kept_channels or tuple(tuple(range(plan.intermediate_size)) for _ in range(k))
    return heads, kv, ch


def _slice_linear(linear: Any, index: Any, dim: int) -> Any:
    """A new nn.Linear keeping `index` rows (dim 0, output features) or columns (dim 1)."""
    import torch

    weight = linear.weight.detach().index_select(dim, index.to(linear.weight.device))
    bias = linear.bias
    if bias is not None and dim == 0:
        bias = bias.detach().index_select(0, index.to(bias.device))
    out = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                          device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight)
        if bias is not None:
            out.bias.copy_(bias)
    return out


def _rows(units: Sequence[int], size: int) -> torch.Tensor:
    """Row indices of whole `size`-wide units (heads of head_dim rows)."""
    import torch

    return torch.tensor([u * size + r for u in units for r in range(size)], dtype=torch.long)


def _slice_layer(layer: Any, heads: Sequence[int], kv: Sequence[int], channels: Sequence[int]) -> None:
    import torch

    attn, mlp = layer.self_attn, layer.mlp
    d = attn.head_dim
    attn.q_proj = _slice_linear(attn.q_proj, _rows(heads, d), 0)
    attn.k_proj = _slice_linear(attn.k_proj, _rows(kv, d), 0)
    attn.v_proj = _slice_linear(attn.v_proj, _rows(kv, d), 0)
    attn.o_proj = _slice_linear(attn.o_proj, _rows(heads, d), 1)
    attn.num_key_value_groups = len(heads) // len(kv)
    for name, value in (("num_heads", len(heads)), ("num_key_value_heads", len(kv))):
        if hasattr(attn, name):  # older transformers kept these on the module
            setattr(attn, name, value)
    ch = torch.tensor(list(channels), dtype=torch.long)
    mlp.gate_proj = _slice_linear(mlp.gate_proj, ch, 0)
    mlp.up_proj = _slice_linear(mlp.up_proj, ch, 0)
    mlp.down_proj = _slice_linear(mlp.down_proj, ch, 1)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = len(channels)


def apply_plan(model: Any, plan: PruningPlan, *, inplace: bool = False) -> Any:
    """The drafter `plan` makes from `model`: kept layers sliced to the plan's widths, and the
    reduced draft head when the plan carries one.

    Direct slicing of q/k/v/o and gate/up/down weights (whole KV groups, query heads
    inside kept groups), layers re-indexed 0..k-1 (`self_attn.layer_idx`, for the KV
    cache), and the config written from the real tensor shapes. The base is left
    untouched unless `inplace`. Deterministic: same base + plan -> identical weights.
    """
    import torch

    base = base_architecture(model)
    plan.validate(base)
    inner = _decoder(model)
    original = inner.layers
    inner.layers = torch.nn.ModuleList([original[i] for i in plan.layers])
    try:
        drafter = model if inplace else _copy_model(model)
    finally:
        if not inplace:
            inner.layers = original
    width_changed = (plan.num_attention_heads, plan.num_key_value_heads, plan.intermediate_size) != (
        base.num_attention_heads, base.num_key_value_heads, base.intermediate_size)
    layers = _decoder(drafter).layers
    if width_changed:
        heads, kv, ch = _leading(plan, base)
        for j, layer in enumerate(layers):
            _check_llama_layer(layer)
            _slice_layer(layer, heads[j], kv[j], ch[j])
    for j, layer in enumerate(layers):
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = j
    _write_config(drafter, plan)
    if plan.vocab is not None:
        from draftnas.vocab import apply_vocab_subset

        apply_vocab_subset(drafter, plan.vocab)
    return drafter


def _copy_model(model: Any) -> Any:
    import copy

    return copy.deepcopy(model)


def _write_config(drafter: Any, plan: PruningPlan) -> None:
    """Set the config from the tensor shapes of the kept layers (never from the plan's numbers)."""
    config = drafter.config
    layers = _decoder(drafter).layers
    shapes = {_layer_shape(layer) for layer in layers}
    if len(shapes) != 1:
        raise PlanError(f"layers: kept layers have different widths {sorted(shapes)} "
                        "(allowed: one width for all layers, LlamaConfig has no per-layer widths)")
    head_dim, heads, kv, inter = shapes.pop()
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list | tuple) and len(layer_types) == plan.base_num_layers:
        config.layer_types = [layer_types[i] for i in plan.layers]
    config.num_hidden_layers = len(layers)
    config.head_dim = head_dim
    config.num_attention_heads = heads
    config.num_key_value_heads = kv
    config.intermediate_size = inter
    for module in drafter.modules():  # submodules may hold their own config object
        sub = getattr(module, "config", None)
        if sub is not None and sub is not config and type(sub) is type(config):
            module.config = config


def _layer_shape(layer: Any) -> tuple[int, int, int, int]:
    attn = layer.self_attn
    d = attn.head_dim
    return (d, attn.q_proj.out_features // d, attn.k_proj.out_features // d,
            layer.mlp.down_proj.in_features)


__all__ = [
    "IMPORTANCES", "LAYER_SELECTIONS", "PlanOptions", "PruningPlan", "apply_plan", "block_influence",
    "calibration_ids", "calibration_texts", "load_plan", "plan_pruning",
]
