"""`draftnas bench --batch-size`: where speculative decoding stops paying as the batch grows.

At batch B the target's decode reads its weights once for B sequences, so a step's cost grows
slowly with B until the products stop being bound by memory traffic; a verify of B x (gamma + 1)
tokens reaches that point gamma + 1 times sooner. Past it, the drafts cost more than they save.
For each B this decodes B prompts together (the prompt list cycled to fill the batch) with the
target alone (`models.batched.batched_greedy`) and with each drafter's batched loop
(`batched_speculative_generate`), in the static engine, greedy, after one warm-up run each (which
also meets, and on CUDA captures, every step width). The runs at one B are interleaved, the order
rotating with B. Beside each measured speedup stands the latency profile's prediction at that B,
priced with the tokens per step measured there, and each drafter's crossover: the first B whose
speedup is below 1, measured and predicted.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from draftnas.bench.arms import Drafter
from draftnas.bench.batch_records import BatchedBenchResult, BatchPoint
from draftnas.bench.request_records import BenchOptions
from draftnas.core.machine import cpu_identity, load_average
from draftnas.core.options import option_error
from draftnas.core.prompts import Prompt
from draftnas.core.provenance import package_versions
from draftnas.core.records import Progress
from draftnas.core.registry import Architecture
from draftnas.core.throughput import predict_throughput, with_prefill
from draftnas.latency.calibration_store import check_here, read_calibration
from draftnas.latency.corrected import CalibratedModel
from draftnas.latency.files import SHIPPED_PROFILES, default_profile, load_profile
from draftnas.latency.hardware import CPU_ROOFLINE, SPEC_SHEETS, spec_sheet_profile
from draftnas.latency.host_profile import host_cpu_profile
from draftnas.latency.model import LatencyModel
from draftnas.latency.records import HostCalibration
from draftnas.models.batched import BatchedOutput, BatchedStatic, batched_greedy, batched_speculative_generate
from draftnas.models.decoder import StaticDecoder
from draftnas.models.records import dtype_name
from draftnas.models.sources import LoadedModel
from draftnas.search.records import LatencyPredictor

#: Batch sizes the predicted crossover is looked for at (the profile prices any B; the bench
#: measures the ones asked for).
PREDICTED_BATCHES = tuple(2 ** i for i in range(11))


def latency_model(spec: str | None, device: str, dtype: str,
                  target: Architecture | None = None) -> tuple[str, LatencyPredictor | None]:
    """What the predictions come from -> (its label, its model); ("", None) on a GPU no shipped spec sheet
    describes when none was named. A calibration a search stored on this host (`target`'s) prices with its
    timings, batched ones included; one stored on another host or for another target is refused in a line."""
    if spec is not None and target is not None and is_calibration(Path(spec).expanduser()):
        return calibrated_model(Path(spec).expanduser(), target)
    if spec is None and device == "cuda":
        name = torch.cuda.get_device_name().lower()
        sheet = next((k for k in SPEC_SHEETS if k.split("-")[0] in name), None)
        if sheet is None:
            return "", None
        return f"{sheet} (spec sheet, {dtype})", LatencyModel.from_profile(spec_sheet_profile(sheet, dtype))
    if spec is not None and not spec.strip():
        raise option_error("profile", "is empty: name a profile JSON, a shipped profile or a stored "
                                      "calibration, or leave it out for this host's")
    name = spec or host_cpu_profile("static", dtype)
    path = Path(name).expanduser()
    if path.suffix == ".json" or path.is_file():
        profile = load_profile(path)
    elif name.lower() in (*SHIPPED_PROFILES, CPU_ROOFLINE):
        profile = default_profile(name, dtype)
    else:
        raise option_error("profile", f"{name!r} is neither a JSON file nor a shipped profile "
                                      f"({', '.join(SHIPPED_PROFILES)}, {CPU_ROOFLINE})")
    model = LatencyModel.from_profile(profile)
    return f"{name} ({profile.device_name}, {profile.kind}, {profile.dtype})", model


def is_calibration(path: Path) -> bool:
    """Whether `path` holds a calibration a search stored (not a latency profile)."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "calibration" in data and "host" in data


def calibrated_model(path: Path, target: Architecture) -> tuple[str, LatencyPredictor]:
    """A stored calibration of this host for `target` as a latency model -> (its label, the model)."""
    stored = read_calibration(path, flag="--profile")
    check_here(stored, path, flag="--profile")
    c = stored.calibration
    if c.target != target.name and not _same_shape(c, target):
        raise option_error("profile", f"{path} calibrates {c.target}, not this bench's target {target.name}")
    profile = default_profile(host_cpu_profile("static", c.dtype), c.dtype)
    batches = ", ".join(str(b) for b in sorted({b for t in c.batched for b in t.batches()}))
    label = (f"calibration {path} ({c.device_name}, {c.dtype}, "
             + (f"batched steps timed at B {batches})" if batches else "batch 1 only: batches priced by the "
                "profile's growth)"))
    return label, CalibratedModel(LatencyModel.from_profile(profile), c, target)


def _same_shape(c: HostCalibration, target: Architecture) -> bool:
    return any(t.arch.with_shape(name="") == target.with_shape(name="") for t in c.batched)


def predicted_speedup(model: LatencyPredictor, target: Architecture, drafter: Architecture,
                      head_rows: int | None, batch_size: int, gamma: int, tokens_per_step: float,
                      context_tokens: int, new_tokens: int = 0, prompt_tokens: int = 0) -> float:
    """The profile's speedup of the batched loop over the target alone at `batch_size`, run as the loop runs
    it: in lockstep until each sequence has `new_tokens` (`core.lockstep`; 0: steady steps) and, with
    `prompt_tokens`, after each sequence's prompt read one at a time (by the target alone, by the target
    and the drafter when it speculates), as the bench's tokens/s count it."""
    def ms(arch: Architecture, new: int, head: int | None = None, batch: int = batch_size,
           context: int = context_tokens) -> float:
        return model.predict_ms(arch, batch_size=batch, new_tokens=new, context_tokens=context,
                                head_vocab_size=head)

    e = predict_throughput(
        gamma=gamma, draft_ms=ms(drafter, 1, head_rows), target_ms=ms(target, 1),
        verify_ms=ms(target, gamma + 1), tokens_per_step=min(max(tokens_per_step, 1.0), gamma + 1.0),
        batch_size=batch_size, lockstep_tokens=new_tokens)
    if not prompt_tokens or not new_tokens:
        return e.speedup
    plain_prefill = ms(target, prompt_tokens, batch=1, context=0)
    spec_prefill = plain_prefill + ms(drafter, prompt_tokens, head_rows, batch=1, context=0)
    tokens = batch_size * new_tokens
    return (with_prefill(e.tokens_per_s, tokens, batch_size * spec_prefill)
            / with_prefill(e.baseline_tokens_per_s, tokens, batch_size * plain_prefill))


def priced_step_ms(model: LatencyPredictor, target: Architecture, drafters: dict[str, Architecture],
                   rows: dict[str, int | None], batch_size: int, gamma: int,
                   context_tokens: int) -> dict[str, dict[str, float]]:
    """What the profile prices each step of the bench's runs at at `batch_size` (`BatchedOutput.step_ms`'s
    keys): the target alone's decode, and per drafter its draft step and the verify of gamma + 1."""
    def ms(arch: Architecture, new: int, head: int | None = None) -> float:
        return round(model.predict_ms(arch, batch_size=batch_size, new_tokens=new,
                                      context_tokens=context_tokens, head_vocab_size=head), 2)

    verify = ms(target, gamma + 1)
    return {"target": {"decode": ms(target, 1)}} | {
        k: {"draft": ms(arch, 1, rows[k]), "verify": verify} for k, arch in drafters.items()}


def _batch(encoded: Sequence[list[int]], batch_size: int) -> list[list[int]]:
    return [encoded[i % len(encoded)] for i in range(batch_size)]


def paired_point(batch_size: int, runs: Sequence[dict[str, BatchedOutput]], predicted: dict[str, float],
                 priced: dict[str, dict[str, float]] | None = None) -> BatchPoint:
    """One batch size from its interleaved runs (each: the target alone as "target", and every drafter);
    `priced`: what the profile prices each step at (`priced_step_ms`)."""
    labels = [k for k in runs[0] if k != "target"]
    ratios = {k: tuple(r[k].tokens_per_s / r["target"].tokens_per_s for r in runs) for k in labels}
    target, first = runs[0]["target"], runs[0]
    return BatchPoint(
        batch_size=batch_size, target_tokens_per_s=statistics.median(r["target"].tokens_per_s for r in runs),
        tokens_per_s={k: statistics.median(r[k].tokens_per_s for r in runs) for k in labels},
        speedup={k: statistics.median(v) for k, v in ratios.items()},
        tokens_per_step={k: first[k].tokens_per_step for k in labels},
        exact_match_rate={k: sum(a == b for a, b in zip(first[k].tokens, target.tokens, strict=True))
                          / batch_size for k in labels},
        predicted_speedup=predicted, speedup_runs=ratios,
        time_split={k: _shares([r[k] for r in runs]) for k in labels},
        decode_speedup={k: statistics.median(r[k].decode_tokens_per_s / r["target"].decode_tokens_per_s
                                             for r in runs) for k in labels},
        idle_row_share={k: sum(r[k].idle_rows for r in runs) / max(sum(r[k].rows for r in runs), 1)
                        for k in labels},
        step_ms={k: {part: round(statistics.median(r[k].step_ms()[part] for r in runs), 2)
                     for part in first[k].step_ms()} for k in runs[0]},
        priced_ms=priced)


def _shares(outs: Sequence[BatchedOutput]) -> dict[str, float]:
    """Each part's share of the runs' whole time (what the parts leave: "other")."""
    total = sum(o.elapsed_s for o in outs)
    if not total:
        return {}
    parts = {key: sum(o.split_s.get(key, 0.0) for o in outs) / total for key in outs[0].split_s}
    return {**parts, "other": max(0.0, 1.0 - sum(parts.values()))} if parts else {}


def _decode(name: str, engines: dict[str, BatchedStatic], batch: list[list[int]],
            heads: dict[str, torch.Tensor | None], gamma: int, max_new_tokens: int) -> BatchedOutput:
    """One timed run: the target alone ("target") or the batched loop with drafter `name`."""
    if name == "target":
        return batched_greedy(engines["target"], batch, max_new_tokens=max_new_tokens)
    return batched_speculative_generate(engines["target"], engines[name], batch, gamma=gamma,
                                        max_new_tokens=max_new_tokens, head_ids=heads[name])


def first_below_one(speedups: Sequence[tuple[int, float]]) -> int | None:
    """The first batch size (in order) whose speedup is below 1; None when none is."""
    return next((b for b, s in sorted(speedups) if s < 1.0), None)


def crossover_runs(points: Sequence[BatchPoint], label: str) -> tuple[int | None, ...]:
    """`label`'s crossover in each run: the first batch whose paired speedup in that run is below 1 (None:
    none is); empty where the points hold no per-run speedups."""
    runs = [p.speedup_runs[label] for p in points if p.speedup_runs and label in p.speedup_runs]
    if len(runs) != len(points):
        return ()
    return tuple(first_below_one([(p.batch_size, r[i]) for p, r in zip(points, runs, strict=True)])
                 for i in range(min(map(len, runs))))


def run_batched_bench(target: LoadedModel, drafters: Sequence[Drafter], prompts: Sequence[Prompt],
                      encoded: Sequence[list[int]], options: BenchOptions, *,
                      progress: Progress | None = None) -> BatchedBenchResult:
    """Measure every batch size of `options.batch_sizes` (see the module's text)."""
    if not options.batch_sizes:
        raise option_error("batch_sizes", "names no batch size (e.g. 1,2,4,8)", flag="--batch-size")
    started, load_before = time.perf_counter(), load_average()
    capture, gamma, n_new = options.device == "cuda", options.gamma, options.max_new_tokens
    decoders = {"target": StaticDecoder.from_hf(target.model)} | {
        d.label: StaticDecoder.from_hf(d.loaded.model) for d in drafters}
    heads = {d.label: torch.tensor(d.subset.ids) if d.subset is not None else None for d in drafters}
    target_arch = Architecture.from_hf_config(target.model.config, target.source.spec)
    shapes = {d.label: Architecture.from_hf_config(d.loaded.model.config, d.label) for d in drafters}
    rows = {d.label: d.subset.size if d.subset is not None else None for d in drafters}
    dtype = next(target.model.parameters()).dtype
    label, model = latency_model(options.profile, options.device, dtype_name(dtype), target_arch)
    prompt = round(sum(map(len, encoded)) / len(encoded))
    context = round(prompt + n_new / 2)
    points = []
    sizes = sorted(options.batch_sizes)
    for index, size in enumerate(sizes):
        batch = _batch(encoded, size)
        slots = max(map(len, batch)) + n_new + gamma + 2
        engines = {k: BatchedStatic(d, size, slots, capture=capture) for k, d in decoders.items()}
        names = ["target", *heads]
        names = names[index % len(names):] + names[:index % len(names)]
        for name in names:  # warm-up: every step width met (and on CUDA captured) before the timed runs
            _decode(name, engines, batch, heads, gamma, n_new)
        runs = []
        for r in range(max(1, options.rounds)):  # interleaved; the order turns each run
            order = names[r % len(names):] + names[:r % len(names)]
            runs.append({name: _decode(name, engines, batch, heads, gamma, n_new) for name in order})
        predicted = {} if model is None else {
            k: predicted_speedup(model, target_arch, shapes[k], rows[k], size, gamma, o.tokens_per_step,
                                 context, n_new, prompt) for k, o in runs[0].items() if k != "target"}
        priced = (None if model is None
                  else priced_step_ms(model, target_arch, shapes, rows, size, gamma, context))
        points.append(paired_point(size, runs, predicted, priced))
        if progress:
            progress(index + 1, len(sizes))
    return BatchedBenchResult(
        target=target.source.spec, drafters={d.label: d.loaded.source.spec for d in drafters}, gamma=gamma,
        max_new_tokens=n_new, device=options.device, dtype=str(dtype).removeprefix("torch."),
        threads=torch.get_num_threads(),
        profile=label, points=tuple(points),
        measured_crossover={k: first_below_one([(p.batch_size, p.speedup[k]) for p in points])
                            for k in heads},
        measured_crossover_runs={k: crossover_runs(points, k) for k in heads},
        predicted_crossover=_predicted_crossover(model, target_arch, shapes, rows, points, gamma, context,
                                                 n_new, prompt),
        prompts=tuple(p.id for p in prompts), host=host_label(options.device),
        load_average_before=load_before,
        versions=package_versions(), wall_s=round(time.perf_counter() - started, 2))


def _predicted_crossover(model: LatencyPredictor | None, target: Architecture,
                         shapes: dict[str, Architecture], rows: dict[str, int | None],
                         points: Sequence[BatchPoint], gamma: int, context: int, new_tokens: int,
                         prompt_tokens: int) -> dict[str, int | None]:
    """Per drafter, the first of `PREDICTED_BATCHES` the profile prices below 1 (as `predicted_speedup`), at
    the drafter's tokens per step averaged over the measured batch sizes (acceptance does not depend on B)."""
    if model is None:
        return {k: None for k in shapes}
    out: dict[str, int | None] = {}
    for k, arch in shapes.items():
        tokens = sum(p.tokens_per_step[k] for p in points) / len(points)
        out[k] = first_below_one([(b, predicted_speedup(model, target, arch, rows[k], b, gamma, tokens,
                                                        context, new_tokens, prompt_tokens))
                                  for b in PREDICTED_BATCHES])
    return out


def host_label(device: str) -> str:
    """What a result names its host by: the GPU, or the CPU's vendor, family, model and ISA."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return cpu_identity().label()
