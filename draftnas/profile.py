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
forward draftnas's CPU loop runs today); "static" times `draftnas.decoder`'s
step over a KV cache allocated once at its final size, with its write positions
as an input; "cuda-graph" captures that same step once per configuration and
times its replay, as serving engines run it.

Memory: configurations are grouped into chunks whose real peak — weights, every
KV cache as allocated, outputs held between calls, and the largest transient of
one forward — fits the run's budget (free device memory, or available RAM, less
a margin). A configuration that cannot fit even alone is not timed; it is
listed in the profile's `skipped` with the bytes it needed. torch and
transformers are imported inside the functions.

Size: the profiler's runtime (eager, static and CUDA-graph steps), memory-aware chunk planning,
calibration of a host and the depth-vs-width report; they share the private runtime and job records.
The largest module left; its report half is the next to move.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from draftnas.errors import DeviceError, InvalidInputError
from draftnas.latency import (
    SCHEMA_VERSION,
    ExtrapolationCheck,
    ExtrapolationPoint,
    HostCalibration,
    LatencyModel,
    LatencyProfile,
    Measurement,
    SkippedConfig,
    TargetTiming,
    fit_latency_model,
)
from draftnas.machine import cpu_count, cpu_model_name, load_average
from draftnas.provenance import package_versions
from draftnas.record import Record
from draftnas.registry import Architecture, get_architecture

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
Condition = tuple[int, int, int]  # (batch_size, new_tokens, context_tokens)

DEVICES = ("cpu", "cuda")
MODES = ("eager", "static", "cuda-graph")
STATIC_MODES = ("static", "cuda-graph")
CUDA_MARGIN_BYTES = 1 << 30  # the CUDA context, allocator rounding and cuBLAS workspaces
RAM_FRACTION = 0.5  # of available RAM: the rest stays with the OS and other processes
DTYPES_BY_DEVICE = {"cpu": ("fp32", "bf16"), "cuda": ("fp16", "bf16")}
DRAFT_CONDITION: Condition = (1, 1, 128)


