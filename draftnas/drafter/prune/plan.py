"""Planning: measure importance on a base model and return the `PruningPlan` options ask for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from draftnas.core.errors import PlanError
from draftnas.core.prompts import load_prompts
from draftnas.core.registry import Architecture
from draftnas.drafter.prune.importance import importance, layer_selection, select_channels, select_heads
from draftnas.drafter.prune.stats import Stats, StatsMemo, collect_stats
from draftnas.drafter.prune.surgery import base_architecture, check_llama_layer, decoder_of
from draftnas.drafter.records import PlanOptions, PruningPlan

log = logging.getLogger(__name__)
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
    """The shipped prompt set (`draftnas.core.prompts.load_prompts("all")`) when present, else a fallback."""
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


def plan_pruning(model: Any, options: PlanOptions, calibration: Any = None, *,
                 tokenizer: Any = None, memo: StatsMemo | None = None) -> PruningPlan:
    """Measure importance on `model` and return the plan `options` asks for.

    `calibration`: token ids `[B, T]`, or texts (with `tokenizer`), or None (the
    shipped prompts, with `tokenizer`). Needed only by strategies that read activations
    (block influence, activation importance). `memo`: statistics over the shipped prompts kept from an
    earlier plan of the same model, reused (and filled) when `calibration` is None.
    """
    base = base_architecture(model, options.base)
    heads = options.num_attention_heads or base.num_attention_heads
    kv = options.num_key_value_heads or base.num_key_value_heads
    inter = options.intermediate_size or base.intermediate_size
    prune_width = (heads, kv, inter) != (base.num_attention_heads, base.num_key_value_heads,
                                         base.intermediate_size)
    criterion = importance(options.importance)
    selection = layer_selection("explicit" if options.layers is not None else options.layer_selection)
    activations = prune_width and criterion.needs_activations
    stats = None
    if (options.layers is None and selection.needs_block_influence) or activations:
        sample = (options.calibration_sequences, options.calibration_seq_len)
        kept = memo if calibration is None else None  # a memo holds the shipped prompts' statistics only
        stats = kept.get(model, sample, activations) if kept is not None else None
        if stats is None:
            ids = _calibration_tensor(calibration, tokenizer, options)
            stats = collect_stats(model, ids, width=activations)
            log.info("block influence: %s", [round(b, 3) for b in stats.block_influence])
            if kept is not None:
                kept.put(model, sample, stats)
    plan = PruningPlan(
        base=options.base or str(getattr(model.config, "name_or_path", "") or ""),
        base_num_layers=base.num_hidden_layers, layers=_layers(options, base.num_hidden_layers, stats),
        layer_selection=selection.name, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=inter, importance=options.importance,
    )
    plan.validate(base)
    if prune_width:
        plan = _with_width_indices(plan, model, base, stats)
        plan.validate(base)
    return plan


def _layers(options: PlanOptions, n: int, stats: Stats | None) -> tuple[int, ...]:
    """The base layers kept: the explicit list, or `num_layers` (default all) by the strategy."""
    if options.layers is not None:
        return tuple(options.layers)
    k = n if options.num_layers is None else options.num_layers
    if not 1 <= k <= n:
        raise PlanError(f"num_layers: {k} (allowed: 1..{n})")
    return layer_selection(options.layer_selection)(k, n, stats.block_influence if stats else None)


def _calibration_tensor(calibration: Any, tokenizer: Any, options: PlanOptions) -> torch.Tensor:
    if isinstance(calibration, torch.Tensor):
        return calibration
    if tokenizer is None:
        raise PlanError("calibration: block influence and activation importance need token ids "
                        "or a tokenizer (allowed: a [B, T] id tensor, or texts with tokenizer=)")
    return calibration_ids(tokenizer, calibration, sequences=options.calibration_sequences,
                           seq_len=options.calibration_seq_len)


def _with_width_indices(plan: PruningPlan, model: Any, base: Architecture,
                        stats: Stats | None) -> PruningPlan:
    """`plan` with its kept heads, KV groups and channels per layer, scored by its importance."""
    layers = decoder_of(model).layers
    criterion = importance(plan.importance)
    kept_heads, kept_kv, kept_ch = [], [], []
    for i in plan.layers:
        check_llama_layer(layers[i])
        head_scores, ch_scores = criterion(layers[i], stats.layers[i] if stats is not None else None)
        h, g = select_heads(head_scores.tolist(), base.num_attention_heads, base.num_key_value_heads,
                            plan.num_attention_heads, plan.num_key_value_heads)
        kept_heads.append(h)
        kept_kv.append(g)
        kept_ch.append(select_channels(ch_scores.tolist(), plan.intermediate_size))
    return replace(plan, kept_heads=tuple(kept_heads), kept_kv_heads=tuple(kept_kv),
                   kept_channels=tuple(kept_ch))
