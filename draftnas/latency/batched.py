"""Timing the batched steps a calibration keeps beside its batch-1 ones (`batch_records.BatchTiming`): the
target's decode and verifies (`timed_counts`), and each drafter base's decode, at batch B for every B
asked, on random weights of the real shapes, the way the loop runs them (draftnas's static decoder or
transformers' forward).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from draftnas.core.errors import DeviceError
from draftnas.core.machine import available_memory_bytes
from draftnas.core.options import option_error
from draftnas.core.placement import kv_bytes_per_sequence, weight_bytes
from draftnas.core.records import Progress
from draftnas.core.registry import Architecture
from draftnas.latency.batch_records import BatchTiming, suspect_points
from draftnas.latency.calibration_store import (
    StoredCalibration,
    host_key,
    read_calibration,
    store_path,
    write_calibration,
)
from draftnas.latency.records import HostCalibration, ProfileOptions
from draftnas.latency.runtime import Runtime, model_bytes
from draftnas.latency.timing import Group, calls_per_job, model_job, run_round_robin, ticker
from draftnas.models.kernel_choices import fresh_choices
from draftnas.models.records import MAX_WEIGHT_ONCE_ROWS

log = logging.getLogger(__name__)
# how batched steps are timed: 1 a decode and the largest verify; 2 also the verifies either side of 16 rows
# (`timed_counts`); 3 one-token batches multiplied as one product (`models.matmul.linear_2d`: the 1.5B's
# decode at batch 8 read 10 s before). Stored steps of another version are timed again.
BATCHED_TIMING = 3


def check_batches(batch_sizes: Sequence[int], flag: str = "--batch") -> tuple[int, ...]:
    """The batch sizes above 1, sorted; one line naming the bad one where one is below 1."""
    bad = [b for b in batch_sizes if b < 1]
    if bad:
        raise option_error("batch", f"batch size {bad[0]} is not allowed: a batch holds at least 1 sequence",
                           flag=flag)
    return tuple(sorted({b for b in batch_sizes if b > 1}))


def timed_counts(batch_size: int, verify_tokens: int) -> tuple[int, ...]:
    """The new-token counts the target is timed at at `batch_size`: a decode, the largest verify, and either
    side of the count whose rows (batch x tokens) pass `MAX_WEIGHT_ONCE_ROWS`, where a CPU product changes
    kernel (`models.matmul`), so a verify priced between two timed counts lies within one kernel's line
    (at B = 4 a verify of 5 tokens reads 20 rows, past the 16 of the few-row kernel)."""
    most = max(1, verify_tokens)
    below = MAX_WEIGHT_ONCE_ROWS // batch_size
    return tuple(sorted({n for n in (1, below, below + 1, most) if 1 <= n <= most}))


def time_batches(options: ProfileOptions, target: Architecture, batch_sizes: Sequence[int],
                 verify_tokens: int, context_tokens: int, stacks: Sequence[tuple[Architecture, str]] = (),
                 quant_dtype: str | None = None, progress: Progress | None = None) -> tuple[BatchTiming, ...]:
    """`target` at every B of `batch_sizes` (above 1) reading 1 and `verify_tokens` new tokens, and each
    (base, weights) of `stacks` reading 1, all at full depth after `context_tokens`; timed round robin so
    a slow spell of the host spreads over every point. `quant_dtype`: the activation dtype quantized stacks
    run in, where it is not the target's."""
    batches = check_batches(batch_sizes)
    if not batches:
        return ()
    rt = Runtime(options.validate())
    rtq = rt if quant_dtype in (None, options.resolved_dtype()) else \
        Runtime(dataclasses.replace(options, dtype=quant_dtype).validate())
    shapes: list[tuple[Architecture, str, bool]] = [(target, "dense", True)]  # True: its verifies too
    for a, w in stacks:  # each layer shape and format once (a base and a reference may be one shape)
        if all((a.with_shape(name=""), w) != (s.with_shape(name=""), sw) for s, sw, _ in shapes):
            shapes.append((a, w, False))
    groups = []
    for arch, weights, verifies in shapes:
        run = rt if weights == "dense" else rtq
        jobs = [model_job(run, arch, arch.num_hidden_layers, (b, n, context_tokens), "calibration")
                for b in batches for n in (timed_counts(b, verify_tokens) if verifies else (1,))]
        name = arch.name + ("" if weights == "dense" else f" with {weights} weights") + " at batch"
        groups.append(Group(functools.partial(run.build, arch, weights=weights), model_bytes(run, arch), jobs,
                            name=name))
    n_jobs = sum(len(g.jobs) for g in groups)
    log.info("timing %d batched steps (batches %s) of %d shape(s)", n_jobs, ", ".join(map(str, batches)),
             len(groups))
    skipped = run_round_robin(rt, groups, ticker(progress, n_jobs * calls_per_job(options)))
    if skipped:
        raise DeviceError(f"timing {target.name} at batch: {skipped[0].reason}")
    timed = [{f"{j.cond[0]}x{j.cond[1]}": j.measurement().median_ms for j in g.jobs} for g in groups]
    for (arch, weights, _), ms, g in zip(shapes, timed, groups, strict=True):
        again = suspect_points(ms)
        if not again:
            continue
        # a guard: the 1.5B's decode at batch 8 read 10 s here until its products were taken as one 2-D
        # product (`models.matmul.linear_2d`; new kernel choices did not help: the cause was elsewhere)
        log.warning("timing %s of %s again with its kernels chosen anew: each cost more than a larger step",
                    ", ".join(again), g.name)
        run = rt if weights == "dense" else rtq
        conds = [(int(key.split("x")[0]), int(key.split("x")[1]), context_tokens) for key in again]
        jobs = [model_job(run, arch, arch.num_hidden_layers, cond, "calibration") for cond in conds]
        redo = dataclasses.replace(g, jobs=jobs)
        with fresh_choices():
            run_round_robin(rt, [redo], ticker(None, 0))
        for key, job in zip(again, jobs, strict=True):
            ms[key] = min(ms[key], job.measurement().median_ms)  # what the loop can run at
    return tuple(BatchTiming(arch=arch, weights=weights, context_tokens=context_tokens, ms=ms)
                 for (arch, weights, _), ms in zip(shapes, timed, strict=True))


