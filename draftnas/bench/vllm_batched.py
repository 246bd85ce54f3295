"""`bench --engine vllm --batch-size 1,2,4,8`: the target alone and each drafter in vLLM's own continuous
batching, B requests submitted together (B prompts cycled from the set; at B = 1 each prompt alone), greedy,
fp32. Each round starts every arm's engine once (in a rotating order) and runs every batch size in it; a
speedup at B is paired per round (the arm's tokens/s over the target alone's at that B in that round), and
its figure is the median over rounds. An output counts as exact where it equals the target alone's for the
same prompt at the same B and round. The crossover is measured per round (the first B whose paired speedup
is below 1 in that round) and over the medians.

Where `search --engine vllm` stored a calibration of the target on this host, each point carries the
speedup predicted from it (`bench.vllm_predicted.batch_speedups`): the same groups priced in lockstep,
each request's tokens and steps from draftnas's replay of its prompt over the target alone's output (not
vLLM's measured acceptance), and the predicted crossover is the first B predicted below 1.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftnas.bench.batch_records import BatchedBenchResult, BatchPoint
from draftnas.bench.batched import crossover_runs, first_below_one
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.vllm import TARGET, VllmArm, VllmPlan, check_settings, plan_vllm_bench
from draftnas.bench.vllm_replay import chains, replayed
from draftnas.core.machine import cpu_count, cpu_identity, load_average
from draftnas.core.prompts import Prompt
from draftnas.core.records import Progress
from draftnas.models.vllm_engine import Vllm, find_vllm, run_vllm

log = logging.getLogger(__name__)


def _by_batch(out: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """One arm's process, per batch size: new tokens, seconds, the outputs (in prompt order) and vLLM's
    accepted drafts."""
    found: dict[int, dict[str, Any]] = {}
    for group in out["rounds"][0]:
        b = found.setdefault(int(group["batch"]), {"tokens": 0, "seconds": 0.0, "outputs": [], "accepted": 0})
        b["tokens"] += sum(len(t) for t in group["tokens"])
        b["seconds"] += float(group["seconds"])
        b["outputs"] += group["tokens"]
        b["accepted"] += int(group["counters"]["num_accepted_tokens"])
    return found


def run_vllm_batch_sizes(target: str, draft: str, prompts: Sequence[Prompt], options: BenchOptions, *,
                         references: Sequence[str] = (), progress: Progress | None = None,
                         vllm: Vllm | None = None) -> BatchedBenchResult:
    """Every batch size of `options.batch_sizes`, every arm, `options.rounds` rounds (see the module)."""
    started, load_before = time.perf_counter(), load_average()
    batches = sorted(set(options.batch_sizes))
    plan = plan_vllm_bench(target, draft, prompts, options, references, batches)
    vllm = vllm or find_vllm()
    check_settings(vllm, plan, batches)
    arms = plan.arms
    runs: dict[str, list[dict[int, dict[str, Any]]]] = {a.name: [] for a in arms}
    # the target alone's first run also decodes each prompt past the budget, untimed: the replay's last
    # step drafts past it, as vLLM's does
    extended: list[list[int]] = []
    for r in range(options.rounds):
        for i, a in enumerate(arms[r % len(arms):] + arms[:r % len(arms)]):
            log.info("vLLM round %d: %s %s at B = %s", r + 1, a.name,
                     json.dumps(a.config) if a.config else "(no drafter)", batches)
            extend = max(x.gamma for x in arms) + 1 if a.config is None and not extended else 0
            out = run_vllm(vllm, plan.job | {"speculative_config": a.config, "extend": extend})
            extended = extended or out.get("extended") or []
            runs[a.name].append(_by_batch(out))
            if progress:
                progress(r * len(arms) + i + 1, options.rounds * len(arms))
    drafters = [a for a in arms if a.config is not None]
    predicted, source = _predicted(plan, extended, options.max_new_tokens, vllm, batches)
    points = tuple(_point(b, runs, drafters, predicted.get(b, {})) for b in batches)
    return BatchedBenchResult(
        target=target, drafters={a.name: a.label() for a in drafters},
        gamma=options.gamma, max_new_tokens=options.max_new_tokens, device=vllm.device, dtype="float32",
        threads=cpu_count(), profile=source, points=points,
        measured_crossover={a.name: first_below_one([(p.batch_size, p.speedup[a.name]) for p in points])
                            for a in drafters},
        predicted_crossover={a.name: first_below_one([(p.batch_size, p.predicted_speedup[a.name])
                                                      for p in points if a.name in p.predicted_speedup])
                             for a in drafters},
        measured_crossover_runs={a.name: crossover_runs(points, a.name) for a in drafters},
        schedule_against={a.name: tuple(f.name for f in drafters if f.drafter == a.drafter and not f.schedule)
                          for a in drafters if a.schedule} or None,
        schedules={a.name: [list(r) for r in a.schedule] for a in drafters if a.schedule} or None,
        prompts=tuple(p.id for p in plan.prompts),
        host=cpu_identity().label(), load_average_before=load_before, versions={"vllm": vllm.version},
        wall_s=round(time.perf_counter() - started, 2), engine="vllm")


def _predicted(plan: VllmPlan, extended: Sequence[Sequence[int]], budget: int, vllm: Vllm,
               batches: Sequence[int]) -> tuple[dict[int, dict[str, float]], str]:
    """Each drafter arm's predicted speedup per batch from this host's stored vLLM calibration of the target
    and draftnas's replay of each prompt, and the line naming the calibration ("" where none is stored)."""
    from draftnas.bench.vllm_predicted import PricedArm, batch_speedups, priced_arms, stored_calibration
    from draftnas.core.registry import resolve_architecture

    found = stored_calibration(Path(plan.job["model"]), vllm.version, cpu_count(), max(batches))
    if found is None or not extended:
        return {}, ""
    calibration, path = found
    model, drafters = priced_arms(calibration, resolve_architecture(plan.job["model"]),
                                  {a.name: (a.kind, a.folder) for a in plan.arms})
    # a drafter's chains price it at each step's γ (a schedule's follows the batch that step ran: a group's
    # last steps run fewer sequences); lookup's replayed steps at the γ its schedule gives at each batch
    arms: dict[str, PricedArm] = {}
    steps: dict[str, Any] = {}
    for a in plan.arms:
        if a.kind in ("model", "head"):
            arms[a.name] = PricedArm(a.kind, drafters[a.name], a.gamma, a.schedule)
            steps[a.name] = chains(a, plan.encoded, extended, budget, plan.job["model"])
        elif a.kind == "lookup":
            for g in {a.gamma_at(b) for b in batches}:
                arms[f"{a.name}@{g}"] = PricedArm(a.kind, drafters[a.name], g)
                steps[f"{a.name}@{g}"] = replayed(a.at_gamma(g), plan.encoded, extended, budget)[1]
    new_tokens = [min(len(e), budget) for e in extended]
    priced = batch_speedups(model, arms, [len(p) for p in plan.encoded], new_tokens, steps, batches)
    predicted = {b: {a.name: priced[b][key] for a in plan.arms
                     if (key := a.name if a.name in arms else f"{a.name}@{a.gamma_at(b)}") in priced[b]}
                 for b in batches}
    said = (f"this host's vLLM calibration {path} (timed {calibration.timed_at} at batches "
            f"{', '.join(map(str, calibration.batches))}) and draftnas's replay of each prompt")
    return predicted, said


