"""Random weights for timing: shapes matter, values do not (as long as they are finite and varied).

`no_default_init` builds linear and embedding layers without torch's default random init (every value
drawn, then overwritten); `fill_random` writes N(0, std) values into every parameter, norms at their
identity, either drawn one by one or, with `pool`, copied from one pool of drawn values: drawing 1.5B
normal values took most of a calibration's model builds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def no_default_init() -> Iterator[None]:
    """nn.Linear and nn.Embedding built without their default random init while inside."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved  # type: ignore[method-assign]


def fill_random(module: nn.Module, seed: int, std: float = 0.02, pool: int | None = None,
                norm_value: float = 1.0) -> None:
    """Every parameter of `module` random N(0, std), those named *norm.weight at `norm_value`.

    `pool`: draw only that many values (a prime count) and fill every weight with copies of them from a
    different offset; rows of a matrix still all differ (the pool's length is prime and larger than any
    row), so no two logits tie by construction."""
    first = next(module.parameters())
    gen = torch.Generator(device=first.device).manual_seed(seed)
    with torch.no_grad():
        values = None
        if pool is not None:
            values = torch.empty(pool, dtype=first.dtype, device=first.device)
            values.normal_(0.0, std, generator=gen)
        for i, (name, p) in enumerate(module.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(norm_value)
            elif values is None:
                p.normal_(0.0, std, generator=gen)
            else:
                _fill_from(p.view(-1), values, (i * 7919) % values.numel())


def _fill_from(flat: torch.Tensor, values: torch.Tensor, offset: int) -> None:
    """`flat` filled with `values` repeated from `offset` on (memory-speed copies)."""
    done, n = 0, values.numel()
    while done < flat.numel():
        k = min(flat.numel() - done, n - offset)
        flat[done:done + k].copy_(values[offset:offset + k])
        done, offset = done + k, 0
