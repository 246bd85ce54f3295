"""The accepts file a bench writes (`--write-accepts`): each drafter's accepted counts per step as draftnas's
loop measured them (first round: a greedy run's counts are the same every round), and the estimator's
for the same prompts, for `bench --replay` on another machine (`acceptance.accepts`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from draftnas.acceptance.accepts import SCHEMA, AcceptsFile, AcceptsPrompt, AcceptsTrace, write_accepts
from draftnas.bench.arms import arm_names
from draftnas.bench.records import BenchResult


def bench_accepts(result: BenchResult, estimated: Sequence[AcceptsTrace] = ()) -> AcceptsFile:
    """Every drafter's loop arm of `result` as a trace (labelled as the bench labels it), then `estimated`."""
    traces: dict[str, AcceptsTrace] = {}
    first = [p for p in result.prompts if p.round == 0]
    for label, spec in result.drafters.items():
        name = arm_names(label)[0]
        if not result.has(name):
            continue
        runs = [(p, p.run(name)) for p in first]
        traces[label] = AcceptsTrace(
            label=label, drafter=spec, source="bench", gamma=result.arm(name).gamma or result.gamma,
            prompts=tuple(AcceptsPrompt(prompt_id=p.prompt_id, prompt_tokens=p.prompt_tokens,
                                        new_tokens=r.new_tokens, accepted=r.accepted_steps,
                                        drafted=r.drafted_steps) for p, r in runs))
    traces |= {t.label: t for t in estimated}
    return AcceptsFile(schema=SCHEMA, target=result.target, host=result.host,
                       max_new_tokens=result.max_new_tokens, traces=traces)


def write_bench_accepts(path: str | Path, result: BenchResult,
                        estimated: Sequence[AcceptsTrace] = ()) -> Path:
    return write_accepts(path, bench_accepts(result, estimated))
