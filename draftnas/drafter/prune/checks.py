"""Every inconsistency of a pruning plan, as 'field: message (allowed: ...)' strings (pure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftnas.core.registry import Architecture
from draftnas.drafter.prune.importance import IMPORTANCES, LAYER_SELECTIONS


def layer_problems(plan: Any) -> list[str]:
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


def width_problems(plan: Any, base: Architecture | None) -> list[str]:
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


def index_problems(plan: Any, base: Architecture | None) -> list[str]:
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


def _gqa_problems(plan: Any, base: Architecture) -> list[str]:
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