@dataclass(frozen=True)
class ProfileOptions(Record):
    """What to measure. `quick` is a reduced grid that takes a few minutes on a 2-core CPU."""

    device: str = "cpu"
    dtype: str | None = None  # None: fp32 on CPU, fp16 on CUDA
    mode: str = "eager"  # "eager" | "cuda-graph" (CUDA only)
    quick: bool = False
    warmup: int | None = None  # None: 1 quick, 2 full (per configuration, after building)
    repeats: int | None = None  # None: 7 quick, 15 full
    seed: int = 0
    extrapolation_check: bool = True
    threads: int | None = None  # None: torch's default for this machine
    memory_budget_bytes: int | None = None  # None: free device memory (or RAM) less a margin

    def resolved_dtype(self) -> str:
        return self.dtype or DTYPES_BY_DEVICE.get(self.device, ("fp32",))[0]

    def resolved_repeats(self) -> int:
        return self.repeats if self.repeats is not None else (7 if self.quick else 15)

    def resolved_warmup(self) -> int:
        return self.warmup if self.warmup is not None else (1 if self.quick else 2)

    def validate(self) -> ProfileOptions:
        problems = []
        if self.device not in DEVICES:
            problems.append(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        elif self.resolved_dtype() not in DTYPES_BY_DEVICE[self.device]:
            problems.append(f"dtype on {self.device} must be one of "
                            f"{', '.join(DTYPES_BY_DEVICE[self.device])}, got {self.dtype!r}")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        elif self.mode == "cuda-graph" and self.device != "cuda":
            problems.append("mode cuda-graph needs --device cuda")
        if self.resolved_warmup() < 0 or self.resolved_repeats() < 3:
            problems.append("warmup must be >= 0 and repeats >= 3")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            problems.append(f"memory budget must be > 0 bytes, got {self.memory_budget_bytes}")
        if problems:
            raise InvalidInputError("; ".join(problems))
        return self


@dataclass(frozen=True)
class ProfilePlan(Record):
    """The shapes and conditions one profiling run times (pure data; see `plan_profile`)."""

    shapes: tuple[Architecture, ...]
    heldout: tuple[str, ...]
    conditions: tuple[tuple[int, int, int], ...]
    head_points: tuple[tuple[str, int, int], ...]  # (shape whose hidden size, head rows, tokens)
    extrapolation_shape: Architecture | None
    extrapolation_layers: tuple[int, ...]
    extrapolation_conditions: tuple[tuple[int, int, int], ...]
    series: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _llama(name: str, layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int,
           head_dim: int = 64, tied: bool = True) -> Architecture:
    return Architecture(name=name, family="llama", num_hidden_layers=layers, hidden_size=hidden,
                        intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv,
                        head_dim=head_dim, vocab_size=vocab, tie_word_embeddings=tied)


def _cpu_plan(quick: bool) -> ProfilePlan:
    # Depth series: SmolLM2-135M's layer (576 hidden, 9 q / 3 kv heads, MLP 1536), 1..16 layers.
    depth = [_llama(f"depth-L{n}", n, 576, 1536, 9, 3, 49152) for n in (1, 2, 4, 8, 16)]
    # Width series at 4 layers; 576 is depth-L4.
    width = [_llama("width-h256", 4, 256, 704, 4, 2, 49152),
             _llama("width-h384", 4, 384, 1024, 6, 2, 49152),
             _llama("width-h768", 4, 768, 2048, 12, 4, 49152),
             _llama("width-h960", 4, 960, 2560, 15, 5, 49152)]
    mixed = [_llama("mix-2x1024-v32k", 2, 1024, 2816, 16, 8, 32000, tied=False),
             _llama("mix-6x384-mha-v8k", 6, 384, 1536, 6, 6, 8192),
             _llama("mix-12x256-v16k", 12, 256, 512, 4, 1, 16384),
             _llama("mix-8x576-pruned", 8, 576, 768, 6, 2, 49152),
             _llama("mix-3x640-hd256-v64k", 3, 640, 2048, 4, 1, 65536, head_dim=256)]
    conditions: list[Condition] = [(1, 1, 128), (1, 1, 512), (1, 3, 128), (1, 5, 128), (1, 9, 128),
                                   (4, 1, 128), (4, 5, 256), (16, 1, 128), (16, 3, 128), (64, 1, 128)]
    if not quick:
        conditions += [(1, 2, 128), (1, 4, 128), (1, 7, 128), (1, 1, 1024), (2, 1, 128), (8, 1, 128),
                       (8, 5, 512), (32, 1, 128), (64, 2, 128), (1, 5, 1024)]
    heads = tuple((s, rows, tokens) for s in ("depth-L1", "width-h960")
                  for rows in ((4096, 16384, 49152) if quick else (2048, 8192, 16384, 32768, 49152))
                  for tokens in (1, 5, 64))
    return ProfilePlan(
        shapes=tuple(depth + width + mixed),
        heldout=("depth-L8", "width-h768", "mix-6x384-mha-v8k", "mix-8x576-pruned"),
        conditions=tuple(conditions), head_points=heads,
        extrapolation_shape=get_architecture("smollm2-360m"), extrapolation_layers=(4, 8),
        extrapolation_conditions=((1, 1, 128), (1, 5, 128), (8, 1, 128)),
        series={"depth": tuple(a.name for a in depth),
                "width": ("width-h256", "width-h384", "depth-L4", "width-h768", "width-h960")},
    )


def _cuda_plan(quick: bool) -> ProfilePlan:
    # LLaMA-7B's layer (the paper's drafters are LLaMA-7B cut to 1/3/5 layers).
    depth = [_llama(f"depth-L{n}", n, 4096, 11008, 32, 32, 32000, 128, False) for n in (1, 2, 4, 8, 16)]
    width = [_llama("width-h1024", 4, 1024, 2816, 8, 8, 32000, 128, False),
             _llama("width-h2048", 4, 2048, 5504, 16, 16, 32000, 128, False),
             _llama("width-h3072", 4, 3072, 8192, 24, 24, 32000, 128, False),
             _llama("width-h5120", 4, 5120, 13824, 40, 40, 32000, 128, False)]
    mixed = [_llama("mix-2x8192-gqa8", 2, 8192, 28672, 64, 8, 32000, 128, False),
             _llama("mix-8x2048-v128k", 8, 2048, 8192, 16, 8, 128256, 128, False),
             _llama("mix-24x1024", 24, 1024, 4096, 16, 4, 32000, 64, False),
             _llama("mix-4x4096-pruned", 4, 4096, 5504, 16, 16, 32000, 128, False),
             _llama("mix-6x3584-v152k", 6, 3584, 18944, 28, 4, 152064, 128, False)]
    conditions: list[Condition] = [(1, 1, 128), (1, 1, 2048), (1, 3, 128), (1, 5, 128), (1, 9, 128),
                                   (4, 1, 512), (4, 5, 512), (16, 1, 512), (16, 5, 512), (64, 1, 512),
                                   (64, 9, 512)]
    if not quick:
        conditions += [(1, 2, 128), (1, 4, 128), (1, 7, 128), (2, 1, 128), (8, 1, 1024), (32, 1, 1024),
                       (8, 9, 1024), (32, 5, 2048), (64, 3, 2048), (1, 1, 8192)]
    heads = tuple((s, rows, tokens) for s in ("width-h2048", "depth-L1")
                  for rows in (4096, 16384, 32000, 65536, 128256) for tokens in (1, 9, 64, 576))
    return ProfilePlan(
        shapes=tuple(depth + width + mixed),
        heldout=("depth-L8", "width-h3072", "mix-24x1024", "mix-4x4096-pruned"),
        conditions=tuple(conditions), head_points=heads,
        extrapolation_shape=get_architecture("llama-7b"), extrapolation_layers=(4, 8),
        extrapolation_conditions=((1, 1, 128), (1, 5, 128), (16, 1, 512), (16, 5, 512)),
        series={"depth": tuple(a.name for a in depth),
                "width": ("width-h1024", "width-h2048", "width-h3072", "depth-L4", "width-h5120")},
    )


def plan_profile(options: ProfileOptions) -> ProfilePlan:
    """The measurement grid for a device: depth and width series, mixed shapes, held-out shapes."""
    plan = _cuda_plan(options.quick) if options.device == "cuda" else _cpu_plan(options.quick)
    if not options.extrapolation_check:
        plan = dataclasses.replace(plan, extrapolation_shape=None)
    return plan


# --------------------------------------------------------------------------- runtime


class _Runtime:
    """Device, dtype and a timer for one profiling run."""

    def __init__(self, options: ProfileOptions) -> None:
        import os

        # Caches of many sizes come and go chunk after chunk; growable segments keep the
        # allocator from fragmenting (effective only before CUDA's first allocation).
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        import torch

        self.torch = torch
        self.options = options
        self.cuda = options.device == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise DeviceError("--device cuda asked for, but torch sees no CUDA device here "
                              f"(torch {torch.__version__}); use --device cpu")
        if options.threads:
            torch.set_num_threads(options.threads)
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16,
                      "bf16": torch.bfloat16}[options.resolved_dtype()]
        self.dtype_bytes = 4 if options.resolved_dtype() == "fp32" else 2
        self.generator = torch.Generator(device=self.device).manual_seed(options.seed)

    def randint(self, high: int, shape: tuple[int, ...]) -> Any:
        return self.torch.randint(0, high, shape, generator=self.generator, device=self.device)

    def randn(self, shape: tuple[int, ...]) -> Any:
        return self.torch.randn(shape, generator=self.generator, device=self.device, dtype=self.dtype)

    def memory_budget_bytes(self) -> int:
        """Memory one round-robin chunk may take at its peak (see the module docstring)."""
        if self.options.memory_budget_bytes is not None:
            return self.options.memory_budget_bytes
        if self.cuda:
            free, _ = self.torch.cuda.mem_get_info(self.device)
            return max(0, int(free * 0.8) - CUDA_MARGIN_BYTES)
        import os

        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available = 4 << 30
        return int(available * RAM_FRACTION)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def time_ms(self, fn: Callable[[], Any]) -> float:
        """Wall time of fn() in ms; on CUDA between two events after a synchronize."""
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def build(self, arch: Architecture) -> Any:
        """A random-weight model of `arch`'s shape on the device, in eval mode: a transformers
        LlamaForCausalLM in eager mode, a `draftnas.decoder.StaticDecoder` otherwise."""
        torch = self.torch
        if self.options.mode in STATIC_MODES:
            from draftnas.decoder import StaticDecoder

            decoder = StaticDecoder(arch, dtype=self.dtype, device=self.device)
            return decoder.init_random(self.options.seed).eval()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
            intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
            num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
            head_dim=arch.head_dim, tie_word_embeddings=arch.tie_word_embeddings,
            max_position_embeddings=16384,
        )
        config._attn_implementation = "sdpa"
        torch.manual_seed(self.options.seed)
        with torch.device(self.device):
            model = LlamaForCausalLM._from_config(config, dtype=self.dtype)
        return model.eval()

    def device_name(self) -> str:
        if self.cuda:
            return str(self.torch.cuda.get_device_name(self.device))
        return f"{cpu_model_name()} ({cpu_count()} cores, {self.torch.get_num_threads()} threads)"


