"""Timing many configurations together: jobs grouped per model, chunks whose memory peak
fits the budget, timed round-robin; out-of-memory chunks are halved and retried.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftnas.core.placement import activation_bytes
from draftnas.core.records import Progress
from draftnas.core.registry import Architecture
from draftnas.latency.records import (
    STATIC_MODES,
    Condition,
    Measurement,
    ProfileOptions,
    ProfilePlan,
    SkippedConfig,
)
from draftnas.latency.runtime import (
    EagerStep,
    HeadStep,
    Runtime,
    kv_bytes,
    model_bytes,
    out_of_memory,
    static_step,
)

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One configuration to time; `make(model, pool)` builds its step (KV cache, inputs) when timed.

    `held_bytes` stay allocated while the job's chunk is timed (its KV cache, outputs a
    step holds); `transient_bytes` live only during one call (activations, logits).
    """

    kind: str  # "model" | "head"
    arch: Architecture
    layers: int
    cond: Condition
    head_rows: int
    split: str
    make: Callable[[Any, Any], Any]
    held_bytes: int = 0
    transient_bytes: int = 0
    times_ms: list[float] = field(default_factory=list)

    @property
    def shape_name(self) -> str:
        full = self.layers == self.arch.num_hidden_layers or self.kind == "head"
        return self.arch.name if full else f"{self.arch.name}[:{self.layers}]"

    def measurement(self) -> Measurement:
        q1, med, q3 = np.percentile(np.asarray(self.times_ms), [25, 50, 75])
        batch, new, context = self.cond
        return Measurement(kind=self.kind, shape=self.shape_name, batch_size=batch, new_tokens=new,
                           context_tokens=context, head_rows=self.head_rows, median_ms=float(med),
                           q1_ms=float(q1), q3_ms=float(q3), repeats=len(self.times_ms),
                           split=self.split)

    def skipped(self, needed: int, budget: int, reason: str = "") -> SkippedConfig:
        batch, new, context = self.cond
        return SkippedConfig(kind=self.kind, shape=self.shape_name, batch_size=batch, new_tokens=new,
                             context_tokens=context, needed_bytes=needed, budget_bytes=budget,
                             reason=reason or f"needs {needed / 2**30:.2f} GiB at its peak, the budget is "
                                              f"{budget / 2**30:.2f} GiB")


@dataclass
class Group:
    """Jobs sharing one model (None for the head-only micro-benchmarks)."""

    build: Callable[[], Any]
    weight_bytes: int
    jobs: list[Job]
    name: str = ""  # what it builds, for the log while it builds (with its kernel choices: minutes)


@dataclass
class Chunk:
    """Jobs timed together (round-robin) whose peak memory fits the budget."""

    parts: list[tuple[Group, list[Job]]] = field(default_factory=list)
    held_bytes: int = 0  # weights of its groups + held bytes of its jobs
    transient_bytes: int = 0  # the largest transient of its jobs

    def peak_with(self, group: Group, job: Job) -> int:
        weights = 0 if self.parts and self.parts[-1][0] is group else group.weight_bytes
        return self.held_bytes + weights + job.held_bytes + max(self.transient_bytes, job.transient_bytes)

    def add(self, group: Group, job: Job) -> None:
        if not (self.parts and self.parts[-1][0] is group):
            self.parts.append((group, []))
            self.held_bytes += group.weight_bytes
        self.parts[-1][1].append(job)
        self.held_bytes += job.held_bytes
        self.transient_bytes = max(self.transient_bytes, job.transient_bytes)


def plan_chunks(groups: Sequence[Group], budget_bytes: int) -> tuple[list[Chunk], list[SkippedConfig]]:
    """Split the jobs, in order, into chunks whose peak fits `budget_bytes`; a job whose peak
    does not fit even alone (its model's weights included) is skipped, with the bytes it needs.

    A group's jobs may span chunks (its model is then built once per chunk).
    """
    chunks: list[Chunk] = [Chunk()]
    skipped: list[SkippedConfig] = []
    for group in groups:
        for job in group.jobs:
            alone = Chunk().peak_with(group, job)
            if alone > budget_bytes:
                skipped.append(job.skipped(alone, budget_bytes))
                continue
            if chunks[-1].parts and chunks[-1].peak_with(group, job) > budget_bytes:
                chunks.append(Chunk())
            chunks[-1].add(group, job)
    return [c for c in chunks if c.parts], skipped


def _time_chunk(rt: Runtime, chunk: Chunk, tick: Callable[[], None]) -> None:
    """Build the chunk's models and steps, warm every step up, then time one call of every step
    per round. Everything it built is released when it returns (or raises)."""
    pool = rt.torch.cuda.graph_pool_handle() if rt.options.mode == "cuda-graph" else None
    steps: list[tuple[Job, Any]] = []
    for group, jobs in chunk.parts:
        if group.name:  # a log's heartbeat names it: building and choosing kernels can take minutes
            log.info("building %s (random weights) and choosing its products' kernels", group.name)
        model = group.build()
        steps += [(job, job.make(model, pool)) for job in jobs]
        del model
    names = [group.name for group, _ in chunk.parts if group.name]
    if names:  # the heartbeat's last line must not name a build while the steps are being timed
        log.info("timing %d steps of %s, round-robin", len(steps), ", ".join(names))
    for _job, step in steps:
        for _ in range(rt.options.resolved_warmup()):
            step()
            step.reset()
            tick()
    for _ in range(rt.options.resolved_repeats()):
        for job, step in steps:
            job.times_ms.append(rt.time_ms(step))
            step.reset()
            tick()