def timed_batches(batch_sizes: Sequence[int]) -> tuple[int, ...]:
    """The batches a calibration times for a workload of `batch_sizes`: the powers of two up to its largest,
    and the largest itself (none when it decodes one sequence at a time)."""
    largest = max(batch_sizes, default=1)
    if largest <= 1:
        return ()
    return tuple(sorted({b for b in (2 ** k for k in range(1, largest.bit_length() + 1)) if b <= largest}
                        | {largest}))


def stored_or_timed_batches(options: ProfileOptions, target: Architecture, calibration: HostCalibration,
                            request: dict[str, Any], batches: Sequence[int], verify_tokens: int,
                            stacks: Sequence[tuple[Architecture, str]], quant_dtype: str | None,
                            progress: Progress | None = None) -> tuple[HostCalibration, str]:
    """`calibration` with its batched steps (`HostCalibration.batched`): those stored beside it for these
    batches when they were timed against this very calibration (the same batch-1 figures: a calibration
    re-timed after a drift re-times its batches too), else timed now and stored. -> (it, one line)."""
    host = host_key()
    request = {**request, "batched": list(batches), "batched_timing": BATCHED_TIMING}
    path = store_path(host, request)
    if path.is_file():
        stored = read_calibration(path, flag="the stored batched calibration")
        if stored.calibration.target_ms == calibration.target_ms and stored.calibration.batched:
            return (dataclasses.replace(calibration, batched=stored.calibration.batched),
                    f"batched steps (B {', '.join(map(str, batches))}) reused from {path}")
    started = time.perf_counter()
    timings = time_batches(options, target, batches, verify_tokens, calibration.context_tokens, stacks,
                           quant_dtype, progress)
    out = dataclasses.replace(calibration, batched=timings)
    write_calibration(path, StoredCalibration(host=host, request=request, calibration=out))
    return out, (f"batched steps (B {', '.join(map(str, batches))}) timed here in "
                 f"{time.perf_counter() - started:.0f} s, stored in {path}")


def check_batch_fits(target: Architecture, dtype: str, batch: int, tokens: int,
                     available: int | None = None) -> None:
    """One line naming the batch where `batch` sequences of `tokens` tokens (context, prompt, a verify) and
    the target's weights in `dtype` exceed the memory this machine can allocate now (`available`)."""
    free = available_memory_bytes() if available is None else available
    need = weight_bytes(target, dtype) + batch * kv_bytes_per_sequence(target, dtype, tokens)
    if need > free:
        per_sequence = max(kv_bytes_per_sequence(target, dtype, tokens), 1)
        most = max(0, (free - weight_bytes(target, dtype)) // per_sequence)
        raise option_error("batch", f"of {batch} sequences of {tokens} tokens does not fit here: "
                                    f"{target.name} in {dtype} and their caches need {need / 2**30:.1f} GiB, "
                                    f"{free / 2**30:.1f} GiB are available (at most {most} sequences)")
