"""Where the target and the drafter live: memory per GPU, tensor parallelism, feasible batch.

Pure arithmetic (no torch). A target of P parameters in a dtype of s bytes sharded over N GPUs
(tensor parallelism, Megatron-style as vLLM runs it) holds P * s / N bytes of weights per GPU,
its KV cache per sequence 2 * L * ceil(kv_heads / N) * head_dim * s * tokens bytes (KV heads are
replicated when there are fewer than GPUs), and a forward's transient activations and
full-vocabulary fp32 logits. A usable share of each GPU's memory, `1 - margin`, holds them
(vLLM's `gpu_memory_utilization`, 0.9 by default, is the same idea). The drafter sits on the
first GPU (draft tensor parallelism 1) or is sharded like the target (vLLM allows those two).

The feasible batch is what memory left after weights holds in KV cache; the drafter's weights
and cache shrink it, and the throughput model runs speculation at that batch.

Latency of a sharded model (`ShardedLatency`): each rank runs the model with 1/N of the query
heads, KV heads (at least one), MLP channels and LM-head rows, plus 2 all-reduces per layer
(after attention and after the MLP), one after the vocabulary-parallel embedding and one gather
of the logits, each priced from the interconnect (`Interconnect.allreduce_ms`). N = 1 is the
single-GPU model exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.core.records import Record
from draftnas.core.registry import Architecture

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
DEGREES: tuple[int, ...] = (1, 2, 4, 8)
DEFAULT_MARGIN = 0.1
GB = 1e9


@dataclass(frozen=True)
class Interconnect(Record):
    """GPU-to-GPU link as NCCL all-reduce sees it.

    `bus_bandwidth_gb_s` is nccl-tests' "busbw" at large messages: an all-reduce of S bytes over
    n GPUs takes S * 2(n-1)/n / busbw. `latency_us` is the time of a small all-reduce (what
    decode steps send: batch x hidden values).
    """

    name: str
    bus_bandwidth_gb_s: float
    latency_us: float
    source: str = ""

    def allreduce_ms(self, nbytes: float, gpus: int) -> float:
        if gpus <= 1:
            return 0.0
        return self.latency_us / 1e3 + 2 * (gpus - 1) / gpus * nbytes / (self.bus_bandwidth_gb_s * GB) * 1e3

    def allgather_ms(self, nbytes: float, gpus: int) -> float:
        """Gather of S bytes in total (each rank holds S / n): half an all-reduce's traffic."""
        if gpus <= 1:
            return 0.0
        return self.latency_us / 1e3 + (gpus - 1) / gpus * nbytes / (self.bus_bandwidth_gb_s * GB) * 1e3


@dataclass(frozen=True)
class Hardware(Record):
    """One GPU's memory and the dtypes it runs, how many a node has, and the link between them."""

    name: str
    memory_gb: float
    dtypes: tuple[str, ...]
    max_gpus: int = 8
    interconnect: Interconnect | None = None
    source: str = ""


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise InvalidInputError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def weight_bytes(arch: Architecture, dtype: str, gpus: int = 1, head_rows: int | None = None) -> int:
    """Weights per GPU (sharded evenly; norms are negligible)."""
    return math.ceil(arch.parameters_with_head(head_rows) * dtype_bytes(dtype) / gpus)


def kv_bytes_per_sequence(arch: Architecture, dtype: str, tokens: int, gpus: int = 1) -> int:
    """KV cache of one sequence of `tokens` tokens per GPU (KV heads replicated below one per GPU)."""
    heads = math.ceil(arch.num_key_value_heads / gpus)
    return 2 * arch.num_hidden_layers * heads * arch.head_dim * dtype_bytes(dtype) * tokens


def activation_bytes(arch: Architecture, bytes_per_value: int, batch: int, new_tokens: int, slots: int = 0,
                     gpus: int = 1, head_rows: int | None = None) -> int:
    """Peak transient memory of one forward on one device (bytes): the largest live intermediates, with
    no reuse assumed between them. The MLP's gate, up and product ([B, T, intermediate / gpus] x 3), the
    residual stream and norm (fp32 statistics), this rank's q/k/v, the attention weights where a math
    kernel materialises them ([B, heads / gpus, T, `slots`] in fp32; 0 slots: a fused kernel) and the
    logits in fp32 (`head_rows`, else the full vocabulary, gathered on every rank)."""
    tokens = batch * new_tokens
    rows = arch.vocab_size if head_rows is None else head_rows
    sharded = 3 * arch.intermediate_size + arch.q_dim + 2 * arch.kv_dim
    per_token = (math.ceil(sharded / gpus) + 4 * arch.hidden_size) * bytes_per_value \
        + 2 * arch.hidden_size * 4 + 4 * rows
    attention = 4 * batch * math.ceil(arch.num_attention_heads / gpus) * new_tokens * slots
    return int(tokens * per_token + attention)


