"""The profiler's runtime: device, dtype, timer and memory budget of one run, and the
steps it times (transformers' eager forward, draftnas's static step, the LM head alone).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from draftnas.core.errors import DeviceError
from draftnas.core.machine import available_memory_bytes, cpu_count, cpu_model_name, require_device
from draftnas.core.options import option_error
from draftnas.core.registry import Architecture
from draftnas.latency.records import STATIC_MODES, Condition, ProfileOptions
from draftnas.models.hf_head import CACHE_ARG
from draftnas.models.matmul import MatmulChooser
from draftnas.models.static_step import StaticStep

CUDA_MARGIN_BYTES = 1 << 30  # the CUDA context, allocator rounding and cuBLAS workspaces
RAM_FRACTION = 0.5  # of available RAM: the rest stays with the OS and other processes
RANDOM_POOL = 4_194_301  # a prime: random weights for timing are filled from this many values


class Runtime:
    """Device, dtype and a timer for one profiling run."""

    def __init__(self, options: ProfileOptions) -> None:
        # Caches of many sizes come and go chunk after chunk; growable segments keep the
        # allocator from fragmenting (effective only before CUDA's first allocation).
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

        self.torch = torch
        self.options = options
        self.cuda = options.device == "cuda"
        require_device(options.device)
        if options.threads:
            torch.set_num_threads(options.threads)
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16,
                      "bf16": torch.bfloat16}[options.resolved_dtype()]
        self.dtype_bytes = 4 if options.resolved_dtype() == "fp32" else 2
        self.generator = torch.Generator(device=self.device).manual_seed(options.seed)
        self.kernels = "auto"  # "linear": decoders multiply with plain F.linear (no per-host choice)

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
        return int(available_memory_bytes() * RAM_FRACTION)

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

    def build(self, arch: Architecture, weights: str = "dense") -> Any:
        """A random-weight model of `arch`'s shape on the device, in eval mode: a transformers
        LlamaForCausalLM in eager mode, a `draftnas.models.decoder.StaticDecoder` otherwise.
        `weights` (static modes; where each runs: `models.records.weights_problem`): the decoder
        multiplies in that format ("int8", "int4", per layer group; its dense weights stay, so the bytes a
        calibration budgets for it are an upper bound)."""
        torch = self.torch
        if self.options.mode in STATIC_MODES:
            from draftnas.models.decoder import StaticDecoder
            from draftnas.models.row_padding import choose_row_padding

            decoder = StaticDecoder(arch, dtype=self.dtype, device=self.device, skip_init=True,
                                    matmul=self.kernels).init_random(self.options.seed, pool=RANDOM_POOL,
                                                                     timing_only=True)
            if weights != "dense":
                decoder.quantize_weights(weights)
            choose_row_padding(decoder)  # as the bench's engines do (CPU only; nothing to choose quantized)
            return decoder.eval()
        if weights != "dense":
            raise option_error("mode", f"is {self.options.mode}: {weights} weights run in draftnas's static "
                                       "decoder only (static)")

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


class EagerStep:
    """One decode/verify forward over a DynamicCache holding `context` random tokens."""

    def __init__(self, rt: Runtime, model: Any, arch: Architecture, cond: Condition, layers: int) -> None:
        batch, new, context = cond
        self.model, self.new_tokens, self.layers = model, new, layers
        self.cache = DynamicCache()
        kv_shape = (batch, arch.num_key_value_heads, context, arch.head_dim)
        for i in range(layers):  # keys/values: [B, kv_heads, context, head_dim]
            self.cache.update(rt.randn(kv_shape), rt.randn(kv_shape), i)
        self.input_ids = rt.randint(arch.vocab_size, (batch, new))

    def __call__(self) -> None:
        self.model.config.num_hidden_layers = self.layers  # LlamaModel runs layers[:n]
        self.model(input_ids=self.input_ids, **{CACHE_ARG: self.cache}, use_cache=True)

    def reset(self) -> None:
        self.cache.crop(-self.new_tokens)  # back to `context` tokens


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocator's failure (CUDA's or the host's), which a smaller chunk may avoid."""
    text = str(exc)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def static_step(rt: Runtime, model: Any, arch: Architecture, cond: Condition, layers: int,
                 pool: Any) -> Any:
    """`draftnas.models.static_step.StaticStep` over a cache of exactly context + new slots, the context
    filled with random keys/values; captured as a CUDA graph in "cuda-graph" mode.

    The write positions are the step's input (context .. context + new - 1), so every call
    and every replay rewrites the same slots: the context stays fixed with nothing to reset.
    The graph mode this replaces captured transformers' StaticCache, whose write position is
    state of the cache (a counter advanced inside the captured graph, reset from outside it,
    handled differently across transformers releases); it ended in an illegal memory access.
    """

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
        if out_of_memory(exc):  # the round-robin halves the chunk and retries, or skips the job
            raise
        raise DeviceError(f"CUDA-graph capture of {arch.name} at batch {batch}, {new} new tokens failed "
                          f"({str(exc).splitlines()[0]}); time it in the static mode instead") from None


class HeadStep:
    """Final RMSNorm + LM head of `rows` rows on [tokens, 1, hidden] activations (never captured:
    two kernels, whose launch cost the fit's head_call term takes). In the static modes on CPU
    the head's product goes through `decoder.MatmulChooser`, as the static decoder's own head
    does (its first call, a warm-up, picks the form): with `F.linear` a few-row head can cost
    several times a 1-row head where the chosen form costs about the same."""

    def __init__(self, rt: Runtime, hidden: int, rows: int, tokens: int) -> None:
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


def kv_bytes(rt: Runtime, arch: Architecture, cond: Condition, layers: int) -> int:
    batch, new, context = cond
    return 2 * layers * batch * (context + new) * arch.kv_dim * rt.dtype_bytes


def model_bytes(rt: Runtime, arch: Architecture) -> int:
    return arch.count_parameters() * rt.dtype_bytes