def host_mismatch(profile: LatencyProfile) -> str | None:
    """One line when `profile` was not measured on this CPU (model or thread count), or is a
    spec sheet; None when it was, or when it is a GPU profile (judged where it is used).

    CPU hosts of one machine kind differ 2x in decode time (an Intel Xeon and an AMD EPYC
    host, both "2-core"), so a shipped profile is a prior, never this machine's figures.
    """
    if profile.kind == "spec-sheet":
        return f"the latency profile is a spec-sheet roofline for {profile.device_name}, not a measurement"
    if profile.device != "cpu":
        return None
    here, cores = cpu_model_name(), cpu_count()
    same_model = profile.device_name.startswith(here)
    same_threads = profile.threads in (None, cores)
    if same_model and same_threads:
        return None
    return (f"the latency profile was measured on {profile.device_name}; this machine is {here} with "
            f"{cores} cores, so its predictions may be far off here (measure this one: draftnas profile "
            "--device cpu --out my-cpu.json, then --profile my-cpu.json)")


class _EagerStep:
    """One decode/verify forward over a DynamicCache holding `context` random tokens."""

    def __init__(self, rt: _Runtime, model: Any, arch: Architecture, cond: Condition, layers: int) -> None:
        from transformers import DynamicCache

        batch, new, context = cond
        self.model, self.new_tokens, self.layers = model, new, layers
        self.cache = DynamicCache()
        kv_shape = (batch, arch.num_key_value_heads, context, arch.head_dim)
        for i in range(layers):  # keys/values: [B, kv_heads, context, head_dim]
            self.cache.update(rt.randn(kv_shape), rt.randn(kv_shape), i)
        self.input_ids = rt.randint(arch.vocab_size, (batch, new))

    def __call__(self) -> None:
        self.model.config.num_hidden_layers = self.layers  # LlamaModel runs layers[:n]
        self.model(input_ids=self.input_ids, past_key_values=self.cache, use_cache=True)

    def reset(self) -> None:
        self.cache.crop(-self.new_tokens)  # back to `context` tokens


