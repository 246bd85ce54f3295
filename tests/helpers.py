"""Small helpers shared by tests (not fixtures)."""

from __future__ import annotations

import copy

import torch


def truncated(model, k):
    """A copy of a LLaMA-style model with only its first k layers (layer_idx re-indexed, config updated)."""
    small = copy.deepcopy(model)
    small.model.layers = torch.nn.ModuleList(list(small.model.layers)[:k])
    for i, layer in enumerate(small.model.layers):
        layer.self_attn.layer_idx = i
    small.config.num_hidden_layers = k
    return small