def valid_degrees(arch: Architecture, max_gpus: int) -> tuple[int, ...]:
    """Tensor-parallel degrees that shard `arch` evenly: query heads and MLP channels divisible by
    N, and KV heads divisible by N or N by them (replication)."""
    kv = arch.num_key_value_heads
    return tuple(n for n in DEGREES if n <= max_gpus and arch.num_attention_heads % n == 0
                 and arch.intermediate_size % n == 0 and (kv % n == 0 or n % kv == 0))


@dataclass(frozen=True)
class Placement(Record):
    """The target on `gpus` GPUs (and the drafter on `draft_gpus`), per-GPU memory in bytes."""

    hardware: str
    dtype: str
    gpus: int
    draft_gpus: int
    memory_bytes: int  # one GPU
    margin: float
    capacity_bytes: int  # usable: memory * (1 - margin)
    target_weight_bytes: int
    target_kv_bytes_per_sequence: int
    target_activation_bytes: int  # at the largest batch, gamma max + 1 new tokens
    tokens_per_sequence: int  # context + gamma max + 1
    max_batch: int  # target alone
    chosen: str  # "default" (smallest degree that fits) | "--gpus"
    interconnect: Interconnect | None = None

    def drafter_bytes(self, drafter: Architecture, head_rows: int | None, batch: int) -> int:
        """The drafter's weights and KV cache at `batch` on the GPU that holds it."""
        return (weight_bytes(drafter, self.dtype, self.draft_gpus, head_rows)
                + batch * kv_bytes_per_sequence(drafter, self.dtype, self.tokens_per_sequence,
                                                self.draft_gpus))

    def max_batch_with(self, drafter: Architecture, head_rows: int | None) -> int:
        """Largest batch whose target and drafter caches fit beside both models' weights (0: none)."""
        free = (self.capacity_bytes - self.target_weight_bytes - self.target_activation_bytes
                - weight_bytes(drafter, self.dtype, self.draft_gpus, head_rows))
        per_seq = self.target_kv_bytes_per_sequence + kv_bytes_per_sequence(
            drafter, self.dtype, self.tokens_per_sequence, self.draft_gpus)
        return max(0, free // per_seq)

    def summary(self) -> str:
        return (f"{self.gpus} x {self.hardware} ({self.dtype}, tensor parallel {self.gpus}, drafter on "
                f"{self.draft_gpus}): {self.target_weight_bytes / GB:.1f} GB of target weights per GPU of "
                f"{self.capacity_bytes / GB:.1f} GB usable ({self.margin:.0%} margin); KV cache "
                f"{self.target_kv_bytes_per_sequence / GB * 1e3:.0f} MB per sequence of "
                f"{self.tokens_per_sequence} tokens; target alone fits batch {self.max_batch}")


def _place(target: Architecture, hardware: Hardware, dtype: str, gpus: int, draft_gpus: int,
           tokens: int, largest_batch: int, new_tokens: int, margin: float, chosen: str) -> Placement:
    memory = int(hardware.memory_gb * GB)
    capacity = int(memory * (1 - margin))
    weights = weight_bytes(target, dtype, gpus)
    kv = kv_bytes_per_sequence(target, dtype, tokens, gpus)
    act = activation_bytes(target, dtype_bytes(dtype), largest_batch, new_tokens, gpus=gpus)
    return Placement(hardware=hardware.name, dtype=dtype, gpus=gpus, draft_gpus=draft_gpus,
                     memory_bytes=memory,
                     margin=margin, capacity_bytes=capacity, target_weight_bytes=weights,
                     target_kv_bytes_per_sequence=kv, target_activation_bytes=act, tokens_per_sequence=tokens,
                     max_batch=max(0, (capacity - weights - act) // kv), chosen=chosen,
                     interconnect=hardware.interconnect)


def place(target: Architecture, hardware: Hardware, dtype: str, *, batch_sizes: Sequence[int],
          context_tokens: int, max_gamma: int, gpus: int | None = None, draft_tp: str = "1",
          margin: float = DEFAULT_MARGIN) -> Placement:
    """The target's placement: `gpus` when given (refused in one line if it cannot hold the target
    at batch 1), else the smallest degree whose memory holds the target at the workload's largest
    batch (or, if none does, at batch 1).
    """
    if not 0 <= margin < 1:
        raise option_error("memory_margin", f"must be in [0, 1) (a share of each GPU's memory kept free), "
                                            f"got {margin:g}")
    if dtype not in hardware.dtypes:
        raise InvalidInputError(f"{hardware.name} does not run {dtype} "
                                f"(it runs {', '.join(hardware.dtypes)})")
    if draft_tp not in ("1", "same"):
        raise option_error("draft_tp", f"must be one of 1, same (drafter on one GPU, or sharded like the "
                                       f"target), got {draft_tp!r}")
    degrees = valid_degrees(target, hardware.max_gpus)
    tokens = context_tokens + max_gamma + 1
    largest = max(batch_sizes)

    def at(n: int, chosen: str) -> Placement:
        return _place(target, hardware, dtype, n, 1 if draft_tp == "1" else n, tokens, largest, max_gamma + 1,
                      margin, chosen)

    if gpus is not None:
        if gpus < 1 or gpus > hardware.max_gpus:
            raise option_error("gpus", f"must be in 1..{hardware.max_gpus} for {hardware.name}, got {gpus}")
        if gpus not in degrees:
            raise option_error(
                "gpus", f"{gpus} does not shard {target.name} evenly ({target.num_attention_heads} query "
                        f"heads, {target.num_key_value_heads} KV heads, MLP {target.intermediate_size}); "
                        f"allowed: {', '.join(map(str, degrees))}")
        placement = at(gpus, "--gpus")
        if placement.max_batch < 1:
            raise InvalidInputError(_does_not_fit(target, placement, degrees, hardware))
        return placement
    fits = [at(n, "default") for n in degrees]
    for p in fits:
        if p.max_batch >= largest:
            return p
    for p in fits:
        if p.max_batch >= 1:
            return p
    raise InvalidInputError(_does_not_fit(target, fits[-1], (), hardware))


def _does_not_fit(target: Architecture, p: Placement, degrees: Sequence[int], hardware: Hardware) -> str:
    needed = p.target_weight_bytes + p.target_kv_bytes_per_sequence + p.target_activation_bytes
    larger = [n for n in degrees if n > p.gpus]
    hint = (f"use --gpus {larger[0]} or more" if larger else
            f"no degree up to {hardware.max_gpus} GPUs holds it; use a smaller dtype or a larger GPU")
    return (f"{target.name} in {p.dtype} does not fit on {p.gpus} x {hardware.name}: it needs "
            f"{needed / GB:.1f} GB per GPU at batch 1 ({p.target_weight_bytes / GB:.1f} GB weights, "
            f"{p.target_kv_bytes_per_sequence / GB:.2f} GB KV cache, {p.target_activation_bytes / GB:.2f} GB "
            f"activations) and {p.capacity_bytes / GB:.1f} GB is usable ({hardware.memory_gb:g} GB, "
            f"{p.margin:.0%} margin); {hint}")


class _Predictor(Protocol):
    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float: ...


def shard(arch: Architecture, gpus: int) -> Architecture:
    """One rank's share of `arch` under tensor parallelism over `gpus`."""
    if gpus == 1:
        return arch
    return arch.with_shape(num_attention_heads=max(1, arch.num_attention_heads // gpus),
                           num_key_value_heads=max(1, arch.num_key_value_heads // gpus),
                           intermediate_size=max(1, arch.intermediate_size // gpus))


class ShardedLatency:
    """A latency model for one model sharded over `gpus` (see the module docstring). `predict_ms`
    has `LatencyModel`'s signature; `gpus` = 1 returns the wrapped model's prediction unchanged."""

    def __init__(self, model: _Predictor, gpus: int, interconnect: Interconnect | None, dtype: str) -> None:
        if gpus > 1 and interconnect is None:
            raise InvalidInputError("tensor parallelism needs the hardware profile's interconnect "
                                    "(bandwidth and latency of its all-reduce)")
        self.model, self.gpus, self.link, self.dtype = model, gpus, interconnect, dtype

    def communication_ms(self, arch: Architecture, batch_size: int, new_tokens: int,
                         head_vocab_size: int | None = None) -> float:
        if self.gpus == 1 or self.link is None:
            return 0.0
        rows = batch_size * new_tokens
        hidden = rows * arch.hidden_size * dtype_bytes(self.dtype)
        logits = rows * (head_vocab_size or arch.vocab_size) * dtype_bytes(self.dtype)
        return ((2 * arch.num_hidden_layers + 1) * self.link.allreduce_ms(hidden, self.gpus)
                + self.link.allgather_ms(logits, self.gpus))

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        if self.gpus == 1:
            return self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                         context_tokens=context_tokens, head_vocab_size=head_vocab_size)
        rows = head_vocab_size or arch.vocab_size
        compute = self.model.predict_ms(shard(arch, self.gpus), batch_size=batch_size, new_tokens=new_tokens,
                                        context_tokens=context_tokens,
                                        head_vocab_size=max(1, rows // self.gpus))
        return compute + self.communication_ms(arch, batch_size, new_tokens, head_vocab_size)


def deployed(model: _Predictor, placement: Placement | None) -> tuple[_Predictor, _Predictor]:
    """(target's, drafter's) latency models: sharded over their GPUs, or `model` itself without a
    placement."""
    if placement is None:
        return model, model
    return (ShardedLatency(model, placement.gpus, placement.interconnect, placement.dtype),
            ShardedLatency(model, placement.draft_gpus, placement.interconnect, placement.dtype))