def _static_step(rt: _Runtime, model: Any, arch: Architecture, cond: Condition, layers: int,
                 pool: Any) -> Any:
    """`draftnas.decoder.StaticStep` over a cache of exactly context + new slots, the context
    filled with random keys/values; captured as a CUDA graph in "cuda-graph" mode.

    The write positions are the step's input (context .. context + new - 1), so every call
    and every replay rewrites the same slots: the context stays fixed with nothing to reset.
    The graph mode this replaces captured transformers' StaticCache, whose write position is
    state of the cache (a counter advanced inside the captured graph, reset from outside it,
    handled differently across transformers releases); it ended in an illegal memory access.
    """
    from draftnas.decoder import StaticStep

    torch = rt.torch
    batch, new, context = cond
    cache = model.new_cache(batch, context + new, layers=layers)
    cache.keys[:, :, :, :context].normal_(generator=rt.generator)
    cache.values[:, :, :, :context].normal_(generator=rt.generator)
    positions = torch.arange(context, context + new, device=rt.device)
    try:
        return StaticStep(model, cache, rt.randint(arch.vocab_size, (batch, new)), positions, layers,
                          capture=rt.options.mode == "cuda-graph", pool=pool)
    except RuntimeError as exc:
        raise DeviceError(f"CUDA-graph capture of {arch.name} at batch {batch}, {new} new tokens failed "
                          f"({str(exc).splitlines()[0]}); use --mode static") from None


# --------------------------------------------------------------------------- timing


@dataclass
class _Job:
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
class _Group:
    """Jobs sharing one model (None for the head-only micro-benchmarks)."""

    build: Callable[[], Any]
    weight_bytes: int
    jobs: list[_Job]


@dataclass
class _Chunk:
    """Jobs timed together (round-robin) whose peak memory fits the budget."""

    parts: list[tuple[_Group, list[_Job]]] = field(default_factory=list)
    held_bytes: int = 0  # weights of its groups + held bytes of its jobs
    transient_bytes: int = 0  # the largest transient of its jobs

    def peak_with(self, group: _Group, job: _Job) -> int:
        weights = 0 if self.parts and self.parts[-1][0] is group else group.weight_bytes
        return self.held_bytes + weights + job.held_bytes + max(self.transient_bytes, job.transient_bytes)

    def add(self, group: _Group, job: _Job) -> None:
        if not (self.parts and self.parts[-1][0] is group):
            self.parts.append((group, []))
            self.held_bytes += group.weight_bytes
        self.parts[-1][1].append(job)
        self.held_bytes += job.held_bytes
        self.transient_bytes = max(self.transient_bytes, job.transient_bytes)


def plan_chunks(groups: Sequence[_Group], budget_bytes: int) -> tuple[list[_Chunk], list[SkippedConfig]]:
    """Split the jobs, in order, into chunks whose peak fits `budget_bytes`; a job whose peak
    does not fit even alone (its model's weights included) is skipped, with the bytes it needs.

    A group's jobs may span chunks (its model is then built once per chunk).
    """
    chunks: list[_Chunk] = [_Chunk()]
    skipped: list[SkippedConfig] = []
    for group in groups:
        for job in group.jobs:
            alone = _Chunk().peak_with(group, job)
            if alone > budget_bytes:
                skipped.append(job.skipped(alone, budget_bytes))
                continue
            if chunks[-1].parts and chunks[-1].peak_with(group, job) > budget_bytes:
                chunks.append(_Chunk())
            chunks[-1].add(group, job)
    return [c for c in chunks if c.parts], skipped


def _time_chunk(rt: _Runtime, chunk: _Chunk, tick: Callable[[], None]) -> None:
    """Build the chunk's models and steps, warm every step up, then time one call of every step
    per round. Everything it built is released when it returns (or raises)."""
    pool = rt.torch.cuda.graph_pool_handle() if rt.options.mode == "cuda-graph" else None
    steps: list[tuple[_Job, Any]] = []
    for group, jobs in chunk.parts:
        model = group.build()
        steps += [(job, job.make(model, pool)) for job in jobs]
        del model
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


