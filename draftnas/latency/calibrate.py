"""Calibrating a host: the target's decode and verify steps, drafter-sized prefixes and the
work outside the forward, timed on the machine a search runs on (seconds, not a profile's minutes).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftnas.core.errors import DeviceError
from draftnas.core.machine import cpu_identity
from draftnas.core.options import option_error
from draftnas.core.records import Progress
from draftnas.core.registry import Architecture
from draftnas.latency.calibration_store import (
    StoredCalibration,
    check_here,
    drift,
    drifted,
    host_key,
    read_calibration,
    store_path,
    write_calibration,
)
from draftnas.latency.records import (
    STATIC_MODES,
    HostCalibration,
    ProfileOptions,
    StackCalibration,
)
from draftnas.latency.runtime import Runtime, model_bytes
from draftnas.latency.timing import Group, calls_per_job, model_job, run_round_robin, ticker
from draftnas.models.engines import StaticEngine
from draftnas.models.records import dtype_name, weights_problem
from draftnas.models.speculative import greedy_decode, speculative_generate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationPlan:
    """What `calibrate_host` times of the target and beside it (random weights, seconds not a profile's
    minutes). Steps run the way the options' mode runs them (eager: transformers' forward, what `--engine
    hf` runs; static: draftnas's decoder, what `--engine static` runs)."""

    new_tokens: tuple[int, ...]  # the target's steps at full depth: each count of new tokens
    prefix_layers: tuple[int, ...] = (1, 2)  # one new token through the target's first k layers
    context_tokens: int = 128
    overheads: bool = True  # short real decoding runs measure the work outside the forward too
    prompt_tokens: int = 0  # > 0: the prefill of a prompt that long
    # reduced draft heads: one new token of the full-depth target with each (`HostCalibration.head_saving_ms`)
    head_rows: tuple[int, ...] = ()
    # more shapes timed alike (a drafter's base, a reference drafter): first layers, full depth and reduced
    # heads at one new token (`HostCalibration.stacks`), pricing drafters of their width from their kernels
    stacks: tuple[Architecture, ...] = ()
    # drafter bases timed alike in each weight format of `quant_formats` ("int8", "int4", per layer group;
    # draftnas's static decoder, where `weights_problem` lets each run: `HostCalibration.quant_stacks`)
    quant_stacks: tuple[Architecture, ...] = ()
    quant_formats: tuple[str, ...] = ("int8",)
    # False: the reduced heads are timed under the stacks only (drafters are cut from a base timed as a
    # stack, so the target's own body under each head decides nothing and costs a full-size build per head)
    target_heads: bool = True
    # the activation dtype the quantized stacks run in where not the target's (an fp32 target with
    # bf16-activation int8 drafters, where that int8 kernel is the fast one)
    quant_dtype: str | None = None


