"""`bench --engine vllm --batch-size 1,2,4,8`: the target alone and each drafter in vLLM's own continuous
batching, B requests submitted together (B prompts cycled from the set; at B = 1 each prompt alone), greedy,
fp32. Each round starts every arm's engine once (in a rotating order) and runs every batch size in it; a
speedup at B is paired per round (the arm's tokens/s over the target alone's at that B in that round), and
its figure is the median over rounds. An output counts as exact where it equals the target alone's for the
same prompt at the same B and round. No latency model prices vLLM's steps yet: no predicted crossover.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

from draftnas.bench.batch_records import BatchedBenchResult, BatchPoint
from draftnas.bench.batched import first_below_one
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.vllm import TARGET, VllmArm, check_settings, plan_vllm_bench
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
    for r in range(options.rounds):
        for i, a in enumerate(arms[r % len(arms):] + arms[:r % len(arms)]):
            log.info("vLLM round %d: %s %s at B = %s", r + 1, a.name, json.dumps(a.config), batches)
            runs[a.name].append(_by_batch(run_vllm(vllm, plan.job | {"speculative_config": a.config})))
            if progress:
                progress(r * len(arms) + i + 1, options.rounds * len(arms))
    drafters = [a for a in arms if a.config is not None]
    points = tuple(_point(b, runs, drafters) for b in batches)
    return BatchedBenchResult(
        target=target, drafters={a.name: a.drafter.text for a in drafters if a.drafter is not None},
        gamma=options.gamma, max_new_tokens=options.max_new_tokens, device=vllm.device, dtype="float32",
        threads=cpu_count(), profile="", points=points,
        measured_crossover={a.name: first_below_one([(p.batch_size, p.speedup[a.name]) for p in points])
                            for a in drafters},
        predicted_crossover={a.name: None for a in drafters}, prompts=tuple(p.id for p in plan.prompts),
        host=cpu_identity().label(), load_average_before=load_before, versions={"vllm": vllm.version},
        wall_s=round(time.perf_counter() - started, 2), engine="vllm")


def _point(batch: int, runs: dict[str, list[dict[int, dict[str, Any]]]], drafters: Sequence[VllmArm]
           ) -> BatchPoint:
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
                      tokens_per_step=per_step, exact_match_rate=exact, predicted_speedup={},
                      speedup_runs=speedups)