def _point(batch: int, runs: dict[str, list[dict[int, dict[str, Any]]]], drafters: Sequence[VllmArm],
           predicted: dict[str, float] | None = None) -> BatchPoint:
    """Batch size `batch`: medians over rounds, each speedup paired per round with the target alone."""
    def tps(b: dict[str, Any]) -> float:
        return float(b["tokens"] / b["seconds"])

    alone = [r[batch] for r in runs[TARGET]]
    tokens_per_s, speedups, per_step, exact = {}, {}, {}, {}
    for a in drafters:
        mine = [r[batch] for r in runs[a.name]]
        tokens_per_s[a.name] = statistics.median(tps(m) for m in mine)
        speedups[a.name] = tuple(tps(m) / tps(t) for m, t in zip(mine, alone, strict=True))
        tokens = sum(m["tokens"] for m in mine)
        per_step[a.name] = tokens / max(tokens - sum(m["accepted"] for m in mine), 1)
        same = [x == y for m, t in zip(mine, alone, strict=True)
                for x, y in zip(m["outputs"], t["outputs"], strict=True)]
        exact[a.name] = sum(same) / len(same)
    return BatchPoint(batch_size=batch, target_tokens_per_s=statistics.median(tps(t) for t in alone),
                      tokens_per_s=tokens_per_s,
                      speedup={k: statistics.median(v) for k, v in speedups.items()},
                      tokens_per_step=per_step, exact_match_rate=exact,
                      predicted_speedup=dict(predicted or {}),
                      speedup_runs=speedups)


@dataclass(frozen=True)
class ScheduleReading:
    """At one batch: the schedule's γ there, the fixed-γ arm that measured fastest there (the highest median
    speedup) and the schedule's tokens/s over that arm's, paired per round (both over the same round's
    target alone): the median and the range over rounds."""

    batch_size: int
    gamma: int
    best_fixed: str
    ratio: float
    low: float
    high: float


def schedule_readings(result: BatchedBenchResult, schedule: str) -> list[ScheduleReading]:
    """The schedule arm `schedule` against the best of the fixed-γ arms it is held against
    (`result.schedule_against`), at each batch."""
    from draftnas.search.vllm import schedule_gamma

    fixed = (result.schedule_against or {}).get(schedule) or ()
    ranges = (result.schedules or {}).get(schedule) or []
    if not fixed:
        return []
    out = []
    for p in result.points:
        best = max(fixed, key=lambda name: p.speedup[name])
        runs = (p.speedup_runs or {})
        mine, theirs = runs.get(schedule) or (p.speedup[schedule],), runs.get(best) or (p.speedup[best],)
        ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
        out.append(ScheduleReading(p.batch_size, schedule_gamma(ranges, p.batch_size), best,
                                   statistics.median(ratios), min(ratios), max(ratios)))
    return out
