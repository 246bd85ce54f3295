"""Calibration statistics for importance: one forward pass over calibration text with hooks on every
decoder layer, gathering block influence and, for activation-aware importance, each head's and MLP
channel's contribution (`drafter.importance`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from draftnas.drafter.prune.surgery import check_llama_layer, decoder_of


@dataclass
class LayerStats:
    """One layer's squared contributions: per MLP channel (entering down_proj) [I] and per query
    head (to o_proj's output) [H]."""

    channel_sq: Any
    head_sq: Any


@dataclass
class Stats:
    """Per-layer calibration statistics gathered by forward hooks."""

    block_influence: list[float]
    layers: list[LayerStats | None]
    tokens: int


@dataclass
class StatsMemo:
    """Statistics gathered once per base model and calibration sample and handed to every later plan cut
    from that base (a search plans each trial anew; its base and sample do not change). Statistics with
    the activations serve a plan that needs only block influence too (one forward gathers both)."""

    kept: dict[tuple[int, int, int], Stats] = field(default_factory=dict)

    def get(self, model: Any, sample: tuple[int, int], width: bool) -> Stats | None:
        stats = self.kept.get((id(model), *sample))
        return stats if stats is not None and (stats.layers[0] is not None or not width) else None

    def put(self, model: Any, sample: tuple[int, int], stats: Stats) -> None:
        self.kept[(id(model), *sample)] = stats


def collect_stats(model: Any, ids: torch.Tensor, *, width: bool) -> Stats:
    """One forward pass over `ids` [B, T]: block influence per layer, and with `width` the
    activation statistics of every layer."""
    layers = decoder_of(model).layers
    n = len(layers)
    influence = [0.0] * n
    channel: list[Any] = [None] * n
    head: list[Any] = [None] * n
    handles = []

    def block_hook(i: int) -> Any:
        def hook(_mod: Any, args: tuple, kwargs: dict, out: Any) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)  # [B, T]
            influence[i] = float((1.0 - cos).mean())
        return hook

    def channel_hook(i: int) -> Any:
        def hook(_mod: Any, args: tuple) -> None:
            a = args[0].float()  # [B, T, I]
            channel[i] = a.pow(2).sum(dim=(0, 1))
        return hook

    def head_hook(i: int, o_proj: Any, head_dim: int) -> Any:
        def hook(_mod: Any, args: tuple) -> None:
            x = args[0].float()  # [B, T, H*d]
            heads = x.shape[-1] // head_dim
            x = x.reshape(-1, heads, head_dim)  # [N, H, d]
            w = o_proj.weight.float().reshape(-1, heads, head_dim)  # [hidden, H, d]
            contrib = torch.einsum("nhd,ohd->nho", x, w)  # [N, H, hidden]
            head[i] = contrib.pow(2).sum(dim=(0, 2))
        return hook

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(block_hook(i), with_kwargs=True))
        if width:
            check_llama_layer(layer)
            attn = layer.self_attn
            handles.append(layer.mlp.down_proj.register_forward_pre_hook(channel_hook(i)))
            handles.append(attn.o_proj.register_forward_pre_hook(head_hook(i, attn.o_proj, attn.head_dim)))
    try:
        with torch.no_grad():
            model(input_ids=ids.to(next(model.parameters()).device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    per_layer = [LayerStats(c, h) if c is not None else None for c, h in zip(channel, head, strict=True)]
    return Stats(influence, per_layer, int(ids.numel()))


def block_influence(model: Any, ids: torch.Tensor) -> list[float]:
    """Block influence per layer, 1 − cos(layer input, layer output), mean over tokens of `ids` [B, T].

    Measured with hooks on each decoder layer (not `output_hidden_states`, whose last
    entry is taken after the final norm).
    """
    return collect_stats(model, ids, width=False).block_influence