def calibrate_host(options: ProfileOptions, target: Architecture, plan: CalibrationPlan,
                   progress: Progress | None = None) -> HostCalibration:
    """Time `target` on this machine as `plan` says. With more than the target's own jobs, the target is
    timed at the start and again at the end, and its medians pool both passes."""
    started, context = time.perf_counter(), plan.context_tokens
    rt = Runtime(options.validate())
    formats = tuple(f for f in plan.quant_formats if f != "dense") if plan.quant_stacks else ()
    if formats and options.mode not in STATIC_MODES:
        raise DeviceError(f"{formats[0]} drafters run in draftnas's static decoder only: calibrate them in a "
                          f"static mode ({', '.join(STATIC_MODES)})")
    unavailable = [p for f in formats if (p := weights_problem(f, rt.device.type, dtype_name(rt.dtype)))]
    if unavailable:
        raise DeviceError(unavailable[0])
    full = target.num_hidden_layers
    prefixes = tuple(k for k in sorted(set(plan.prefix_layers) | ({1} if plan.overheads else set()))
                     if k < full)
    counts = tuple(sorted(set(plan.new_tokens) | {1} | ({2, 3, 4} if plan.overheads else set())))
    jobs = [model_job(rt, target, full, (1, n, context), "calibration") for n in counts]
    jobs += [model_job(rt, target, k, (1, 1, context), "calibration") for k in prefixes]
    if plan.overheads and full > 1:  # the first layer's verify steps: the decodes time the work outside
        jobs += [model_job(rt, target, 1, (1, n, context), "calibration") for n in (2, 3, 4)]
    if plan.prompt_tokens > 0:
        jobs.append(model_job(rt, target, full, (1, plan.prompt_tokens, 0), "calibration"))
    groups = [Group(functools.partial(rt.build, target), model_bytes(rt, target), jobs, name=target.name)]
    rows = sorted({r for r in plan.head_rows if 0 < r < target.vocab_size})
    target_rows = rows if plan.target_heads else []
    for r in target_rows:  # the target's body under an r-row head: full depth and (if timed) its first layer
        shape = target.with_shape(vocab_size=r)
        depths = (full, 1) if 1 in prefixes else (full,)
        jobs_r = [model_job(rt, shape, k, (1, 1, context), "calibration") for k in depths]
        groups.append(Group(functools.partial(rt.build, shape), model_bytes(rt, shape), jobs_r,
                            name=f"{target.name} under a {r:,}-row head"))
    extra_stacks = {a.name: a for a in plan.stacks if a.with_shape(name="") != target.with_shape(name="")}
    stack_groups = {name: _stack_groups(rt, a, prefixes, rows, context, prompt_tokens=plan.prompt_tokens)
                    for name, a in extra_stacks.items()}
    # quantized drafters may run with activations in another dtype than the target's (`plan.quant_dtype`)
    rtq = rt if plan.quant_dtype in (None, options.resolved_dtype()) else \
        Runtime(dataclasses.replace(options, dtype=plan.quant_dtype).validate())
    quant_groups = {(f, a.name): _stack_groups(rtq, a, prefixes, rows, context, weights=f,
                                               prompt_tokens=plan.prompt_tokens)
                    for f in formats for a in plan.quant_stacks}
    all_groups = groups + [g for gs in (*stack_groups.values(), *quant_groups.values()) for g in gs]
    if len(all_groups) > 1:
        # the target's steps once more at the end, their times pooled with the first pass: the AMD
        # EPYC Zen 5 host's speed for the 1.5B moves between spells of tens of seconds to minutes,
        # and one pass reads whichever spell it lands in
        all_groups.append(groups[0])
    n_jobs = sum(len(g.jobs) for g in all_groups)
    skipped = run_round_robin(rt, all_groups, ticker(progress, n_jobs * calls_per_job(options)))
    if skipped:
        raise DeviceError(f"calibrating {target.name} here: {skipped[0].reason}")
    reduced = {r: g.jobs[0].measurement().median_ms for r, g in zip(target_rows, groups[1:], strict=True)}
    reduced_first = {r: g.jobs[1].measurement().median_ms
                     for r, g in zip(target_rows, groups[1:], strict=True) if len(g.jobs) > 1}
    medians = {(j.layers, j.cond[1]): j.measurement().median_ms for j in jobs if j.cond[2] == context}
    prefill = {j.cond[1]: j.measurement().median_ms for j in jobs if j.cond[2] == 0}
    target_ms = {n: medians[(full, n)] for n in counts}
    prefix_ms = {k: medians[(k, 1)] for k in prefixes}
    extra = (0.0, 0.0, 0.0)
    if plan.overheads:
        read = decoding_overheads(rt, target, context, {n: medians[(1, n)] for n in (1, 2, 3, 4)})
        log.info("work outside the forward read %.2f ms per generated token, %.2f per drafted token, "
                 "%.2f per verify step (a negative reading counts as 0)", *read)
        extra = (max(0.0, read[0]), max(0.0, read[1]), max(0.0, read[2]))
    return HostCalibration(
        target=target.name, device_name=rt.device_name(), threads=rt.torch.get_num_threads(),
        context_tokens=context, target_ms=target_ms, prefix_ms=prefix_ms, mode=options.mode,
        wall_s=round(time.perf_counter() - started, 1), generate_overhead_ms=extra[0],
        draft_overhead_ms=extra[1], verify_overhead_ms=extra[2], prefill_ms=prefill,
        head_saving_ms={r: max(0.0, target_ms[1] - ms) for r, ms in reduced.items()},
        head_saving_prefix_ms={r: max(0.0, prefix_ms[1] - ms) for r, ms in reduced_first.items()},
        dtype=options.resolved_dtype(), cpu=None if rt.cuda else cpu_identity(),
        stacks={name: _stack_calibration(extra_stacks[name], gs, rows) for name, gs in stack_groups.items()},
        quant_stacks={f: {a.name: _stack_calibration(a, quant_groups[(f, a.name)], rows)
                          for a in plan.quant_stacks} for f in formats},
        quant_dtype=rtq.options.resolved_dtype() if formats else "")


