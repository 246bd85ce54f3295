"""llama.cpp as a latency source: GGUF files timed by the stock `llama-bench`, and the model the search
prices llama.cpp drafters with.

One speculative step in llama.cpp's draft-simple loop (common/speculative.cpp of the pinned build):
the drafter reads the gamma + 1 tokens the target just verified (one batch, to keep its cache in
step), drafts gamma tokens one decode each, and the target verifies gamma + 1 tokens in one batch.
So a step costs gamma x drafter decode + drafter batch(gamma + 1) + target batch(gamma + 1), which
docs/engines/llama-cpp.md checks against steps measured through llama-server.

The calibration times the target file, each reference drafter's file, and random-weight GGUFs of the
drafters' base at three depths per quant type (`gguf_file.random_tensors`, written in that type);
a drafter of L layers is priced from the line through its quant type's depths.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from draftnas.core.engine_kinds import LLAMA_CPP
from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.machine import cpu_identity
from draftnas.core.records import write_json_file
from draftnas.core.registry import Architecture
from draftnas.latency.records import EngineCalibration, EngineTiming
from draftnas.models.gguf_file import read_info, write_gguf
from draftnas.models.gguf_tensors import random_tensors
from draftnas.models.llama_cpp import LlamaCpp, LlamaCppError, host_flags
from draftnas.models.sources import state_dir

log = logging.getLogger(__name__)
DRIFT_TOLERANCE = 0.10


def time_gguf(
    llama: LlamaCpp,
    path: Path,
    counts: Sequence[int],
    context: int,
    threads: int,
    repeats: int = 3,
    gen: int = 16,
) -> EngineTiming:
    """`llama-bench` on `path` after `context` tokens: decode (tg `gen`) and one batch per count."""
    batches = [n for n in counts if n > 1]
    args = [
        "-m",
        str(path),
        "-n",
        str(gen),
        "-d",
        str(context),
        "-r",
        str(repeats),
        "-t",
        str(threads),
        "-o",
        "json",
        *llama.flags,
    ]
    if batches:
        args[2:2] = ["-p", ",".join(map(str, batches))]
    else:
        args[2:2] = ["-p", "0"]
    rows = json.loads(llama.run("llama-bench", args).stdout)
    decode, batch = 0.0, {}
    for r in rows:
        ms = statistics.median(float(ns) / 1e6 for ns in r["samples_ns"])
        if r["n_gen"]:
            decode = ms / r["n_gen"]
        elif r["n_prompt"]:
            batch[int(r["n_prompt"])] = ms
    if decode <= 0:
        raise LlamaCppError(f"llama-bench printed no decode timing for {path}")
    batch[1] = decode
    return EngineTiming(
        file=str(path),
        decode_ms=round(decode, 3),
        batch_ms={k: round(v, 3) for k, v in sorted(batch.items())},
        repeats=repeats,
    )


def probe_flags(llama: LlamaCpp, model: Path, threads: int) -> LlamaCpp:
    """`llama` with the flags this host needs (`models.llama_cpp.host_flags`), probed with a 2-token
    batch of `model` (its file checked first: a damaged file is named as such, not the build)."""
    read_info(model)

    def runs(flags: Sequence[str]) -> bool:
        try:
            llama.run(
                "llama-bench",
                [
                    "-m",
                    str(model),
                    "-p",
                    "2",
                    "-n",
                    "0",
                    "-r",
                    "1",
                    "-t",
                    str(threads),
                    "--no-warmup",
                    "-o",
                    "json",
                    *flags,
                ],
                timeout_s=600,
            )
        except LlamaCppError as e:
            log.info("llama.cpp probe with %s failed: %s", list(flags) or "defaults", e)
            return False
        return True

    flags, why = host_flags(llama, runs)
    log.info("llama.cpp flags here: %s (%s)", " ".join(flags) or "none", why)
    return replace(llama, flags=flags, flags_why=why)


def drafter_depths(layers: int) -> tuple[int, ...]:
    """The depths of the base timed per quant type: 2, half and all layers."""
    return tuple(sorted({min(2, layers), max(1, layers // 2), layers}))


def calibrate_llama_cpp(
    llama: LlamaCpp,
    target_file: Path,
    base: Architecture,
    quants: Sequence[str],
    context: int,
    max_batch: int,
    references: Mapping[str, Path],
    threads: int,
    progress: Callable[[int, int], None] | None = None,
) -> EngineCalibration:
    """Time the target, the references and random drafters of `base` per quant type in `llama` (each a
    random-weight GGUF with the target's tokenizer, written under the state folder and removed once
    timed)."""
    started = time.perf_counter()
    depths = drafter_depths(base.num_hidden_layers)
    total = 1 + len(references) + len(quants) * len(depths)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    counts = range(1, max_batch + 1)
    log.info(
        "timing %s in llama.cpp (decode, batches of 2..%d, context %d)", target_file.name, max_batch, context
    )
    target = time_gguf(llama, target_file, counts, context, threads)
    tick()
    refs = {}
    for name, path in references.items():
        refs[name] = time_gguf(llama, path, counts, context, threads)
        tick()
    timed: dict[str, dict[int, EngineTiming]] = {}
    workdir = state_dir() / "llama-cpp-random"
    for quant in quants:
        timed[quant] = {}
        for layers in depths:
            arch = base.with_shape(num_hidden_layers=layers)
            random = workdir / f"random-{base.name}-{layers}L-{quant}.gguf"
            path = write_gguf(random, arch, random_tensors(arch), quant, target_file, f"random {arch.name}")
            timed[quant][layers] = time_gguf(llama, path, counts, context, threads)
            path.unlink()
            tick()
    return EngineCalibration(
        engine=LLAMA_CPP,
        version=llama.version,
        cpu=cpu_identity(),
        threads=threads,
        context_tokens=context,
        target=target,
        base=base.name,
        quants=timed,
        references=refs,
        flags=llama.flags,
        flags_why=llama.flags_why,
        wall_s=round(time.perf_counter() - started, 1),
    )


def store_path(request: dict[str, object], engine: str = "llama-cpp") -> Path:
    """Where an external engine's calibration for `request` (host, build, files, what was timed) is kept:
    `<state>/calibrations/<engine>-<hash of the request>.json`."""
    text = json.dumps(request, sort_keys=True, default=str)
    return state_dir() / "calibrations" / f"{engine}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def stored_or_calibrated(
    path: Path, calibrate: Callable[[], EngineCalibration], retime: Callable[[], EngineTiming]
) -> tuple[EngineCalibration, str]:
    """The calibration stored at `path` when the target's decode, re-timed now, reads within 10% of
    it; else a new one (stored there). Returns it and where it came from."""
    if path.is_file():
        try:
            stored = EngineCalibration.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            stored = None
        if stored is not None:
            now = retime()
            drift = now.decode_ms / stored.target.decode_ms - 1
            if abs(drift) <= DRIFT_TOLERANCE:
                return stored, f"stored llama.cpp calibration {path} reused (target decode now {drift:+.1%})"
            log.info("stored llama.cpp calibration is %+.1f%% off; timing again", 100 * drift)
    calibration = calibrate()
    write_json_file(path, calibration.to_dict())
    return calibration, f"llama.cpp calibration stored in {path}"


def _line(points: Mapping[int, float]) -> Callable[[int], float]:
    xs = np.array(sorted(points), dtype=float)
    ys = np.array([points[int(x)] for x in xs], dtype=float)
    if len(xs) == 1:
        return lambda layers: float(ys[0])
    slope, intercept = np.polyfit(xs, ys, 1)
    return lambda layers: float(intercept + slope * layers)


def _same_shape(a: Architecture, b: Architecture) -> bool:
    return a.with_shape(name="") == b.with_shape(name="")


class EngineModel:
    """Prices shapes in llama.cpp from an `EngineCalibration`; `predict_ms` has `LatencyModel`'s
    signature. The target's shape reads the target file's timings; a reference's name reads its
    file's; any other shape is a drafter of the base's width priced, in the quant type chosen with
    `for_weights`, from the line through the depths timed."""

    max_batch_size = 1  # one sequence: no batch sweep (`search.loop`)

    def __init__(
        self,
        calibration: EngineCalibration,
        target: Architecture,
        base: Architecture,
        quant: str | None = None,
    ) -> None:
        self.calibration, self.target, self.base, self.quant = calibration, target, base, quant

    def for_weights(self, weights: str) -> EngineModel:
        if weights not in self.calibration.quants:
            raise InfeasibleCandidateError(
                f"{weights} drafters were not timed in llama.cpp here "
                f"(timed: {', '.join(self.calibration.quants)})"
            )
        return EngineModel(self.calibration, self.target, self.base, weights)

    def _timing_points(self, arch: Architecture) -> EngineTiming | dict[int, EngineTiming]:
        if _same_shape(arch, self.target):
            return self.calibration.target
        if arch.name in self.calibration.references:
            return self.calibration.references[arch.name]
        widths = (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
        )
        if any(getattr(arch, w) != getattr(self.base, w) for w in widths):
            raise InfeasibleCandidateError(
                f"llama.cpp was timed here with drafters of {self.base.name}'s full "
                f"width and vocabulary only; {arch.name} differs"
            )
        if self.quant is None:
            raise InfeasibleCandidateError(
                f"{arch.name}: a llama.cpp drafter needs a quant type ({', '.join(self.calibration.quants)})"
            )
        return self.calibration.quants[self.quant]

    def predict_ms(
        self,
        arch: Architecture,
        *,
        batch_size: int = 1,
        new_tokens: int = 1,
        context_tokens: int = 128,
        head_vocab_size: int | None = None,
    ) -> float:
        if batch_size != 1:
            raise InfeasibleCandidateError("the llama.cpp calibration times one sequence (batch size 1)")
        if head_vocab_size and head_vocab_size < arch.vocab_size:
            raise InfeasibleCandidateError(
                "llama.cpp loads only drafters with the target's full vocabulary; "
                f"a {head_vocab_size}-row draft head cannot load"
            )
        points = self._timing_points(arch)
        if isinstance(points, EngineTiming):
            return _batch(points, new_tokens)
        return _line({k: _batch(t, new_tokens) for k, t in points.items()})(arch.num_hidden_layers)

    def drafter_batch_ms(self, arch: Architecture, tokens: int, batch_size: int = 1) -> float:
        """The drafter reading the `tokens` the target verified (once per step; one sequence)."""
        return (self.predict_ms(arch, batch_size=batch_size, new_tokens=tokens) if tokens > 1
                else self.predict_ms(arch, batch_size=batch_size))

    def summary(self) -> str:
        c = self.calibration
        t = c.target
        ratios = ", ".join(
            f"verify({k}) {ms:.1f} ms = {ms / t.decode_ms:.2f}x"
            for k, ms in t.batch_ms.items()
            if k in (2, 4, max(t.batch_ms))
        )
        quants = "; ".join(
            f"{q} drafter decode " + ", ".join(f"{n}L {x.decode_ms:.1f}" for n, x in d.items())
            for q, d in c.quants.items()
        )
        refs = "; ".join(f"{n} decode {x.decode_ms:.1f} ms" for n, x in c.references.items())
        flags = f"; flags {' '.join(c.flags)} ({c.flags_why})" if c.flags else ""
        return (
            f"llama.cpp ({c.version}) timed here, {c.threads} threads, context {c.context_tokens}: target "
            f"decode {t.decode_ms:.1f} ms, {ratios}; {refs}; {quants} ms{flags}"
        )


def _batch(timing: EngineTiming, tokens: int) -> float:
    if tokens <= 1:
        return timing.decode_ms
    if tokens in timing.batch_ms:
        return timing.batch_ms[tokens]
    known = sorted(k for k in timing.batch_ms if k > 1)
    if len(known) < 2:
        raise InfeasibleCandidateError(f"no llama.cpp timing of a {tokens}-token batch")
    a, b = known[-2], known[-1]
    slope = (timing.batch_ms[b] - timing.batch_ms[a]) / (b - a)
    return timing.batch_ms[b] + slope * (tokens - b)
