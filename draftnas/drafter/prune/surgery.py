"""Surgery: apply a `PruningPlan` to a model by slicing its weight matrices directly.

Kept layers re-indexed, q/k/v/o and gate/up/down sliced (whole KV groups, query heads inside kept
groups), the config written from the resulting tensor shapes, the reduced head applied when the
plan carries one. Re-applying a plan to the same base reproduces bit-identical weights.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from draftnas.core.errors import PlanError
from draftnas.core.registry import Architecture
from draftnas.drafter.records import Indices, PruningPlan


def decoder_of(model: Any) -> Any:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise PlanError(f"{type(model).__name__}: pruning needs a LLaMA-like decoder with "
                        "model.model.layers (allowed families: llama, qwen2)")
    return inner


def check_llama_layer(layer: Any) -> None:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    if attn is None or mlp is None or not all(hasattr(attn, n) for n in names) or not all(
            hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        raise PlanError(f"{type(layer).__name__}: width pruning needs q/k/v/o_proj and "
                        "gate/up/down_proj (allowed families: llama, qwen2)")


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

    return torch.tensor([u * size + r for u in units for r in range(size)], dtype=torch.long)


def _slice_layer(layer: Any, heads: Sequence[int], kv: Sequence[int], channels: Sequence[int]) -> None:
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

    base = base_architecture(model)
    plan.validate(base)
    inner = decoder_of(model)
    original = inner.layers
    inner.layers = torch.nn.ModuleList([original[i] for i in plan.layers])
    try:
        drafter = model if inplace else _copy_model(model)
    finally:
        if not inplace:
            inner.layers = original
    width_changed = (plan.num_attention_heads, plan.num_key_value_heads, plan.intermediate_size) != (
        base.num_attention_heads, base.num_key_value_heads, base.intermediate_size)
    layers = decoder_of(drafter).layers
    if width_changed:
        heads, kv, ch = _leading(plan, base)
        for j, layer in enumerate(layers):
            check_llama_layer(layer)
            _slice_layer(layer, heads[j], kv[j], ch[j])
    for j, layer in enumerate(layers):
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = j
    _write_config(drafter, plan)
    if plan.vocab is not None:
        from draftnas.drafter.vocab import apply_vocab_subset

        apply_vocab_subset(drafter, plan.vocab)
    return drafter


def _copy_model(model: Any) -> Any:
    return copy.deepcopy(model)


def _write_config(drafter: Any, plan: PruningPlan) -> None:
    """Set the config from the tensor shapes of the kept layers (never from the plan's numbers)."""
    config = drafter.config
    layers = decoder_of(drafter).layers
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


def base_architecture(model: Any, name: str = "") -> Architecture:
    """Shape of a loaded model, read from its config."""
    return Architecture.from_hf_config(model.config, name=name)