def _stack_groups(rt: Runtime, arch: Architecture, prefixes: Sequence[int], head_rows: Sequence[int],
                  context: int, weights: str = "dense", prompt_tokens: int = 0) -> list[Group]:
    """One more shape's jobs: its first layers and full depth at one new token, its full depth reading a
    prompt of `prompt_tokens` (> 0: a drafter's prefill), then under each reduced head its full depth and
    first layer (built with its linear layers in `weights`)."""
    full = arch.num_hidden_layers
    # and its middle depth: the line that prices its cuts then spans the stack, and its full depth can be
    # predicted from the prefixes alone (`CalibratedModel.without_full_depth`) to check that line
    depths = sorted({k for k in prefixes if k < full} | ({full // 2} if full >= 4 else set())) + [full]
    build = functools.partial(rt.build, weights=weights)
    jobs = [model_job(rt, arch, k, (1, 1, context), "calibration") for k in depths]
    if prompt_tokens > 0:
        jobs.append(model_job(rt, arch, full, (1, prompt_tokens, 0), "calibration"))
    name = arch.name + ("" if weights == "dense" else f" with {weights} weights")
    groups = [Group(functools.partial(build, arch), model_bytes(rt, arch), jobs, name=name)]
    for r in (r for r in head_rows if r < arch.vocab_size):
        shape = arch.with_shape(vocab_size=r)
        jobs = [model_job(rt, shape, k, (1, 1, context), "calibration") for k in (full, 1)]
        groups.append(Group(functools.partial(build, shape), model_bytes(rt, shape), jobs,
                            name=f"{name} under a {r:,}-row head"))
    return groups


def _stack_calibration(arch: Architecture, groups: Sequence[Group],
                       head_rows: Sequence[int]) -> StackCalibration:
    # a prefill reads no context (the target's own are told apart the same way in `calibrate_host`)
    ms = {j.layers: j.measurement().median_ms for j in groups[0].jobs if j.cond[2] != 0}
    prefill = {j.cond[1]: j.measurement().median_ms for j in groups[0].jobs if j.cond[2] == 0}
    full = ms.pop(arch.num_hidden_layers)
    reduced = [(r, g) for r, g in zip((r for r in head_rows if r < arch.vocab_size), groups[1:], strict=True)]
    return StackCalibration(
        arch=arch, prefix_ms=ms, full_ms=full,
        head_saving_ms={r: max(0.0, full - g.jobs[0].measurement().median_ms) for r, g in reduced},
        head_saving_prefix_ms={r: max(0.0, ms[1] - g.jobs[1].measurement().median_ms) for r, g in reduced
                               if 1 in ms}, prefill_ms=prefill)


def choose_dtype(options: ProfileOptions, target: Architecture, new_tokens: int, dtypes: Sequence[str],
                 context_tokens: int = 128, repeats: int = 5, drop_above: float = 2.0
                 ) -> tuple[str, dict[str, dict[int, float]]]:
    """The dtype whose decode plus verify of `new_tokens` tokens of `target` (random weights) is the
    fastest on this machine, and each dtype's two timings (medians of `repeats`): the dtype speculative
    decoding will run in.

    A first probe times each dtype three times with plain kernels (choosing each product's form for a
    dtype about to lose would take most of the choice); one that takes over `drop_above`
    times the fastest there is dropped (its probe stands as its timing), the others are timed again
    with their kernels chosen. The rest are timed round-robin in one
    pass (when both models fit the memory budget together), so a burst of other work on the host slows
    all of them alike (timed one after the other, a burst during one dtype's turn would decide the
    choice; docs/hosts/ has the case)."""
    probe = _time_dtypes(options, target, new_tokens, dtypes, context_tokens, repeats=3, kernels="linear")
    if not probe:
        raise DeviceError(f"{target.name} fits in none of {', '.join(dtypes)} here")
    fastest = min(sum(ms.values()) for ms in probe.values())
    close = [d for d in dtypes if d in probe and sum(probe[d].values()) <= drop_above * fastest]
    for d in (d for d in probe if d not in close):
        log.info("dtype %s dropped after its first probe (%.0f ms against %.0f)", d, sum(probe[d].values()),
                 fastest)
    timings = dict(probe)
    if len(close) > 1:
        timings |= _time_dtypes(options, target, new_tokens, close, context_tokens, repeats)
    best = min(close, key=lambda d: sum(timings[d].values()))
    return best, timings


def _time_dtypes(options: ProfileOptions, target: Architecture, new_tokens: int, dtypes: Sequence[str],
                 context_tokens: int, repeats: int, kernels: str = "auto") -> dict[str, dict[int, float]]:
    """Each dtype's decode and `new_tokens`-token verify of `target`, medians of `repeats`, timed
    round-robin in one pass (`kernels`: "linear" for plain F.linear products); a dtype that fits
    nowhere is left out."""
    runtimes = {d: Runtime(dataclasses.replace(options, dtype=d, repeats=repeats, warmup=1).validate())
                for d in dtypes}
    for rt in runtimes.values():
        rt.kernels = kernels
    full = target.num_hidden_layers
    jobs = {d: [model_job(rt, target, full, (1, n, context_tokens), "calibration")
                for n in sorted({1, new_tokens})] for d, rt in runtimes.items()}
    groups = [Group(functools.partial(rt.build, target), model_bytes(rt, target), jobs[d])
              for d, rt in runtimes.items()]
    run_round_robin(next(iter(runtimes.values())), groups, ticker(None, 1))
    timings = {d: {j.cond[1]: j.measurement().median_ms for j in js} for d, js in jobs.items()
               if all(j.times_ms for j in js)}
    for rt in runtimes.values():
        rt.free()
    return timings


def decoding_overheads(rt: Runtime, target: Architecture, context_tokens: int,
                       step_ms: dict[int, float]) -> tuple[float, float, float]:
    """Work outside the forward, in ms: plain decoding per token, draftnas's loop per drafted
    token and per verify step — the part of real decoding runs that the timed steps do not explain.

    Timed with `target`'s first layer (`step_ms`: its step at n new tokens, timed with the others) as
    both target and drafter: the work outside the forward is the loop's and the decoder's per call,
    not per layer, and the first layer's steps are a fraction of the full target's, so the runs take
    a fraction of the time (with the full target they took 3.7 minutes on a 2-core AMD EPYC Zen 3,
    with its first layer about 1 minute). Where the work is below the host's jitter, no way reads it:
    on that host three readings of each term spread over -8..+33 ms, around first-layer steps of
    77-100 ms (benchmarks/outside_forward.py). A drafter that is the target's copy is accepted every
    time, so each step's size is known.
    In the engine `rt`'s mode: transformers' `generate` and the loop over transformers models
    (eager), or greedy decoding and the loop over draftnas's decoder with static caches (static
    modes). Plain decoding: time per token between a 2- and a 14-token run (prefill cancels), less
    the decode step. Loop, per drafted token: the loop's own drafting time
    (`SpeculativeOutput.draft_s`) between a 4- and a 16-token run at gamma 1 and 3 (the drafter's
    prefill cancels), per drafted token, less the decode step. Measured directly, not fitted: fitted from
    whole runs with the other terms it swung between calibrations far more than the direct reading varies
    between repeats (docs/hosts/amd-epyc-zen2-2core.md). Per verify step: each run's time
    less its forward steps and that drafting work, fitted by least squares as constant (prefill) +
    per step. -> the three readings, negative where the runs were faster than their timed steps (the
    calibration counts those as 0).
    """

    torch = rt.torch
    shallow = target.with_shape(num_hidden_layers=1)
    log.info("timing the work outside the forward: short real decodes of %s's first layer (random weights)",
             target.name)
    # rt.build seeds its random weights: the drafter is the target's copy, so every draft is accepted
    model, drafter = rt.build(shallow), rt.build(shallow)
    prompt = rt.randint(target.vocab_size, (context_tokens,)).tolist()
    ids = torch.tensor([prompt], device=rt.device)
    if rt.options.mode in STATIC_MODES:
        slots = context_tokens + 32
        capture = rt.options.mode == "cuda-graph"
        model, drafter = (StaticEngine(m, slots, capture=capture) for m in (model, drafter))

    def generate_s(n: int) -> float:
        started = time.perf_counter()
        if isinstance(model, StaticEngine):
            greedy_decode(model, prompt, max_new_tokens=n)
        else:
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0, eos_token_id=None)
        return time.perf_counter() - started

    def forward_ms(n: int) -> float:
        return step_ms.get(n, step_ms[min(step_ms, key=lambda k: abs(k - n))])

    runs = []
    with torch.inference_mode():
        generate_s(2)
        # the fastest of 3 runs each: on a shared host one slow run gave 18 ms of "overhead" per token
        short, long = min(generate_s(2) for _ in range(3)), min(generate_s(14) for _ in range(3))
        generate = (long - short) * 1e3 / 12 - step_ms[1]
        for gamma in (1, 3):  # warm-up: every step size once (the static decoder picks its kernels then)
            speculative_generate(model, drafter, prompt, gamma=gamma, max_new_tokens=16)
        for gamma in (1, 3):
            pair = [min((speculative_generate(model, drafter, prompt, gamma=gamma, max_new_tokens=n)
                         for _ in range(3)), key=lambda o: o.elapsed_s) for n in (4, 16)]  # the fastest of 3
            runs.append(pair)
    drafted = sum(sum(long.drafted) - sum(short.drafted) for short, long in runs)
    drafting_ms = sum((long.draft_s - short.draft_s) * 1e3 for short, long in runs)
    per_draft = drafting_ms / drafted - step_ms[1] if drafted > 0 else 0.0
    rows, residuals = [], []
    for out in (o for pair in runs for o in pair):
        forward = sum(d * (step_ms[1] + per_draft) + forward_ms(d + 1) for d in out.drafted)
        rows.append([1.0, float(out.steps)])
        residuals.append(out.elapsed_s * 1e3 - forward)
    _, per_step = np.linalg.lstsq(np.array(rows), np.array(residuals), rcond=None)[0]
    return generate, per_draft, float(per_step)


def stored_or_calibrated(options: ProfileOptions, target: Architecture, request: dict[str, Any],
                         calibrate: Callable[[], HostCalibration], given: Path | None = None,
                         progress: Progress | None = None) -> tuple[HostCalibration, str]:
    """This host's calibration for `request` (what is timed, as a dict): the stored one when it still
    holds here (`calibration_store`), else `calibrate()`'s, then stored. -> (calibration, one line
    saying where it came from).

    Stored: the target's decode and largest verify are re-timed (seconds) and the stored figures
    stand when both read within the drift tolerance. `given` (--calibration FILE): that file, which
    must belong to this host, CPU, threads and torch, and to `target`; it is used even when it drifted,
    and the line says by how much."""
    host = host_key()
    keep = store_path(host, request)
    path = given or keep
    stored = None
    if given is not None:
        stored = read_calibration(given)
        check_here(stored, given)
        if stored.calibration.target != target.name:
            raise option_error("calibration", f"{given} calibrates {stored.calibration.target}, not "
                                              f"{target.name}")
    elif path.is_file():
        stored = read_calibration(path, flag="the stored calibration")
    redo = ""
    if stored is not None:
        c = stored.calibration
        log.info("re-timing the target's decode and verify against the stored calibration %s", path)
        plan = CalibrationPlan((max(c.target_ms),), prefix_layers=(), overheads=False,
                               context_tokens=c.context_tokens)
        retimed = calibrate_host(dataclasses.replace(options, dtype=c.dtype), target, plan, progress)
        changes = drift(c, retimed.target_ms)
        said = ", ".join(f"{k} {v:+.1%}" for k, v in changes.items())
        if given is not None or not drifted(changes):
            return c, f"calibration reused from {path} (re-timed here: {said})"
        redo = f"; the stored calibration drifted ({said}), so it was timed again"
    calibration = calibrate()
    write_calibration(keep, StoredCalibration(host=host, request=request, calibration=calibration))
    return calibration, f"calibration stored in {keep}{redo}"