def _split(chunk: Chunk) -> tuple[Chunk, Chunk]:
    """The chunk's jobs in two halves (in order), each a chunk of its own."""
    jobs = [(group, job) for group, part in chunk.parts for job in part]
    halves = (Chunk(), Chunk())
    for i, (group, job) in enumerate(jobs):
        halves[0 if i < len(jobs) // 2 else 1].add(group, job)
    return halves


def run_round_robin(rt: Runtime, groups: list[Group], tick: Callable[[], None]) -> list[SkippedConfig]:
    """Time every job, chunk by chunk, round-robin inside a chunk; `tick` after every call.

    Interleaving all shapes and configurations spreads background-load bursts and drift
    over all of them instead of skewing whichever shape was being timed; jobs are taken in
    chunks whose peak memory fits the budget (`plan_chunks`). Should a chunk still run out
    of memory (allocator fragmentation, kernels' workspaces), it is freed, halved and
    retried; a job that runs out of memory alone is skipped. Returns the skipped jobs;
    `tick` is called for their calls too, so progress still reaches its total.
    """
    calls = rt.options.resolved_warmup() + rt.options.resolved_repeats()
    budget = rt.memory_budget_bytes()
    queue, skipped = plan_chunks(groups, budget)
    for _ in range(calls * len(skipped)):
        tick()
    with rt.torch.inference_mode():
        while queue:
            chunk = queue.pop(0)
            try:
                _time_chunk(rt, chunk, tick)
            except RuntimeError as exc:
                if not out_of_memory(exc):
                    raise
                rt.free()
                jobs = [job for _, part in chunk.parts for job in part]
                for job in jobs:
                    job.times_ms.clear()
                if len(jobs) > 1:
                    queue[:0] = list(_split(chunk))
                    continue
                group = chunk.parts[0][0]
                skipped.append(jobs[0].skipped(Chunk().peak_with(group, jobs[0]), budget,
                                               reason="ran out of memory when run alone"))
            rt.free()
    for skip in skipped:
        log.warning("not timed: %s at batch %d, %d new tokens, context %d: %s", skip.shape,
                    skip.batch_size, skip.new_tokens, skip.context_tokens, skip.reason)
    return skipped


def model_job(rt: Runtime, arch: Architecture, layers: int, cond: Condition, split: str) -> Job:
    """A forward of `arch`'s first `layers` layers at `cond`, with its memory as really allocated.

    Static modes hold the cache (context + new slots) and the step's last logits; eager mode
    holds a DynamicCache and, while it appends the new tokens, copies one layer's keys/values
    (torch.cat) and builds the random context layer by layer.
    """

    batch, new, context = cond
    kv = kv_bytes(rt, arch, cond, layers)
    act = activation_bytes(arch, rt.dtype_bytes, batch, new, slots=context + new)
    logits = batch * new * arch.vocab_size * rt.dtype_bytes
    if rt.options.mode in STATIC_MODES:
        held, transient = kv + logits, act

        def make(model: Any, pool: Any) -> Any:
            return static_step(rt, model, arch, cond, layers, pool)
    else:
        held, transient = kv, act + 2 * kv // max(1, layers)

        def make(model: Any, pool: Any) -> Any:
            return EagerStep(rt, model, arch, cond, layers)
    return Job("model", arch, layers, cond, arch.vocab_size, split, make, held, transient)


def model_group(rt: Runtime, arch: Architecture, layer_counts: Sequence[int],
                 conditions: Sequence[Condition], split: str) -> Group:
    """A model of `arch` with max(layer_counts) layers, timed through its first k layers for each k."""
    built = arch.with_shape(num_hidden_layers=max(layer_counts))
    jobs = [model_job(rt, arch, k, c, split) for k in layer_counts for c in conditions]
    return Group(functools.partial(rt.build, built), model_bytes(rt, built), jobs,
                 name=f"{arch.name} ({built.num_hidden_layers} layers)")


def head_group(rt: Runtime, plan: ProfilePlan) -> Group:
    """LM-head cost as a function of its row count N (for reduced draft vocabularies)."""
    shapes = {a.name: a for a in plan.shapes}
    jobs = []
    for shape, rows, tokens in plan.head_points:
        hidden = shapes[shape].hidden_size
        jobs.append(Job("head", shapes[shape], 0, (tokens, 1, 0), rows, "train",
                         functools.partial(lambda _m, _p, h, r, t: HeadStep(rt, h, r, t),
                                           h=hidden, r=rows, t=tokens),
                         held_bytes=(hidden * rows + tokens * hidden) * rt.dtype_bytes,
                         transient_bytes=tokens * (rows + 2 * hidden) * rt.dtype_bytes))
    return Group(lambda: None, 0, jobs)


def calls_per_job(options: ProfileOptions) -> int:
    return options.resolved_warmup() + options.resolved_repeats()


def ticker(progress: Progress | None, total: int) -> Callable[[], None]:
    """`tick()` moves `progress` one call on, to `total` at most; the stage starts at once (at 0), so a
    log's heartbeat reports it while the first models are still being built."""
    done = 0
    if progress is not None:
        progress(0, total)

    def tick() -> None:
        nonlocal done
        done = min(done + 1, total)  # after an out-of-memory retry the bar may reach its end early
        if progress is not None:
            progress(done, total)

    return tick
