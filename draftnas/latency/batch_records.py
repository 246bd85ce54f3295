"""Batched steps timed on this machine: one shape's forward at batch B reading N new tokens (pure: no torch).

A calibration times steps at batch 1 (`HostCalibration`). A server decodes B sequences at once, and on a
CPU, past a few rows, a step stops being bound by reading the weights and its cost grows with B x N: the
profile's roofline, corrected at batch 1, prices that growth wrongly by up to orders of magnitude (it
predicted speculation paying to B = 1024 on an H200 where it stopped at B = 4). So where a search or a bench
prices batches above 1, the target's decode and verify and each drafter base's decode are timed at
B = 2, 4, 8, ... (random weights of the real shapes) and kept beside the calibration; `factor` is what
corrects a batch-1-calibrated price to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from draftnas.core.records import Record
from draftnas.core.registry import Architecture


@dataclass(frozen=True)
class BatchTiming(Record):
    """`arch` (full depth, its linear layers in `weights`) timed at batch B reading N new tokens after
    `context_tokens`: `ms["BxN"]` (median, ms)."""

    arch: Architecture
    weights: str
    context_tokens: int
    ms: dict[str, float]

    def points(self) -> list[tuple[int, int]]:
        """The (B, N) timed, sorted."""
        return sorted(tuple(int(x) for x in key.split("x")) for key in self.ms)  # type: ignore[misc]

    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({b for b, _ in self.points()}))

    def layer_shape_of(self, arch: Architecture) -> bool:
        """Whether `arch` has this timing's layer shape (a drafter cut from it, at any depth and head)."""
        a, t = arch, self.arch
        return (a.hidden_size, a.intermediate_size, a.num_attention_heads, a.num_key_value_heads,
                a.head_dim) == (t.hidden_size, t.intermediate_size, t.num_attention_heads,
                                t.num_key_value_heads, t.head_dim)


def factor(timing: BatchTiming, batch_size: int, new_tokens: int,
           single: Callable[[Architecture, int, int, int], float]) -> float:
    """Measured over priced time of `timing`'s shape at the timed batch nearest `batch_size` (in log2;
    the largest timed one beyond it), linear in the new tokens between the counts timed at that batch; a
    step that still cost more than a larger one when timed again (`suspect_points`) prices nothing.
    `single(arch, batch, new_tokens, context)`: the batch-1-calibrated price being corrected."""
    usable = [p for p in timing.points() if f"{p[0]}x{p[1]}" not in suspect_points(timing.ms)]
    batches = sorted({bb for bb, _ in usable})
    b = min(batches, key=lambda x: (abs(math.log2(x) - math.log2(batch_size)), -x))
    counts = sorted(n for bb, n in usable if bb == b)
    ratios = [timing.ms[f"{b}x{n}"] / max(single(timing.arch, b, n, timing.context_tokens), 1e-9)
              for n in counts]
    if new_tokens <= counts[0]:
        return ratios[0]
    if new_tokens >= counts[-1]:
        return ratios[-1]
    i = next(i for i, n in enumerate(counts) if n >= new_tokens)
    lo, hi = counts[i - 1], counts[i]
    w = (new_tokens - lo) / (hi - lo)
    return ratios[i - 1] * (1 - w) + ratios[i] * w


def suspect_points(ms: dict[str, float], tolerance: float = 1.25) -> list[str]:
    """Keys of timed steps that cost more than a larger step of the same shape: more than `tolerance` x a
    larger batch reading as many new tokens, or a decode more than a verify at its batch. Such a step is
    timed again with its kernels chosen anew (`latency.batched.time_batches`): with this AMD Zen 4 host's
    kept kernel choices a 1.5B's decode at batch 8 read 12.3 s where batch 16 read 0.39 s, and 0.32 s in a
    fresh process; timed again in the same process it read 9.9 s, so what stays suspect is kept in the
    record, as measured, and left out of the pricing (`factor`)."""
    points = {tuple(int(x) for x in key.split("x")): value for key, value in ms.items()}
    out = []
    for (b, n), value in points.items():
        larger = [v for (bb, nn), v in points.items() if (bb > b and nn == n) or (bb == b and nn > n)]
        if any(value > tolerance * v for v in larger):
            out.append(f"{b}x{n}")
    return sorted(out)
