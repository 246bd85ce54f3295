"""Measure decoder latency on this machine and fit a `LatencyProfile` (`draftnas profile`).

LLaMA-family decoder stacks of a given `Architecture` are built with random
weights (nothing is downloaded) and one forward pass is timed at the shapes
speculative decoding uses: a draft step (1 new token) and a verification
(gamma + 1 new tokens) at several batch sizes, on top of a KV cache holding
`context_tokens` tokens. The cache is filled with random keys/values (a real
prefill would cost more than all the timing) and cropped back after every call,
so every repeat sees the same context. The LM head alone (final norm + N-row
projection) is timed at a few N so a reduced draft vocabulary can be predicted.

All configurations of one shape are timed round-robin (one call each per round),
so a burst of background load spreads over all of them instead of skewing one.
On CUDA, timings use CUDA events after a synchronize.

Modes: "eager" times transformers' LlamaForCausalLM over a DynamicCache (the
forward draftnas's CPU loop runs today); "static" times `draftnas.models.decoder`'s
step over a KV cache allocated once at its final size, with its write positions
as an input; "cuda-graph" captures that same step once per configuration and
times its replay, as serving engines run it.

Memory: configurations are grouped into chunks whose real peak — weights, every
KV cache as allocated, outputs held between calls, and the largest transient of
one forward — fits the run's budget (free device memory, or available RAM, less
a margin). A configuration that cannot fit even alone is not timed; it is
listed in the profile's `skipped` with the bytes it needed. torch and
transformers are imported inside the functions.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Sequence
from datetime import datetime, timezone

import numpy as np
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_identity, load_average
from draftnas.core.options import option_error
from draftnas.core.placement import shard
from draftnas.core.provenance import package_versions
from draftnas.core.records import Progress
from draftnas.core.registry import Architecture
from draftnas.latency.grid import plan_profile
from draftnas.latency.model import fit_latency_model
from draftnas.latency.records import (
    SCHEMA_VERSION,
    Condition,
    ExtrapolationCheck,
    ExtrapolationPoint,
    LatencyProfile,
    ProfileOptions,
    ProfilePlan,
    TargetTiming,
)
from draftnas.latency.runtime import Runtime
from draftnas.latency.timing import (
    Group,
    calls_per_job,
    head_group,
    model_group,
    run_round_robin,
    ticker,
)

log = logging.getLogger(__name__)


def count_ticks(plan: ProfilePlan, options: ProfileOptions) -> int:
    """Progress units of a run: one per forward call (warm-up or timed)."""
    jobs = len(plan.shapes) * len(plan.conditions) + len(plan.head_points)
    if plan.extrapolation_shape is not None:
        jobs += (len(plan.extrapolation_layers) + 1) * len(plan.extrapolation_conditions)
    return jobs * calls_per_job(options)


def _extrapolation_shapes(plan: ProfilePlan) -> tuple[Architecture, ...]:
    arch = plan.extrapolation_shape
    if arch is None:
        return ()
    return (arch, *(arch.with_shape(name=f"{arch.name}[:{k}]", num_hidden_layers=k)
                    for k in plan.extrapolation_layers))


def _versions() -> dict[str, str]:
    packages = ("draftnas", "torch", "transformers", "numpy", "scipy")
    return {"python": platform.python_version(), **package_versions(packages, missing="missing")}


def measure_profile(options: ProfileOptions, progress: Progress | None = None,
                    plan: ProfilePlan | None = None) -> LatencyProfile:
    """Time the plan's shapes on this device, fit the latency model, return the profile.

    `progress(done, total)` is called after every forward call (warm-up or timed).
    """
    options.validate()
    started, load_before = time.perf_counter(), load_average()
    rt = Runtime(options)
    plan = plan or plan_profile(options)
    heldout = set(plan.heldout)
    groups = [model_group(rt, a, (a.num_hidden_layers,), plan.conditions,
                           "heldout" if a.name in heldout else "train") for a in plan.shapes]
    if plan.head_points:
        groups.append(head_group(rt, plan))
    extrapolation_group = None
    if plan.extrapolation_shape is not None:
        arch = plan.extrapolation_shape
        extrapolation_group = model_group(rt, arch, (*plan.extrapolation_layers, arch.num_hidden_layers),
                                           plan.extrapolation_conditions, "extrapolation")
        groups.append(extrapolation_group)
    skipped = run_round_robin(rt, groups, ticker(progress, count_ticks(plan, options)))
    measurements = [job.measurement() for group in groups for job in group.jobs if job.times_ms]
    fit = fit_latency_model(measurements, plan.shapes, options.resolved_dtype())
    extrapolation = _extrapolation_result(plan, extrapolation_group) if extrapolation_group else None
    return LatencyProfile(
        schema_version=SCHEMA_VERSION, kind="measured", device=options.device,
        device_name=rt.device_name(), dtype=options.resolved_dtype(), versions=_versions(),
        measurements=tuple(measurements), coefficients=fit.coefficients,
        heldout_mape=fit.heldout_mape, train_mape=fit.train_mape, mode=options.mode,
        threads=rt.torch.get_num_threads(), shapes=(*plan.shapes, *_extrapolation_shapes(plan)),
        heldout_shapes=plan.heldout, extrapolation=extrapolation,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        wall_s=round(time.perf_counter() - started, 1),
        notes=f"load average (1/5/15 min) before: {load_before}, after: {load_average()}; "
              f"options: {options.to_dict()}",
        series=plan.series, skipped=tuple(skipped), cpu=None if rt.cuda else cpu_identity(),
    )


def _extrapolation_result(plan: ProfilePlan, group: Group) -> ExtrapolationCheck | None:
    """The k-layer method's error per condition; conditions with a skipped stack are left out
    (None when none is left)."""
    arch = plan.extrapolation_shape
    assert arch is not None
    medians = {(j.layers, j.cond): j.measurement().median_ms for j in group.jobs if j.times_ms}
    return extrapolation_check(arch.name, medians, plan.extrapolation_conditions, plan.extrapolation_layers,
                               arch.num_hidden_layers)


def extrapolation_check(shape: str, medians: dict[tuple[int, Condition], float],
                        conditions: Sequence[Condition], timed_layers: Sequence[int],
                        full: int) -> ExtrapolationCheck | None:
    """The k-layer method's error: per condition, the extrapolation from the `timed_layers` stacks
    against the stack of `full` layers timed beside them (`medians[(layers, condition)]`).
    Conditions missing a stack (skipped for memory) are left out; None when none is left."""
    points = []
    for cond in conditions:
        if any((k, cond) not in medians for k in (*timed_layers, full)):
            continue
        measured = medians[(full, cond)]
        estimate = extrapolate_from_layers({k: medians[(k, cond)] for k in timed_layers}, full)
        points.append(ExtrapolationPoint(
            batch_size=cond[0], new_tokens=cond[1], context_tokens=cond[2], full_ms=measured,
            extrapolated_ms=estimate, error_pct=(estimate - measured) / measured * 100.0))
    if not points:
        return None
    errors = [abs(p.error_pct) for p in points]
    return ExtrapolationCheck(shape=shape, full_layers=full, timed_layers=tuple(timed_layers),
                              points=tuple(points), mean_abs_error_pct=float(np.mean(errors)),
                              max_abs_error_pct=float(np.max(errors)))


def extrapolate_from_layers(times_ms: dict[int, float], layers: int) -> float:
    """fixed + L * per_layer from timings of stacks with different layer counts (least squares)."""
    ks = np.array(sorted(times_ms), dtype=float)
    if len(ks) < 2:
        raise InvalidInputError("extrapolation needs timings of at least two layer counts")
    ts = np.array([times_ms[int(k)] for k in ks])
    per_layer, fixed = np.polyfit(ks, ts, 1)
    return float(fixed + layers * per_layer)


def _time_stacks(rt: Runtime, arch: Architecture, conditions: Sequence[Condition],
                 layer_counts: Sequence[int],
                 progress: Progress | None = None) -> dict[tuple[int, Condition], float]:
    """Median ms of `arch`'s first k layers at each condition, for k in `layer_counts` (one model of
    max(k) layers is built)."""
    group = model_group(rt, arch, layer_counts, conditions, "extrapolation")
    skipped = run_round_robin(rt, [group], ticker(progress, len(group.jobs) * calls_per_job(rt.options)))
    if skipped:
        raise InvalidInputError(f"{len(skipped)} of the k-layer stacks of {arch.name} do not fit here, "
                                f"e.g. {skipped[0].shape}: {skipped[0].reason}; time fewer layers")
    return {(j.layers, j.cond): j.measurement().median_ms for j in group.jobs}


def measure_target(options: ProfileOptions, target: Architecture, *, layer_counts: Sequence[int] = (2, 4),
                   batch_sizes: Sequence[int] = (1,), max_gamma: int = 4, context_tokens: int = 128,
                   gpus: int = 1, check_layers: int | None = None,
                   progress: Progress | None = None) -> TargetTiming:
    """A target's decode and verify latencies at full depth from k-layer stacks of its real shape
    (random weights), with the method's error measured on the deepest stack that fits.

    `gpus` > 1 times one tensor-parallel rank's share (heads, MLP channels and head rows / N):
    the search adds the all-reduces (`placement.ShardedLatency`). The check times a stack of
    `check_layers` (default: the full depth if its weights take at most a third of the memory
    budget, else the deepest that does) and compares it with the extrapolation to that depth.
    """

    ks = tuple(sorted(set(layer_counts)))
    if len(ks) < 2 or ks[0] < 1:
        raise option_error("layers", "needs at least two different layer counts >= 1, got "
                                     f"{', '.join(map(str, layer_counts))}")
    if ks[-1] >= target.num_hidden_layers:
        raise option_error("layers", f"{ks[-1]} is not fewer than {target.name}'s "
                                     f"{target.num_hidden_layers} layers")
    if gpus < 1 or (gpus > 1 and options.device != "cuda"):
        raise option_error("tp", f"{gpus}: a tensor-parallel share is timed on CUDA only (got {{device}} "
                                 f"{options.device})")
    timed = shard(target, gpus)
    if gpus > 1:
        timed = timed.with_shape(vocab_size=max(1, target.vocab_size // gpus), name=f"{target.name}/tp{gpus}")
    news = tuple(range(1, max_gamma + 2))
    conditions = [(b, n, context_tokens) for b in batch_sizes for n in news]
    started = time.perf_counter()
    rt = Runtime(options.validate())
    if check_layers is None:
        per_layer = timed.layer_parameters() * rt.dtype_bytes
        fits = max(1, int(rt.memory_budget_bytes() / 3 // max(per_layer, 1)))
        check_layers = min(timed.num_hidden_layers, fits)
    counts = tuple(sorted(set(ks) | ({check_layers} if check_layers > ks[-1] else set())))
    medians = _time_stacks(rt, timed, conditions, counts, progress)
    ms = {f"{b}x{n}": extrapolate_from_layers({k: medians[(k, (b, n, c))] for k in ks},
                                              timed.num_hidden_layers)
          for b, n, c in conditions}
    check = (extrapolation_check(f"{timed.name}[:{check_layers}]", medians, conditions, ks, check_layers)
             if check_layers > ks[-1] else None)
    return TargetTiming(target=target.name, arch=timed, gpus=gpus, timed_layers=ks,
                        context_tokens=context_tokens,
                        batch_sizes=tuple(batch_sizes), new_tokens=news, ms=ms, check=check,
                        device_name=rt.device_name(), mode=options.mode,
                        wall_s=round(time.perf_counter() - started, 1))


def measure_read_bandwidth_gb_s(device: str = "cpu", mbytes: int = 1024, repeats: int = 7) -> float:
    """Memory read bandwidth (GB/s): the median time of summing a `mbytes` fp32 buffer, which
    reads every byte once (the same streaming a decode step's weights need)."""

    x = torch.ones(mbytes * 2**20 // 4, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for i in range(repeats + 2):
        sync()
        started = time.perf_counter()
        x.sum()
        sync()
        if i >= 2:
            times.append(time.perf_counter() - started)
    return float(x.numel() * 4 / float(np.median(times)) / 1e9)