def _split(chunk: _Chunk) -> tuple[_Chunk, _Chunk]:
    """The chunk's jobs in two halves (in order), each a chunk of its own."""
    jobs = [(group, job) for group, part in chunk.parts for job in part]
    halves = (_Chunk(), _Chunk())
    for i, (group, job) in enumerate(jobs):
        halves[0 if i < len(jobs) // 2 else 1].add(group, job)
    return halves


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def _run_round_robin(rt: _Runtime, groups: list[_Group], tick: Callable[[], None]) -> list[SkippedConfig]:
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
                if not _out_of_memory(exc):
                    raise
                rt.free()
                jobs = [job for _, part in chunk.parts for job in part]
                for job in jobs:
                    job.times_ms.clear()
                if len(jobs) > 1:
                    queue[:0] = list(_split(chunk))
                    continue
                group = chunk.parts[0][0]
                skipped.append(jobs[0].skipped(_Chunk().peak_with(group, jobs[0]), budget,
                                               reason="ran out of memory when run alone"))
            rt.free()
    for skip in skipped:
        log.warning("not timed: %s at batch %d, %d new tokens, context %d: %s", skip.shape,
                    skip.batch_size, skip.new_tokens, skip.context_tokens, skip.reason)
    return skipped


def _kv_bytes(rt: _Runtime, arch: Architecture, cond: Condition, layers: int) -> int:
    batch, new, context = cond
    return 2 * layers * batch * (context + new) * arch.kv_dim * rt.dtype_bytes


def _weight_bytes(rt: _Runtime, arch: Architecture) -> int:
    return arch.count_parameters() * rt.dtype_bytes


def _model_job(rt: _Runtime, arch: Architecture, layers: int, cond: Condition, split: str) -> _Job:
    """A forward of `arch`'s first `layers` layers at `cond`, with its memory as really allocated.

    Static modes hold the cache (context + new slots) and the step's last logits; eager mode
    holds a DynamicCache and, while it appends the new tokens, copies one layer's keys/values
    (torch.cat) and builds the random context layer by layer.
    """
    from draftnas.decoder import activation_bytes

    batch, new, context = cond
    kv = _kv_bytes(rt, arch, cond, layers)
    act = activation_bytes(arch, batch, new, context + new, rt.dtype_bytes)
    logits = batch * new * arch.vocab_size * rt.dtype_bytes
    if rt.options.mode in STATIC_MODES:
        held, transient = kv + logits, act

        def make(model: Any, pool: Any) -> Any:
            return _static_step(rt, model, arch, cond, layers, pool)
    else:
        held, transient = kv, act + 2 * kv // max(1, layers)

        def make(model: Any, pool: Any) -> Any:
            return _EagerStep(rt, model, arch, cond, layers)
    return _Job("model", arch, layers, cond, arch.vocab_size, split, make, held, transient)


def _model_group(rt: _Runtime, arch: Architecture, layer_counts: Sequence[int],
                 conditions: Sequence[Condition], split: str) -> _Group:
    """A model of `arch` with max(layer_counts) layers, timed through its first k layers for each k."""
    built = arch.with_shape(num_hidden_layers=max(layer_counts))
    jobs = [_model_job(rt, arch, k, c, split) for k in layer_counts for c in conditions]
    return _Group(functools.partial(rt.build, built), _weight_bytes(rt, built), jobs)


class _HeadStep:
    """Final RMSNorm + LM head of `rows` rows on [tokens, 1, hidden] activations (never captured:
    two kernels, whose launch cost the fit's head_call term takes). In the static modes on CPU
    the head's product goes through `decoder.MatmulChooser`, as the static decoder's own head
    does (its first call, a warm-up, picks the form); with `F.linear` the AMD EPYC host's
    5-row head took 2.2x its 1-row head where the decoder's took about the same."""

    def __init__(self, rt: _Runtime, hidden: int, rows: int, tokens: int) -> None:
        from draftnas.decoder import MatmulChooser

        torch = rt.torch
        with torch.device(rt.device):
            self.norm = torch.nn.RMSNorm(hidden, eps=1e-5, dtype=rt.dtype)
            self.head = torch.nn.Linear(hidden, rows, bias=False, dtype=rt.dtype)
        self.x = rt.randn((tokens, 1, hidden))
        self.matmul = MatmulChooser(enabled=rt.options.mode in STATIC_MODES and not rt.cuda)
        self.matmul.register(self.head.weight)

    def __call__(self) -> None:
        self.matmul(self.norm(self.x), self.head.weight)

    def reset(self) -> None:
        pass


def _head_group(rt: _Runtime, plan: ProfilePlan) -> _Group:
    """LM-head cost as a function of its row count N (for reduced draft vocabularies)."""
    shapes = {a.name: a for a in plan.shapes}
    jobs = []
    for shape, rows, tokens in plan.head_points:
        hidden = shapes[shape].hidden_size
        jobs.append(_Job("head", shapes[shape], 0, (tokens, 1, 0), rows, "train",
                         functools.partial(lambda _m, _p, h, r, t: _HeadStep(rt, h, r, t),
                                           h=hidden, r=rows, t=tokens),
                         held_bytes=(hidden * rows + tokens * hidden) * rt.dtype_bytes,
                         transient_bytes=tokens * (rows + 2 * hidden) * rt.dtype_bytes))
    return _Group(lambda: None, 0, jobs)


def measure_read_bandwidth_gb_s(device: str = "cpu", mbytes: int = 1024, repeats: int = 7) -> float:
    """Memory read bandwidth (GB/s): the median time of summing a `mbytes` fp32 buffer, which
    reads every byte once (the same streaming a decode step's weights need)."""
    import torch

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


def extrapolate_from_layers(times_ms: dict[int, float], layers: int) -> float:
    """fixed + L * per_layer from timings of stacks with different layer counts (least squares)."""
    ks = np.array(sorted(times_ms), dtype=float)
    if len(ks) < 2:
        raise InvalidInputError("extrapolation needs timings of at least two layer counts")
    ts = np.array([times_ms[int(k)] for k in ks])
    per_layer, fixed = np.polyfit(ks, ts, 1)
    return float(fixed + layers * per_layer)


def _time_stacks(rt: _Runtime, arch: Architecture, conditions: Sequence[Condition],
                 layer_counts: Sequence[int],
                 progress: Progress | None = None) -> dict[tuple[int, Condition], float]:
    """Median ms of `arch`'s first k layers at each condition, for k in `layer_counts` (one model of
    max(k) layers is built)."""
    group = _model_group(rt, arch, layer_counts, conditions, "extrapolation")
    skipped = _run_round_robin(rt, [group], _ticker(progress, len(group.jobs) * _calls_per_job(rt.options)))
    if skipped:
        raise InvalidInputError(f"{len(skipped)} of the k-layer stacks of {arch.name} do not fit here, "
                                f"e.g. {skipped[0].shape}: {skipped[0].reason}; time fewer layers")
    return {(j.layers, j.cond): j.measurement().median_ms for j in group.jobs}


def measure_extrapolated(options: ProfileOptions, arch: Architecture, conditions: Sequence[Condition],
                         layer_counts: Sequence[int] = (2, 4), progress: Progress | None = None
                         ) -> dict[Condition, float]:
    """Latency (ms) of `arch` at full depth from timings of only its first k layers.

    For targets too big for the device (e.g. LLaMA-65B on one GPU): only max(k) layers
    are built; each condition's estimate is fixed + L * per-layer (`extrapolate_from_layers`).
    """
    medians = _time_stacks(_Runtime(options.validate()), arch, conditions, layer_counts, progress)
    return {cond: extrapolate_from_layers({k: medians[(k, cond)] for k in layer_counts},
                                          arch.num_hidden_layers)
            for cond in conditions}


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
    from draftnas.placement import shard

    ks = tuple(sorted(set(layer_counts)))
    if len(ks) < 2 or ks[0] < 1:
        raise InvalidInputError(f"--layers needs at least two different layer counts >= 1, got "
                                f"{', '.join(map(str, layer_counts))}")
    if ks[-1] >= target.num_hidden_layers:
        raise InvalidInputError(f"--layers {ks[-1]} is not fewer than {target.name}'s "
                                f"{target.num_hidden_layers} layers")
    if gpus < 1 or (gpus > 1 and options.device != "cuda"):
        raise InvalidInputError(f"--tp {gpus}: a tensor-parallel share is timed on CUDA only (got "
                                f"--device {options.device})")
    timed = shard(target, gpus)
    if gpus > 1:
        timed = timed.with_shape(vocab_size=max(1, target.vocab_size // gpus), name=f"{target.name}/tp{gpus}")
    news = tuple(range(1, max_gamma + 2))
    conditions = [(b, n, context_tokens) for b in batch_sizes for n in news]
    started = time.perf_counter()
    rt = _Runtime(options.validate())
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


def calibrate_host(options: ProfileOptions, target: Architecture, new_tokens: Sequence[int],
                   prefix_layers: Sequence[int] = (1, 2), context_tokens: int = 128,
                   progress: Progress | None = None, overheads: bool = True,
                   prompt_tokens: int = 0, head_rows: Sequence[int] = ()) -> HostCalibration:
    """Time `target` (random weights) on this machine: every count in `new_tokens` at full depth,
    and one new token through its first k layers for k in `prefix_layers` — seconds, not the
    minutes of a profile. Timed the way `options.mode` runs steps (eager: transformers' forward,
    what `--engine hf` runs; static: draftnas's decoder, what `--engine static` runs).
    With `overheads`, short real decoding runs also measure the work outside the forward
    (`decoding_overheads`). `prompt_tokens` > 0: the prefill of a prompt that long is timed too.
    `head_rows`: reduced draft heads; one new token of the full-depth target with each, so the
    time a smaller head saves is measured (`HostCalibration.head_saving_ms`).
    """
    started = time.perf_counter()
    rt = _Runtime(options.validate())
    full = target.num_hidden_layers
    prefixes = tuple(k for k in sorted(set(prefix_layers) | ({1} if overheads else set())) if k < full)
    counts = tuple(sorted(set(new_tokens) | {1} | ({2, 3, 4} if overheads else set())))
    jobs = [_model_job(rt, target, full, (1, n, context_tokens), "calibration") for n in counts]
    jobs += [_model_job(rt, target, k, (1, 1, context_tokens), "calibration") for k in prefixes]
    if prompt_tokens > 0:
        jobs.append(_model_job(rt, target, full, (1, prompt_tokens, 0), "calibration"))
    groups = [_Group(functools.partial(rt.build, target), _weight_bytes(rt, target), jobs)]
    rows = sorted({r for r in head_rows if 0 < r < target.vocab_size})
    for r in rows:  # the target's body under an r-row head: full depth and (when timed) its first layer
        shape = target.with_shape(vocab_size=r)
        depths = (full, 1) if 1 in prefixes else (full,)
        jobs_r = [_model_job(rt, shape, k, (1, 1, context_tokens), "calibration") for k in depths]
        groups.append(_Group(functools.partial(rt.build, shape), _weight_bytes(rt, shape), jobs_r))
    n_jobs = sum(len(g.jobs) for g in groups)
    skipped = _run_round_robin(rt, groups, _ticker(progress, n_jobs * _calls_per_job(options)))
    if skipped:
        raise DeviceError(f"calibrating {target.name} here: {skipped[0].reason}")
    reduced = {r: g.jobs[0].measurement().median_ms for r, g in zip(rows, groups[1:], strict=True)}
    reduced_first = {r: g.jobs[1].measurement().median_ms for r, g in zip(rows, groups[1:], strict=True)
                     if len(g.jobs) > 1}
    medians = {(j.layers, j.cond[1]): j.measurement().median_ms for j in jobs if j.cond[2] == context_tokens}
    prefill = {j.cond[1]: j.measurement().median_ms for j in jobs if j.cond[2] == 0}
    target_ms = {n: medians[(full, n)] for n in counts}
    prefix_ms = {k: medians[(k, 1)] for k in prefixes}
    extra = (0.0, 0.0, 0.0)
    if overheads and 1 in prefix_ms:
        extra = decoding_overheads(rt, target, context_tokens, target_ms, prefix_ms[1])
    return HostCalibration(
        target=target.name, device_name=rt.device_name(), threads=rt.torch.get_num_threads(),
        context_tokens=context_tokens, target_ms=target_ms, prefix_ms=prefix_ms, mode=options.mode,
        wall_s=round(time.perf_counter() - started, 1), generate_overhead_ms=extra[0],
        draft_overhead_ms=extra[1], verify_overhead_ms=extra[2], prefill_ms=prefill,
        head_saving_ms={r: max(0.0, target_ms[1] - ms) for r, ms in reduced.items()},
        head_saving_prefix_ms={r: max(0.0, prefix_ms[1] - ms) for r, ms in reduced_first.items()})


def decoding_overheads(rt: _Runtime, target: Architecture, context_tokens: int, target_ms: dict[int, float],
                       draft_ms: float) -> tuple[float, float, float]:
    """Work outside the forward, in ms: plain decoding per token, draftnas's loop per drafted
    token and per verify step — the part of real decoding runs that the timed steps do not explain.

    Random-weight target and its 1-layer prefix as drafter, in the engine `rt`'s mode times:
    transformers' `generate` and the loop over transformers models (eager), or greedy decoding
    and the loop over draftnas's decoder with static caches (static modes). Plain decoding:
    time per token between a 2- and a 14-token run (prefill cancels), less the decode step.
    Loop, per drafted token: the loop's own drafting time (`SpeculativeOutput.draft_s`) between
    a 4- and a 16-token run at gamma 1 and 3 (the drafter's prefill cancels), per drafted token,
    less `draft_ms`. Measured directly, not fitted: fitted from whole runs with the other terms,
    it swung from 0 to 2.1 ms between calibrations on the AMD EPYC host, where the direct
    reading varied by 0.24 ms over three repeats in one process. Per verify step: each run's
    time less its forward steps and that drafting work, fitted by least squares as constant
    (prefill) + per step. Negative values count as 0.
    """
    from draftnas.speculative import StaticEngine, greedy_decode, speculative_generate

    torch = rt.torch
    model, drafter = rt.build(target), rt.build(target.with_shape(num_hidden_layers=1))
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

    def verify_ms(n: int) -> float:
        known = sorted(target_ms)
        return target_ms.get(n, target_ms[min(known, key=lambda k: abs(k - n))])

    runs = []
    with torch.inference_mode():
        generate_s(2)
        # the fastest of 3 runs each: on a shared host one slow run gave 18 ms of "overhead" per token
        short, long = min(generate_s(2) for _ in range(3)), min(generate_s(14) for _ in range(3))
        generate = max(0.0, (long - short) * 1e3 / 12 - target_ms[1])
        for gamma in (1, 3):  # warm-up: every step size once (the static decoder picks its kernels then)
            speculative_generate(model, drafter, prompt, gamma=gamma, max_new_tokens=16)
        for gamma in (1, 3):
            pair = [min((speculative_generate(model, drafter, prompt, gamma=gamma, max_new_tokens=n)
                         for _ in range(2)), key=lambda o: o.elapsed_s) for n in (4, 16)]  # the faster of two
            runs.append(pair)
    drafted = sum(sum(long.drafted) - sum(short.drafted) for short, long in runs)
    drafting_ms = sum((long.draft_s - short.draft_s) * 1e3 for short, long in runs)
    per_draft = max(0.0, drafting_ms / drafted - draft_ms) if drafted > 0 else 0.0
    rows, residuals = [], []
    for out in (o for pair in runs for o in pair):
        forward = sum(d * (draft_ms + per_draft) + verify_ms(d + 1) for d in out.drafted)
        rows.append([1.0, float(out.steps)])
        residuals.append(out.elapsed_s * 1e3 - forward)
    _, per_step = np.linalg.lstsq(np.array(rows), np.array(residuals), rcond=None)[0]
    return generate, per_draft, max(0.0, float(per_step))


def _extrapolation_result(plan: ProfilePlan, group: _Group) -> ExtrapolationCheck | None:
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


# --------------------------------------------------------------------------- the whole run


def _calls_per_job(options: ProfileOptions) -> int:
    return options.resolved_warmup() + options.resolved_repeats()


def count_ticks(plan: ProfilePlan, options: ProfileOptions) -> int:
    """Progress units of a run: one per forward call (warm-up or timed)."""
    jobs = len(plan.shapes) * len(plan.conditions) + len(plan.head_points)
    if plan.extrapolation_shape is not None:
        jobs += (len(plan.extrapolation_layers) + 1) * len(plan.extrapolation_conditions)
    return jobs * _calls_per_job(options)


def _ticker(progress: Progress | None, total: int) -> Callable[[], None]:
    done = 0

    def tick() -> None:
        nonlocal done
        done = min(done + 1, total)  # after an out-of-memory retry the bar may reach its end early
        if progress is not None:
            progress(done, total)

    return tick


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
    rt = _Runtime(options)
    plan = plan or plan_profile(options)
    heldout = set(plan.heldout)
    groups = [_model_group(rt, a, (a.num_hidden_layers,), plan.conditions,
                           "heldout" if a.name in heldout else "train") for a in plan.shapes]
    if plan.head_points:
        groups.append(_head_group(rt, plan))
    extrapolation_group = None
    if plan.extrapolation_shape is not None:
        arch = plan.extrapolation_shape
        extrapolation_group = _model_group(rt, arch, (*plan.extrapolation_layers, arch.num_hidden_layers),
                                           plan.extrapolation_conditions, "extrapolation")
        groups.append(extrapolation_group)
    skipped = _run_round_robin(rt, groups, _ticker(progress, count_ticks(plan, options)))
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
        series=plan.series, skipped=tuple(skipped),
    )


# --------------------------------------------------------------------------- depth vs width report


@dataclass(frozen=True)
class ReportRow(Record):
    series: str  # "depth" | "width"
    shape: str
    layers: int
    hidden_size: int
    non_embedding_params: int
    measured_ms: float | None
    q1_ms: float | None
    q3_ms: float | None
    predicted_ms: float
    split: str


@dataclass(frozen=True)
class DepthWidthReport(Record):
    """Draft latency (batch 1, one new token) against depth and against width."""

    device_name: str
    dtype: str
    batch_size: int
    new_tokens: int
    context_tokens: int
    rows: tuple[ReportRow, ...]
    ms_per_layer_overhead: float  # the fitted per-layer fixed cost
    ms_per_million_layer_params: float  # the fitted marginal cost of layer weights at batch 1


def depth_width_report(profile: LatencyProfile) -> DepthWidthReport:
    """Measured and predicted draft latency along the profile's depth and width series."""
    batch, new, context = DRAFT_CONDITION
    model = LatencyModel.from_profile(profile)
    shapes = {a.name: a for a in profile.shapes}
    measured = {m.shape: m for m in profile.measurements if m.kind == "model"
                and (m.batch_size, m.new_tokens, m.context_tokens) == DRAFT_CONDITION}
    rows = []
    for series, names in profile.series.items():
        for name in names:
            arch, m = shapes[name], measured.get(name)
            rows.append(ReportRow(
                series=series, shape=name, layers=arch.num_hidden_layers, hidden_size=arch.hidden_size,
                non_embedding_params=arch.non_embedding_parameters(),
                measured_ms=m.median_ms if m else None, q1_ms=m.q1_ms if m else None,
                q3_ms=m.q3_ms if m else None,
                predicted_ms=model.predict_ms(arch, batch_size=batch, new_tokens=new,
                                              context_tokens=context),
                split=m.split if m else "-"))
    c = profile.coefficients
    # at one token per sequence the skinny-GEMM tile term (2 FLOPs per parameter) is a
    # per-parameter cost too; leaving it out reported 0 where a fit put the weight reads there
    skinny = min(float(batch * new), c.get("tile_rows", 1.0))
    per_mparam = (c["gemm_mb"] * _bytes(profile.dtype) + c["gemm_gflop"] * 2e-3
                  + c.get("gemm_tile_gflop", 0.0) * 2e-3 * skinny)
    return DepthWidthReport(device_name=profile.device_name, dtype=profile.dtype, batch_size=batch,
                            new_tokens=new, context_tokens=context, rows=tuple(rows),
                            ms_per_layer_overhead=c["layer"] + c["layer_token"],
                            ms_per_million_layer_params=per_mparam)


def _bytes(dtype: str) -> int:
    from draftnas.placement import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def save_report_png(report: DepthWidthReport, path: str | Path) -> Path:
    """Two panels: draft latency vs layers (fixed width) and vs hidden size (fixed depth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, series, key, label in ((axes[0], "depth", "layers", "layers (depth)"),
                                   (axes[1], "width", "hidden_size", "hidden size (width)")):
        rows = sorted((r for r in report.rows if r.series == series), key=lambda r: getattr(r, key))
        xs = [getattr(r, key) for r in rows]
        ax.plot(xs, [r.predicted_ms for r in rows], "-", color="tab:blue", label="latency model")
        pts = [r for r in rows if r.measured_ms is not None]
        err = [[(r.measured_ms or 0.0) - (r.q1_ms or 0.0) for r in pts],
               [(r.q3_ms or 0.0) - (r.measured_ms or 0.0) for r in pts]]
        ax.errorbar([getattr(r, key) for r in pts], [r.measured_ms for r in pts], yerr=err, fmt="o",
                    color="tab:orange", capsize=3, label="measured (median, IQR)")
        for r in pts:
            if r.split == "heldout":
                ax.annotate("held out", (getattr(r, key), r.measured_ms), fontsize=7,
                            textcoords="offset points", xytext=(4, -10))
        ax.set_xlabel(label)
        ax.set_ylabel("draft latency (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{report.device_name}, {report.dtype}: batch {report.batch_size}, "
                 f"{report.new_tokens} new token, context {report.context_tokens}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
