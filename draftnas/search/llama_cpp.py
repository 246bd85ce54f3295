"""A search for llama.cpp (`search --engine llama.cpp`): its constraints checked against the space, its
latency model calibrated on this host with the stock tools, and the verdict when no drafter pays.

llama.cpp loads a drafter only with the target's vocabulary and uniform layers, as a GGUF file, so
the space may offer only full-vocabulary drafters of the base's width, in ggml types draftnas
writes (`models.records.GGUF_WEIGHTS`); each is priced from random-weight GGUFs of its type timed
here (`latency.llama_cpp`), the reference from its own file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftnas.core.engine_kinds import LLAMA_CPP
from draftnas.core.machine import cpu_count, cpu_identity
from draftnas.core.options import option_error
from draftnas.core.records import Record
from draftnas.core.registry import Architecture
from draftnas.core.throughput import break_even_acceptance
from draftnas.latency.llama_cpp import (
    EngineModel,
    calibrate_llama_cpp,
    probe_flags,
    store_path,
    stored_or_calibrated,
    time_gguf,
)
from draftnas.latency.records import EngineCalibration
from draftnas.models.gguf_file import engine_target, gguf_of
from draftnas.models.llama_cpp import find_llama_cpp
from draftnas.models.records import GGUF_WEIGHTS
from draftnas.search.space import SearchSpace

log = logging.getLogger(__name__)
ENGINE = LLAMA_CPP


def space_problems(space: SearchSpace) -> list[str]:
    """Why `space` offers drafters llama.cpp cannot load or draftnas cannot price there."""
    out = []
    if any(v for v in space.vocab_sizes):
        out.append(
            f"the space offers reduced draft heads ({', '.join(str(v) for v in space.vocab_sizes if v)} "
            "rows); llama.cpp loads only drafters with the target's full vocabulary"
        )
    other = [w for w in space.weights if w not in GGUF_WEIGHTS]
    if other:
        out.append(
            f"weights {', '.join(other)} are not GGUF types draftnas writes "
            f"(allowed: {', '.join(GGUF_WEIGHTS)})"
        )
    w = space.width
    if any(r != 1.0 for r in (*w.kv_head_ratios, *w.query_head_ratios, *w.mlp_ratios, *w.hidden_ratios)):
        out.append(
            "the space prunes widths; the llama.cpp calibration times drafters of the base's full width"
        )
    if space.workload.batch_sizes != (1,):
        out.append("llama.cpp is benched with one sequence (workload batch size 1)")
    return out


def threads_here(threads: int | None) -> int:
    return threads or cpu_count()


def llama_cpp_model(
    target: str,
    target_arch: Architecture,
    base_arch: Architecture,
    space: SearchSpace,
    references: Sequence[str],
    build: str | None,
    threads: int | None,
    progress: Callable[[int, int], None] | None = None,
    target_gguf: str | None = None,
) -> tuple[EngineModel, str]:
    """The llama.cpp latency model of this host for `space` (stored per host and reused after a drift
    check on the target's decode), and the line saying what was measured."""
    problems = space_problems(space)
    if problems:
        raise option_error("engine", f"llama.cpp with search space {space.name!r}: " + "; ".join(problems))
    target_file = engine_target(target, target_gguf)
    refs = {r: gguf_of(r) for r in references}
    n = threads_here(threads)
    llama = probe_flags(find_llama_cpp(build), target_file, n)
    context, max_batch = space.workload.context_tokens, space.gamma.max + 1
    request = {
        "engine": ENGINE,
        "version": llama.version,
        "bin": str(llama.bin_dir),
        "cpu": cpu_identity().label(),
        "threads": n,
        "target": _file_key(target_file),
        "refs": {k: _file_key(v) for k, v in refs.items()},
        "base": base_arch.to_dict(),
        "quants": list(space.weights),
        "context": context,
        "max_batch": max_batch,
    }

    def calibrate() -> EngineCalibration:
        return calibrate_llama_cpp(llama, target_file, base_arch, space.weights, context, max_batch, refs, n,
                                   progress)

    calibration, where = stored_or_calibrated(
        store_path(request),
        calibrate,
        lambda: time_gguf(llama, target_file, (1,), context, n, repeats=2),
    )
    model = EngineModel(calibration, target_arch, base_arch)
    return model, f"{model.summary()}; {where}"


def _file_key(path: Path) -> list[object]:
    stat = path.stat()
    return [str(path), stat.st_size, int(stat.st_mtime)]


@dataclass(frozen=True)
class Verdict(Record):
    """Whether any drafter can pay in this engine here, from measured step costs.

    `verify_ratio[k]`: the target's k-token batch over its decode. `break_even[g]`: the acceptance
    rate at which the fastest drafter the space holds (its shallowest depth, fastest type) breaks
    even at gamma g (None: not even at acceptance 1). `reference_speedup`: the reference's
    predicted (search) or measured (bench) speedup."""

    engine: str
    decode_ms: float
    verify_ratio: dict[int, float]
    fastest: str
    fastest_draft_ms: float
    break_even: dict[int, float | None]
    reference: str = ""
    reference_speedup: float | None = None
    pays: bool = False
    source: str = "predicted"  # "predicted" (the search) or "measured" (a bench of the same engine)
    best: str = ""  # the best drafter's name and speedup, as `source` says
    # measured: the best drafter's median prompt is faster than the target alone but its interval reaches
    # below 1 (some prompts slower): it pays on the typical prompt, not on every one
    median_pays: bool = False

    def lines(self) -> list[str]:
        ratios = ", ".join(f"{k}: {r:.2f}x" for k, r in self.verify_ratio.items())
        even = ", ".join(f"γ={g}: {'never' if a is None else f'{a:.2f}'}" for g, a in self.break_even.items())
        said = ("a drafter pays" if self.pays else
                "a drafter pays on the median prompt, not on every prompt (its interval reaches below 1)"
                if self.median_pays else "no drafter pays")
        head = f"{said} here in {self.engine} ({self.source}"
        head += f"; best: {self.best})" if self.best else ")"
        out = [
            head,
            f"  target decode {self.decode_ms:.1f} ms; batch of k tokens over a decode: {ratios}",
            f"  break-even acceptance of the fastest drafter the space holds ({self.fastest}, "
            f"{self.fastest_draft_ms:.1f} ms a draft): {even}",
        ]
        if self.reference_speedup is not None:
            out.append(f"  {self.reference}: {self.reference_speedup:.3f}x the target alone ({self.source})")
        return out


def verdict(
    model: EngineModel,
    space: SearchSpace,
    reference: str = "",
    reference_speedup: float | None = None,
    best_speedup: float | None = None,
    best: str = "",
) -> Verdict:
    """The verdict from `model`'s measured steps for the fastest drafter `space` holds."""
    t = model.calibration.target
    depth = min(space.depth.values())
    arch = model.base.with_shape(name=f"{model.base.name}:L{depth}", num_hidden_layers=depth)
    fastest_quant = min(space.weights, key=lambda q: model.for_weights(q).predict_ms(arch))
    priced = model.for_weights(fastest_quant)
    draft = priced.predict_ms(arch)
    gammas = range(max(1, space.gamma.min), space.gamma.max + 1)

    def step_ms(g: int) -> float:  # the verify of g + 1 and the drafter's catch-up over them
        return model.predict_ms(model.target, new_tokens=g + 1) + priced.drafter_batch_ms(arch, g + 1)

    even = {g: _rounded(break_even_acceptance(g, draft, t.decode_ms, step_ms(g))) for g in gammas}
    pays = max(best_speedup or 0.0, reference_speedup or 0.0) > 1.0
    return Verdict(
        engine=ENGINE,
        decode_ms=t.decode_ms,
        verify_ratio={k: round(v / t.decode_ms, 3) for k, v in t.batch_ms.items() if k > 1},
        fastest=f"{depth} layers, {fastest_quant}",
        fastest_draft_ms=round(draft, 3),
        best=f"{best} {best_speedup:.3f}x" if best and best_speedup is not None else "",
        break_even=even,
        reference=reference,
        reference_speedup=reference_speedup,
        pays=pays,
    )


@dataclass(frozen=True)
class PlainRoute(Record):
    """The target decoded alone in llama.cpp here (its GGUF file), beside the route a search picked: the
    faster one is what a user should run (lookup drafting priced per workload by `draftnas lookup`)."""

    engine: str
    file: str
    tokens_per_s: float
    threads: int
    pick: str
    pick_tokens_per_s: float

    @property
    def faster(self) -> bool:
        return self.tokens_per_s > self.pick_tokens_per_s

    def line(self) -> str:
        name = Path(self.file).name
        if not self.faster:
            return (f"{self.pick} ({self.pick_tokens_per_s:.1f} tokens/s predicted) is faster than "
                    f"{self.engine} decoding {name} alone here ({self.tokens_per_s:.1f} tokens/s, measured, "
                    f"{self.threads} threads)")
        return (f"but {self.engine} decodes {name} alone at {self.tokens_per_s:.1f} tokens/s here (measured, "
                f"{self.threads} threads), {self.tokens_per_s / self.pick_tokens_per_s:.2f}x this pick's "
                f"{self.pick_tokens_per_s:.1f}: run the target in {self.engine}. Whether lookup drafting "
                f"pays there depends on the requests: `draftnas lookup -p WORKLOAD` prices it for yours and "
                f"`draftnas bench --engine llama.cpp` measures it (on the one host where workloads were "
                f"benched, an AMD EPYC Zen 4, only edits paid)")


def no_build_line(build: str | None = None) -> str:
    """Where no llama.cpp build is found, what a user misses: how to get one, and what was measured with
    one ('' where a build is here)."""
    from draftnas.core.errors import DraftnasError

    try:
        find_llama_cpp(build)
        return ""
    except DraftnasError:
        return ("no llama.cpp build here to set beside this pick: `draftnas engines --build` makes one "
                "(6-8 minutes on 2 cores), and the search then prints llama.cpp's plain decode of the "
                "target. With the embedded Qwen pair, llama.cpp alone decoded faster than draftnas's loop "
                "ran its pick on the AMD EPYC Zen 3 and Zen 4 hosts measured, not on the Intel Xeon one "
                "(README's per-host table)")


def plain_route(target: str, pick: str, pick_tokens_per_s: float, target_gguf: str | None = None,
                build: str | None = None, threads: int | None = None) -> PlainRoute | None:
    """The target's plain llama.cpp decode here (a few seconds of `llama-bench`), where a llama.cpp build
    and the target's GGUF exist; None otherwise."""
    from draftnas.core.errors import DraftnasError

    try:
        target_file = engine_target(target, target_gguf)
        n = threads_here(threads)
        llama = probe_flags(find_llama_cpp(build), target_file, n)
        timing = time_gguf(llama, target_file, (1,), 64, n, repeats=2, gen=32)
    except DraftnasError as e:
        log.info("no plain llama.cpp decode of %s to compare with: %s", target, e)
        return None
    return PlainRoute(engine=ENGINE, file=str(target_file), tokens_per_s=round(1000 / timing.decode_ms, 2),
                      threads=n, pick=pick, pick_tokens_per_s=round(pick_tokens_per_s, 2))


def _rounded(alpha: float | None) -> float | None:
    return None if alpha is None else round(alpha, 3)
