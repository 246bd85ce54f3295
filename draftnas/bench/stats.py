"""Medians and bootstrap intervals of a bench's figures (pure: numpy only).

A bench runs every arm over the same prompts in several interleaved rounds. A figure of an arm
(tokens/s, a speedup, one drafter's tokens/s over another's) is first taken per prompt, as the median
over that prompt's rounds; the arm's figure is the median over prompts, and its 95% interval is a
percentile bootstrap of that median, resampling prompts (the unit a user's workload varies in; rounds
of one prompt only measure the host's noise, which the per-prompt median already damps).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from draftnas.bench.records import ArmResult, ArmRun, BenchPrompt, Comparison
from draftnas.core.intervals import median_interval


def per_prompt_median(by_prompt: dict[str, list[float]]) -> list[float]:
    """Each prompt's median over its rounds, in the order given."""
    return [float(statistics.median(v)) for v in by_prompt.values() if v]


def verdict(low: float, high: float) -> str:
    """'ahead' when the interval lies above 1, 'behind' below it, else 'not separable on this host'."""
    if low > 1.0:
        return "ahead"
    if high < 1.0:
        return "behind"
    return "not separable on this host"


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, or None without both."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


class _PromptRow(Protocol):
    @property
    def prompt_id(self) -> str: ...


Row = TypeVar("Row", bound=_PromptRow)


def interval_of(rows: Sequence[Row], value: Callable[[Row], float]) -> tuple[float, tuple[float, float]]:
    """The median over prompts of each prompt's median over rounds of `value(row)`, and its 95%
    bootstrap interval over prompts (rows: one per prompt and round, each with its `prompt_id`)."""
    by_prompt: dict[str, list[float]] = {}
    for row in rows:
        by_prompt.setdefault(row.prompt_id, []).append(float(value(row)))
    mid, low, high = median_interval(per_prompt_median(by_prompt))
    return mid, (low, high)


class _CountedRun(Protocol):
    @property
    def seconds(self) -> float: ...
    @property
    def new_tokens(self) -> int: ...


def tokens_per_s(run: _CountedRun) -> float:
    """One run's new tokens over its seconds (0 for a run that took none)."""
    return run.new_tokens / run.seconds if run.seconds > 0 else 0.0


class _SplitRun(_CountedRun, Protocol):
    @property
    def prompt_seconds(self) -> float: ...
    @property
    def first_step_seconds(self) -> float: ...
    @property
    def first_step_tokens(self) -> int: ...


def other_tokens_per_s(run: _SplitRun) -> float | None:
    """A run's tokens/s by the other definition than its engine reports: draftnas's loop (prefill in its
    seconds) after its first step, llama.cpp (decode only) with the prompt's prefill added back; None
    where the run timed no such split (transformers' `generate`)."""
    if run.prompt_seconds > 0:
        return run.new_tokens / (run.seconds + run.prompt_seconds)
    if run.first_step_seconds > 0 and run.seconds > run.first_step_seconds:
        return (run.new_tokens - run.first_step_tokens) / (run.seconds - run.first_step_seconds)
    return None


class _TimedRun(_CountedRun, Protocol):
    @property
    def draft_s(self) -> float: ...


class _PromptRuns(_PromptRow, Protocol):
    def run(self, arm: str) -> _TimedRun: ...


def drafting_split(rows: Sequence[_PromptRuns], arm: str, baseline: str
                   ) -> tuple[float, float, tuple[float, float]]:
    """(the share of `arm`'s seconds spent inside its drafter, all runs pooled; the median over prompts of
    its speedup over `baseline` had drafting cost nothing; that median's 95% interval). The second is
    each run's new tokens over its seconds outside the drafter (the target's verify passes, the prefills,
    the loop's own work) against the baseline's tokens/s in the same prompt and round: the ceiling a
    faster drafter at the same tokens per step approaches. Where it sits near the measured speedup, the
    verify passes bound the speedup, not the drafter."""
    runs = [row.run(arm) for row in rows]
    seconds = sum(r.seconds for r in runs)
    share = sum(r.draft_s for r in runs) / seconds if seconds > 0 else 0.0

    def free(row: _PromptRuns) -> float:
        own, base = row.run(arm), row.run(baseline)
        outside = own.seconds - own.draft_s
        base_tps = tokens_per_s(base)
        return own.new_tokens / outside / base_tps if outside > 0 and base_tps > 0 else 0.0

    ceiling, interval = interval_of(rows, free)
    return share, ceiling, interval


def compare_arms(rows: Sequence[BenchPrompt], numerator: str, denominator: str) -> Comparison:
    """`numerator`'s tokens/s over `denominator`'s, per prompt and round, as a median with its interval
    and the verdict it supports (ahead only when the whole interval lies above 1)."""
    ratio, (low, high) = interval_of(
        rows, lambda p: tokens_per_s(p.run(numerator)) / max(tokens_per_s(p.run(denominator)), 1e-12))
    return Comparison(numerator=numerator, denominator=denominator, ratio=ratio, interval=(low, high),
                      verdict=verdict(low, high), prompts=len({p.prompt_id for p in rows}))


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first position where `tokens` departs from `reference` (None: identical)."""
    i = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b), None)
    return i if i is not None or len(tokens) == len(reference) else min(len(tokens), len(reference))


def other_definition(result: ArmResult, rows: Sequence[BenchPrompt]) -> ArmResult:
    """`result` with its tokens/s by the other definition (`stats.other_tokens_per_s`) where every run of
    the arm timed it."""
    if any(other_tokens_per_s(p.run(result.name)) is None for p in rows):
        return result
    value, interval = interval_of(rows, lambda p: other_tokens_per_s(p.run(result.name)) or 0.0)
    return replace(result, other_tokens_per_s=value, other_tokens_per_s_interval=interval)


def drafting_figures(runs: Sequence[ArmRun], speedup: Comparison, *, counted: bool = True,
                     timed: bool = False) -> dict[str, Any]:
    """What a drafting arm reports from its runs, as `ArmResult` fields: its speedup over its baseline and
    tokens per step; where its drafts were counted (`counted`) the accepted per step and the share of drafts
    accepted, and where they were timed (`timed`) ms per drafted token; where the runs were greedy (each
    compared with the target alone's output) whether all were lossless and the share that were."""
    steps, drafted = max(sum(r.steps for r in runs), 1), max(sum(r.drafted for r in runs), 1)
    greedy = bool(runs) and runs[0].lossless is not None
    out: dict[str, Any] = {
        "speedup": speedup.ratio, "speedup_interval": speedup.interval,
        "tokens_per_step": sum(r.new_tokens for r in runs) / steps,
        "lossless": all(bool(r.lossless) for r in runs) if greedy else None,
        "exact_match_rate": sum(bool(r.lossless) for r in runs) / len(runs) if greedy else None}
    if counted:
        out["mean_accepted_per_step"] = sum(r.accepted for r in runs) / steps
        out["draft_acceptance_rate"] = sum(r.accepted for r in runs) / drafted
    if timed:
        out["draft_ms_per_token"] = 1000 * sum(r.draft_s for r in runs) / drafted
    return out
