"""The median of a sample and its percentile bootstrap interval: one rule for a bench's measured figures and a
search's predicted ones (pure: numpy only)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95


def median_interval(values: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES,
                    seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` and the percentile bootstrap interval of the median
    at `level` (`resamples` resamples with replacement, seeded: the same values give the same
    interval). One value gives a zero-width interval at it."""
    if not values:
        raise ValueError("no values")
    data = np.asarray(values, dtype=float)
    mid = float(statistics.median(data.tolist()))
    if len(data) == 1:
        return mid, mid, mid
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(data), size=(resamples, len(data)))
    medians = np.median(data[picks], axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return mid, float(low), float(high)


LEVEL_BAND = 0.02  # a predicted speedup within 2% of 1 is called level: the latency model's noise


def predicted_word(speedup: float) -> str:
    """A predicted speedup in words: "pays" above 1.02, "does not pay" below 0.98, else "level"."""
    return "pays" if speedup > 1 + LEVEL_BAND else "level" if speedup >= 1 - LEVEL_BAND else "does not pay"


def measured_word(low: float, high: float) -> str:
    """A measured speedup's interval (or the range of its runs) in words: "pays" wholly above 1, "does not
    pay" wholly below, else "not separable" (from the target alone)."""
    return "pays" if low > 1 else "does not pay" if high < 1 else "not separable"


def with_interval(value: float | None, interval: Sequence[float] | None, spec: str = ".3f", unit: str = ""
                  ) -> str:
    """`value` and its interval as every table and line prints them: "1.126x [0.992, 1.263]" (`unit` after
    the value only); the value alone where there is no interval, "-" where there is no value."""
    if value is None:
        return "-"
    text = f"{value:{spec}}{unit}"
    if interval and len(interval) == 2:
        text += f" [{interval[0]:{spec}}, {interval[1]:{spec}}]"
    return text
