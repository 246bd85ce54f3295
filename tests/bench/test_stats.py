"""Bench intervals: runs timed on a fake clock with known spread give the medians and intervals they must."""

from __future__ import annotations

import pytest

from benchmarks.drafting_split import pooled
from draftnas.bench.records import ArmRun, BenchPrompt
from draftnas.bench.stats import (
    compare_arms,
    drafting_split,
    other_tokens_per_s,
    relative_error,
    tokens_per_s,
    verdict,
)
from draftnas.core.intervals import median_interval


class FakeClock:
    """Seconds for a run: `base` per prompt times a factor that cycles through `spread` run by run."""

    def __init__(self, spread: tuple[float, ...]) -> None:
        self.spread, self.calls = spread, 0

    def seconds(self, base: float) -> float:
        factor = self.spread[self.calls % len(self.spread)]
        self.calls += 1
        return base * factor


def rows(clock: FakeClock, prompt_s: dict[str, float], ratio: dict[str, float],
         rounds: int) -> list[BenchPrompt]:
    """Per prompt and round: the reference takes prompt_s (on the clock), the winner that over ratio[p]."""
    out = []
    for r in range(rounds):
        for pid, base in prompt_s.items():
            ref_s = clock.seconds(base)
            out.append(BenchPrompt(prompt_id=pid, domain="code", prompt_tokens=10, round=r, runs=(
                ArmRun(arm="reference", seconds=ref_s, new_tokens=64),
                ArmRun(arm="draftnas", seconds=ref_s / ratio[pid], new_tokens=64))))
    return out


def test_no_spread_gives_a_zero_width_interval_at_the_true_ratio():
    prompts = {f"p{i}": 1.0 + i for i in range(9)}
    c = compare_arms(rows(FakeClock((1.0,)), prompts, dict.fromkeys(prompts, 1.25), 3),
                     "draftnas", "reference")
    assert c.ratio == pytest.approx(1.25) and c.interval == pytest.approx((1.25, 1.25))
    assert c.verdict == "ahead" and c.prompts == 9


def test_host_noise_shared_by_both_arms_of_a_run_cancels_in_the_ratio():
    # the clock slows whole runs 0.7x to 1.5x, but the winner ran in the same spell as the reference
    prompts = {f"p{i}": 2.0 for i in range(6)}
    c = compare_arms(rows(FakeClock((0.7, 1.0, 1.5)), prompts, dict.fromkeys(prompts, 1.1), 3),
                     "draftnas", "reference")
    assert c.ratio == pytest.approx(1.1) and c.interval == pytest.approx((1.1, 1.1))


def test_a_known_spread_over_prompts_gives_an_interval_inside_it_that_holds_the_median():
    ratios = {f"p{i}": r for i, r in enumerate((0.90, 0.95, 1.00, 1.05, 1.10, 1.15, 1.20, 1.25, 1.30))}
    c = compare_arms(rows(FakeClock((1.0,)), dict.fromkeys(ratios, 1.0), ratios, 3),
                     "draftnas", "reference")
    assert c.ratio == pytest.approx(1.10)
    low, high = c.interval
    assert 0.90 <= low < 1.10 < high <= 1.30
    assert low < 1.0 and c.verdict == "not separable on this host"  # 1 is inside: no claim


def test_every_prompt_ahead_but_by_little_is_still_ahead():
    ratios = {f"p{i}": 1.02 + 0.01 * i for i in range(8)}
    c = compare_arms(rows(FakeClock((1.0, 1.2)), dict.fromkeys(ratios, 1.0), ratios, 3),
                     "draftnas", "reference")
    assert c.interval[0] > 1.0 and c.verdict == "ahead"


def test_median_interval_is_seeded_and_covers_most_of_a_known_distribution():
    values = [float(v) for v in range(1, 22)]  # median 11
    mid, low, high = median_interval(values)
    assert mid == 11.0 and (mid, low, high) == median_interval(values)
    assert 6.0 <= low < 11.0 < high <= 16.0
    assert median_interval([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        median_interval([])


def test_verdict_and_relative_error():
    assert verdict(1.01, 1.2) == "ahead" and verdict(0.8, 0.99) == "behind"
    assert verdict(0.99, 1.3) == "not separable on this host"
    assert relative_error(11.0, 10.0) == pytest.approx(0.1) and relative_error(None, 3.0) is None
    assert tokens_per_s(ArmRun(arm="a", seconds=4.0, new_tokens=10)) == 2.5
    assert tokens_per_s(ArmRun(arm="a", seconds=0.0, new_tokens=10)) == 0.0  # a run that took no time


def test_the_drafting_split_gives_the_share_drafting_and_the_speedup_without_it():
    """Target 8 s per prompt; the loop 4 s of which 1 s drafting (prompt a) and 2 s (prompt b): 2x
    measured, 8/3 and 4x had drafting cost nothing; 3 of 8 seconds pooled drafting."""
    runs = [BenchPrompt(prompt_id=pid, domain="code", prompt_tokens=10, runs=(
        ArmRun(arm="target", seconds=8.0, new_tokens=64),
        ArmRun(arm="draftnas", seconds=4.0, new_tokens=64, draft_s=draft_s)))
        for pid, draft_s in (("a", 1.0), ("b", 2.0))]
    share, free, (low, high) = drafting_split(runs, "draftnas", "target")
    assert pooled(runs, "draftnas", "target", 2.5) == pytest.approx((2.0, 3 / (6.4 - 5)))  # 6.4 s at 2.5x
    assert pooled(runs, "draftnas", "target", 4.0) == (pytest.approx(2.0), None)  # 5 s outside drafting
    assert share == pytest.approx(3 / 8)
    assert free == pytest.approx((8 / 3 + 4) / 2) and low == pytest.approx(8 / 3) and high == pytest.approx(4)
    assert compare_arms(runs, "draftnas", "target").ratio == pytest.approx(2.0)


def test_the_other_tokens_per_s_adds_llama_cpps_prefill_back_and_leaves_the_loops_first_step_out():
    server = ArmRun(arm="target", seconds=2.0, new_tokens=64, prompt_seconds=0.5)  # decode only
    assert tokens_per_s(server) == 32.0 and other_tokens_per_s(server) == pytest.approx(64 / 2.5)
    loop = ArmRun(arm="draftnas", seconds=4.0, new_tokens=64, first_step_seconds=1.0, first_step_tokens=4)
    assert tokens_per_s(loop) == 16.0 and other_tokens_per_s(loop) == pytest.approx(60 / 3.0)
    assert other_tokens_per_s(ArmRun(arm="hf", seconds=4.0, new_tokens=64)) is None  # no split timed
