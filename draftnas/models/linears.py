"""Cheaper small-batch products for plain transformers models on CPU.

Speculative decoding lives on verifying γ+1 tokens for about the price of decoding one. On
some CPU hosts the default kernel breaks that: `F.linear` with a few rows takes a path that reads
the weights more than once, so a 2-token verify costs far more than a decode
(docs/hosts/amd-epyc-zen2-2core.md has the figures). draftnas's own decoder picks, per shape,
the product that timed fastest here (`matmul.MatmulChooser`). `route_linears` gives the same
choice to the `nn.Linear` layers of any model, so that a user's own

    target.generate(..., assistant_model=drafter)

pays for the cheap verify as well, with the same outputs (`benchmarks/hf_assisted_parts.py`).

    from draftnas.models import route_linears
    route_linears(target); route_linears(drafter)   # weights="int8" for a drafter exported in int8

A row count is timed on its second product with a weight (F.linear until then): the steps of a
decode repeat, a prompt's prefill mostly does not, and one timing costs tens of passes over the
weights. `route_linears(model).prepare(range(1, gamma + 2))` times the step sizes up front instead.
Layers on CUDA are routed only where `weights` quantizes them (int4 there, through its kernel; the
others keep F.linear); layers on any other device and `nn.Linear` subclasses with their own forward
are left as they are. Routing is undone with `.detach()` and redone with `.attach()`; `with routing:`
routes for a block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftnas.models.matmul import MatmulChooser
from draftnas.models.records import linear_formats

_MARK = "_draftnas_routed"  # on a routed layer: id() of the routing that routed it


@dataclass
class LinearRouting:
    """The linear layers of one model and the chooser their products go through while attached."""

    layers: list[nn.Linear]
    chooser: MatmulChooser = field(default_factory=lambda: MatmulChooser(enabled=True, time_after=2))
    attached: bool = False

    def attach(self) -> LinearRouting:
        """Route every layer's forward through the chooser; a layer another routing holds (a
        module two models share) stays with that one."""
        for layer in self.layers:
            if getattr(layer, _MARK, None) is not None:
                continue

            def forward(x: torch.Tensor, layer: nn.Linear = layer) -> torch.Tensor:
                out = self.chooser(x, layer.weight)
                return out if layer.bias is None else out + layer.bias

            layer.forward = forward  # type: ignore[method-assign,assignment]
            setattr(layer, _MARK, id(self))
        self.attached = True
        return self

    def detach(self) -> None:
        """Give every layer this routing routed its own forward back (the chooser keeps what it
        timed)."""
        for layer in self.layers:
            if getattr(layer, _MARK, None) == id(self):
                del layer.forward
                delattr(layer, _MARK)
        self.attached = False

    def prepare(self, rows: Iterable[int]) -> LinearRouting:
        """Time the products for these row counts now rather than on their first use (see
        `MatmulChooser.prepare`): for example the verify's γ+1 and the lengths of short prompts."""
        self.chooser.prepare(rows)
        return self

    def chosen(self) -> dict[tuple[int, int, int], str]:
        """(rows, out, in) -> the product chosen so far ("linear", "weight-once", "transposed")."""
        names = ("linear", "weight-once", "transposed")
        return {key: names[form] for key, form in sorted(self.chooser.form.items())}

    def __enter__(self) -> LinearRouting:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()


def route_linears(model: nn.Module, *, attach: bool = True, own_weights: bool = True,
                  weights: str = "dense") -> LinearRouting:
    """Route `model`'s CPU `nn.Linear` layers through the fastest small-batch product here.

    Products of more than 16 rows (a prompt's prefill) keep `F.linear`; each (rows, shape) is
    timed once over every weight of that shape, on its second product (`prepare` times now).
    For inference: weights are not expected to change once routed. Layers already routed by
    another routing, layers on another device and subclasses with their own forward are left
    as they are, and on CUDA every layer `weights` leaves dense. The returned routing is attached unless
    `attach=False`.

    `own_weights`: first copy each routed weight into memory this process allocated
    (`copy_weights`: faster to stream than the file mapping `from_pretrained` leaves).
    `weights`: multiply the routed layers quantized as a drafter exported with that weight format runs:
    "int8", "int4", or one per layer group ("attn=int8,mlp=int8,head=int4"; attention projections are the
    q/k/v/o layers, MLP ones gate/up/down, the head lm_head), attn and mlp maybe per band of depth
    ("attn=int8/int4"); `models.records.linear_formats`, `MatmulChooser.quantize`. The model's own
    weights stay as they are.
    """
    plain = {name: module for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward
             and getattr(module, _MARK, None) is None}
    formats = linear_formats(weights, list(plain))
    named = {name: m for name, m in plain.items() if m.weight.device.type == "cpu"
             or (m.weight.device.type == "cuda" and formats[name] != "dense")}
    layers = list(named.values())
    kinds: dict[int, str] = {}  # id(weight) -> its format
    for name, module in named.items():
        kinds.setdefault(id(module.weight), formats[name])
    tensors = list({id(layer.weight): layer.weight for layer in layers}.values())  # tied ones once
    if own_weights:
        copy_weights(tensors)
    on_cpu = all(t.device.type == "cpu" for t in tensors)  # on CUDA only the quantized products differ
    routing = LinearRouting(layers, MatmulChooser(enabled=on_cpu, time_after=2))
    for weight in tensors:
        routing.chooser.register(weight)
        routing.chooser.quantize(weight, kinds[id(weight)])
    return routing.attach() if attach else routing


def copy_weights(weights: Sequence[torch.Tensor]) -> None:
    """Give each weight a copy of its values in memory this process allocated, in place (the
    Parameter objects stay, so ties through a shared Parameter hold; weights that share one
    storage share one copy).

    `from_pretrained` leaves weights as views of the safetensors file, mapped privately; on some
    hosts the few-row products that stream them run slower than over a copy, while 1-token forwards
    come out about even (`python benchmarks/weight_memory.py --target T` measures it). The copy
    costs one pass over the weights and, while it runs, one weight's size more memory.
    """
    copies: dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    with torch.no_grad():
        for weight in weights:
            key = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()))
            if key not in copies:
                copies[key] = weight.detach().clone()
            weight.data = copies[key]
