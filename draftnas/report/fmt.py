"""Formatting figures for tables and sentences (pure)."""

from __future__ import annotations

import math


def fmt_opt(value: float | None, spec: str = ".2f") -> str:
    """`value` formatted with `spec`, or "n/a" for a figure that was not measured (None or NaN)."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)
