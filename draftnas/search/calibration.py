"""A search's latency model calibrated on this machine: the dtype chosen by timing, the target and the
drafters' bases timed here (or a stored calibration of this host reused), the profile corrected by them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from draftnas.core.engine_kinds import engine_kind
from draftnas.core.machine import cpu_has_native_bf16
from draftnas.core.registry import Architecture
from draftnas.latency.batched import stored_or_timed_batches, timed_batches
from draftnas.latency.calibrate import CalibrationPlan, calibrate_host, choose_dtype, stored_or_calibrated
from draftnas.latency.corrected import CalibratedModel
from draftnas.latency.model import LatencyModel
from draftnas.latency.records import HostCalibration, LatencyProfile, ProfileOptions
from draftnas.models.kernel_choices import kept_choices
from draftnas.models.matmul import faster_int8_activations
from draftnas.models.records import quantized, weights_problem
from draftnas.search.records import LatencyPredictor
from draftnas.search.space import SearchSpace

log = logging.getLogger(__name__)


def calibrated_predictor(profile: LatencyProfile, target: Architecture, space: SearchSpace,
                         progress: Callable[[int, int], None] | None = None, engine: str = "static",
                         dtype: str | None = None, stacks: Sequence[Architecture] = (),
                         quant_stacks: Sequence[Architecture] = (), given: Path | None = None
                         ) -> tuple[LatencyPredictor, str, str]:
    """The profile's model corrected by timing `target`'s decode, its verify at every gamma + 1
    the space considers, drafter-sized prefixes of it and of each of `stacks` (a base the drafters
    are cut from, a reference drafter), the time the space's reduced heads save and the work outside
    the forward on this machine, in the loop `engine` that bench then runs (`calibrate_host`, about 1
    min for SmolLM2-135M on 2 cores in the static engine). `dtype` None: the faster of fp32 and (on a
    CPU with native bf16) bf16 for the target's decode and verify, timed first (`choose_dtype`).
    Returns the model, the one-line summary of what was measured against what the profile said, and
    the dtype.

    On the profile's device: a CPU here, or the present GPU for a CUDA profile, where the static
    engine's steps are timed as CUDA graphs (what bench replays there) and the dtype is the faster
    of bf16 and fp16. `quant_stacks`: bases timed in each of the space's quantized weight formats too,
    where they run (`quant_formats`; none elsewhere), pricing those drafters
    (`CalibratedModel.for_weights`). The calibration is kept
    per host and reused after a drift check (`latency.calibrate.stored_or_calibrated`; `given`:
    --calibration FILE), and every kernel choice made while timing is kept for this host too
    (`models.kernel_choices`)."""
    g = space.gamma
    counts = [n + 1 for n in range(max(1, g.min), g.max + 1)]
    mode = engine_kind(engine).graph_mode(profile.device) or "eager"
    options = ProfileOptions(device=profile.device, dtype=dtype or profile.dtype, mode=mode, repeats=5,
                             warmup=1)
    # the smallest and largest reduced heads: a head's saving is linear in its rows between them
    # (`CalibratedModel` interpolates), and each size timed is one more build of every stack
    reduced = sorted(v for v in space.vocab_sizes if v > 0)
    heads = sorted({reduced[0], reduced[-1]}) if reduced else []
    w = space.workload
    formats = quant_formats(space, profile.device, engine)
    quant_stacks = quant_stacks if formats else ()
    plan = CalibrationPlan(tuple(counts), context_tokens=w.context_tokens, prompt_tokens=w.prompt_tokens,
                           head_rows=tuple(heads), stacks=tuple(stacks), quant_stacks=tuple(quant_stacks),
                           quant_formats=tuple(formats),
                           target_heads=not stacks or _shape(stacks[0]) == _shape(target))

    def calibrate() -> HostCalibration:
        chosen = options
        dtype_ms: dict[str, dict[int, float]] = {}
        if dtype is None:  # only dtypes every format offered multiplies in (int4 on CUDA: bf16)
            candidates = tuple(d for d in dtype_candidates(profile.device)
                               if not any(weights_problem(f, profile.device, d) for f in formats))
            if len(candidates) > 1:
                log.info("timing the target in %s to choose the dtype", " and ".join(candidates))
                best, dtype_ms = choose_dtype(options, target, max(counts), candidates,
                                              context_tokens=w.context_tokens)
                chosen = replace(options, dtype=best)
            else:
                chosen = replace(options, dtype=candidates[0])
        log.info("calibrating %s in %s on this machine", target.name, chosen.resolved_dtype())
        activations = int8_activations(chosen.resolved_dtype(), quant_stacks)
        calibration = calibrate_host(chosen, target, replace(plan, quant_dtype=activations), progress)
        return replace(calibration, dtype_ms=dtype_ms)

    request = {"target": target.to_dict(), "format": 4, "dtype": dtype or "auto", "mode": mode,
               "device": profile.device,
               "counts": counts, "context": w.context_tokens, "prompt_tokens": w.prompt_tokens,
               "heads": heads, "stacks": [a.to_dict() for a in stacks],
               "quant_stacks": [a.to_dict() for a in quant_stacks],
               "quant_formats": formats if quant_stacks else []}
    with kept_choices():
        calibration, where = stored_or_calibrated(options, target, request, calibrate, given=given,
                                                  progress=progress)
        batches = timed_batches(w.batch_sizes)
        if batches:
            stacks_b = [(a, "dense") for a in stacks] + [(a, f) for f in formats for a in quant_stacks]
            calibration, said = stored_or_timed_batches(
                replace(options, dtype=calibration.dtype), target, calibration, request, batches, max(counts),
                stacks_b, calibration.quant_dtype or None, progress)
            where += f"; {said}"
    model = CalibratedModel(LatencyModel.from_profile(profile), calibration, target)
    return model, f"{model.summary()}; {where}", calibration.dtype


def quant_formats(space: SearchSpace, device: str, engine: str) -> list[str]:
    """The space's quantized weight formats the calibration times the base in: those it offers, where they
    can run (draftnas's static engine: on the CPU every format, on CUDA int4 in bf16, `weights_problem`;
    elsewhere such trials are pruned as unpriced)."""
    kind = engine_kind(engine)
    if not kind.quantized_kernels or device not in kind.devices:
        return []
    return [w for w in space.weights if quantized(w) and weights_problem(w, device, "bf16") is None]


def dtype_candidates(device: str) -> tuple[str, ...]:
    """The dtypes a calibrating search times on `device`: bf16 and fp16 on a GPU; fp32 and, on a CPU
    with native bf16 instructions, bf16."""
    if device == "cuda":
        return ("bf16", "fp16")
    return ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",)


def _shape(arch: Architecture) -> Architecture:
    return arch.with_shape(name="")


def int8_activations(target_dtype: str, quant_stacks: Sequence[Architecture]) -> str | None:
    """The activation dtype quantized drafters run in beside a `target_dtype` target on this CPU: the
    target's, unless the target runs in fp32 and an int8 product of the base's MLP shape times faster
    with bf16 activations here (`faster_int8_activations`; torch's int4 kernel, too, is scalar in fp32)."""
    if not quant_stacks or target_dtype != "fp32":
        return None
    base = quant_stacks[0]
    best, times = faster_int8_activations(base.hidden_size, base.intermediate_size)
    log.info("int8 product %dx%d: %s", base.intermediate_size, base.hidden_size,
             ", ".join(f"{d} activations {ms:.2f} ms" for d, ms in times.items()))
    return best
