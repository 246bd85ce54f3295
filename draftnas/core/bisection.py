"""The one bisection: where a monotone condition turns true (pure)."""

from __future__ import annotations

from collections.abc import Callable


def turning_point(holds: Callable[[float], bool], lo: float, hi: float, steps: int = 60
                  ) -> tuple[float, float]:
    """The bracket (lo, hi) around the point where `holds` turns from false to true, after `steps` halvings
    of [`lo`, `hi`]; `holds` must be false below that point and true above it (not checked at the ends: the
    caller decides what an end means)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return lo, hi
