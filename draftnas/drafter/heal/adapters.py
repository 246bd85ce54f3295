"""Low-rank adapters for healing: W + B·A over a drafter's decoder linear layers, trained, then merged.

Healing with `train="lowrank"` (`drafter.heal`) puts a rank-r update B·A on the weight of every linear layer
of the decoder layers (attention and MLP projections; the embeddings and the head stay as they are). Only A
and B train: r·(in + out) values a layer instead of in·out, so a step's optimizer state is small and the
update cannot stray far from the pruned weights. B starts at zero (the drafter starts as it was cut). At
the end each update is merged into its weight: the healed drafter has exactly the shape, the parameters
and the kernels of the unhealed one, so healing this way costs nothing at decode time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class LowRank(nn.Module):
    """The parametrization W -> W + B·A (A: [rank, in], small random; B: [out, rank], zero)."""

    def __init__(self, weight: torch.Tensor, rank: int, seed: int) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        gen = torch.Generator(device="cpu").manual_seed(seed)
        a = torch.randn(rank, in_features, generator=gen) / math.sqrt(in_features)
        self.lora_a = nn.Parameter(a.to(device=weight.device, dtype=weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(out_features, rank, device=weight.device, dtype=weight.dtype))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.lora_b @ self.lora_a


def attach_low_rank(drafter: Any, rank: int, only_layers: Sequence[int] = (), seed: int = 0) -> int:
    """Put a `LowRank` update on every linear layer of the decoder layers (of `only_layers`, when given);
    returns how many. The module's `weight` reads W + B·A until `merge_low_rank`."""
    count = 0
    for name, module in list(drafter.named_modules()):
        match = _LAYER.search(name + ".")
        if (not isinstance(module, nn.Linear) or match is None
                or parametrize.is_parametrized(module, "weight")):
            continue
        if only_layers and int(match.group(1)) not in only_layers:
            continue
        adapter = LowRank(module.weight, min(rank, *module.weight.shape), seed + count)
        parametrize.register_parametrization(module, "weight", adapter)
        count += 1
    return count


def merge_low_rank(drafter: Any) -> int:
    """Fold every low-rank update into its weight and drop the adapters; returns how many."""
    count = 0
    for module in drafter.modules():
        if parametrize.is_parametrized(module, "weight"):
            with torch.no_grad():
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
            count += 1
    return count


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a low-rank adapter's (what `train="lowrank"` trains)."""
    return name.endswith((".lora_a", ".lora_b"))
