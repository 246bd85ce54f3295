"""A compact decoder over a static KV cache: the step serving engines run, in plain torch.

Serving engines (vLLM, SGLang, TensorRT-LLM; gpt-fast in a few hundred lines) run the
draft step (1 token) and the verify step (gamma + 1 tokens) over KV caches allocated once
at their final size, with the positions to write given to every step. That is what makes
a step capturable as a CUDA graph: nothing in it allocates, grows or keeps a hidden write
counter, so a replay writes exactly the slots its `positions` input names, and a rejected
draft is rolled back by writing the next step at an earlier position (stale slots past a
token's own position are masked out).

Two families: "llama" (SmolLM2, LLaMA-1/2/3, Mistral) and "gemma3" (q/k norms, sandwich
norms, GELU-tanh MLP, scaled embeddings, sliding-window layers with their own RoPE base).
Module and parameter names mirror transformers' (`self_attn.` and `mlp.` dropped), so its
weights load as they are and its logits check this decoder (tests/models/test_decoder.py).

On CPU, a linear layer over a few rows can be done as F.linear(x, W) or as (W @ x.T).T;
on some hosts the second reads a large W once and is several times faster for a large LM head,
while for small matrices either may win. `matmul.MatmulChooser` times both once per (rows,
out, in) on the machine it runs on and keeps the faster.

Shapes: B batch, T new tokens, S cache slots, H query heads, K key/value heads, D head
dim, h hidden size, V head rows. torch is imported at module level: import this lazily.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftnas.core.errors import InvalidInputError
from draftnas.core.registry import Architecture
from draftnas.models.matmul import MatmulChooser
from draftnas.models.random_weights import fill_random, no_default_init
from draftnas.models.records import linear_formats
from draftnas.models.spec import DecoderSpec, spec_from_hf_config


class RMSNorm(nn.Module):
    """RMSNorm in transformers' order of operations: LLaMA scales by w after casting back,
    Gemma-3 by (1 + w) in fp32 before casting back."""

    def __init__(self, dim: int, eps: float, gemma: bool, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, **factory) if gemma else torch.ones(dim, **factory))
        self.eps, self.gemma = eps, gemma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (x32 * (1.0 + self.weight.float())).type_as(x)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_table(theta: float, factor: float, dim: int, positions: int, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [positions, dim], computed in fp32 as transformers does, then cast."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    inv_freq = inv_freq / factor
    freqs = torch.arange(positions, device=device).float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@dataclass
class KVCache:
    """Keys and values of every layer, allocated once: [layers, B, K, S, D] each."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def slots(self) -> int:
        return int(self.keys.shape[3])


def _linear(mm: MatmulChooser, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`layer(x)` through the chooser's product, plus the layer's bias where it has one."""
    out = mm(x, layer.weight)
    return out if layer.bias is None else out + layer.bias


class DecoderLayer(nn.Module):
    """Attention (GQA, RoPE) and a gated MLP, pre-norm (llama) or sandwich-norm (gemma3),
    writing its keys/values into the cache in place."""

    def __init__(self, spec: DecoderSpec, index: int, matmul: MatmulChooser, **factory: Any) -> None:
        super().__init__()
        arch = spec.arch
        h, q, kv, inter = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
        self.gemma = arch.family == "gemma3"
        self.heads, self.kv_heads, self.head_dim = (arch.num_attention_heads, arch.num_key_value_heads,
                                                    arch.head_dim)
        self.sliding = index in spec.sliding_layers
        self.window = spec.sliding_window
        self.scale = spec.query_scale or None
        self.matmul = matmul
        norm = {"eps": spec.rms_eps, "gemma": self.gemma, **factory}
        self.input_layernorm = RMSNorm(h, **norm)
        self.post_attention_layernorm = RMSNorm(h, **norm)
        if self.gemma:
            self.pre_feedforward_layernorm = RMSNorm(h, **norm)
            self.post_feedforward_layernorm = RMSNorm(h, **norm)
            self.q_norm = RMSNorm(self.head_dim, **norm)
            self.k_norm = RMSNorm(self.head_dim, **norm)
        qkv_bias = arch.family == "qwen2"  # Qwen2: q, k and v projections carry biases
        self.q_proj = nn.Linear(h, q, bias=qkv_bias, **factory)
        self.k_proj = nn.Linear(h, kv, bias=qkv_bias, **factory)
        self.v_proj = nn.Linear(h, kv, bias=qkv_bias, **factory)
        self.o_proj = nn.Linear(q, h, bias=False, **factory)
        self.gate_proj = nn.Linear(h, inter, bias=False, **factory)
        self.up_proj = nn.Linear(h, inter, bias=False, **factory)
        self.down_proj = nn.Linear(inter, h, bias=False, **factory)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_proj, self.up_proj,
                     self.down_proj):
            matmul.register(proj.weight)

    def _attention(self, y: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor,
                   values: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = y.shape
        mm = self.matmul
        q = _linear(mm, y, self.q_proj).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = _linear(mm, y, self.k_proj).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # [B,K,T,D]
        v = _linear(mm, y, self.v_proj).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.gemma:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if positions.dim() == 1:  # every sequence writes the same slots
            keys.index_copy_(2, positions, k)
            values.index_copy_(2, positions, v)
        else:  # each sequence its own: [B, T] positions
            index = positions[:, None, :, None].expand(-1, self.kv_heads, -1, self.head_dim)
            keys.scatter_(2, index, k)
            values.scatter_(2, index, v)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                              enable_gqa=self.heads != self.kv_heads)  # [B, H, T, D]
        return mm(attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim), self.o_proj.weight)

    def _mlp(self, y: torch.Tensor) -> torch.Tensor:
        mm = self.matmul
        gate = mm(y, self.gate_proj.weight)
        act = F.gelu(gate, approximate="tanh") if self.gemma else F.silu(gate)
        return mm(act * mm(y, self.up_proj.weight), self.down_proj.weight)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor,
                values: torch.Tensor, positions: torch.Tensor,
                masks: dict[bool, torch.Tensor]) -> torch.Tensor:
        """x: [B, T, h]; rope: cos/sin [B or 1, 1, T, D]; keys/values: [B, K, S, D], written at
        `positions` ([T], or [B, T] for one row of positions per sequence)."""
        mask = masks[self.sliding]
        if self.gemma:
            x = x + self.post_attention_layernorm(
                self._attention(self.input_layernorm(x), rope, keys, values, positions, mask))
            return x + self.post_feedforward_layernorm(self._mlp(self.pre_feedforward_layernorm(x)))
        x = x + self._attention(self.input_layernorm(x), rope, keys, values, positions, mask)
        return x + self._mlp(self.post_attention_layernorm(x))


class StaticDecoder(nn.Module):
    """A causal LM whose forward writes into a preallocated `KVCache` at given positions.

    `forward(input_ids, positions, cache, layers=k)` runs only the first k layers (the
    profiler times a k-layer prefix of one built model); the cache then needs k layers.
    """

    def __init__(self, spec: DecoderSpec | Architecture, *, dtype: torch.dtype, device: torch.device | str,
                 max_positions: int = 16384, matmul: str = "auto", skip_init: bool = False) -> None:
        """`skip_init`: leave the linear and embedding weights uninitialized (their default random
        init drew every value, a large part of building a 1.5B model for timing); for callers that
        write every parameter next (`init_random`)."""
        super().__init__()
        with no_default_init() if skip_init else contextlib.nullcontext():
            self._build(spec, dtype=dtype, device=device, max_positions=max_positions, matmul=matmul)

    def _build(self, spec: DecoderSpec | Architecture, *, dtype: torch.dtype, device: torch.device | str,
               max_positions: int, matmul: str) -> None:
        spec = spec if isinstance(spec, DecoderSpec) else DecoderSpec(arch=spec)
        problems = spec.problems()
        if problems:
            raise InvalidInputError(f"static decoder {spec.arch.name}: " + "; ".join(problems))
        arch = spec.arch
        factory: dict[str, Any] = {"dtype": dtype, "device": device}
        self.spec, self.arch = spec, arch
        self.matmul = MatmulChooser(enabled=matmul == "auto" and torch.device(device).type == "cpu")
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size, **factory)
        self.embed_scale = math.sqrt(arch.hidden_size) if arch.family == "gemma3" else 1.0
        # constants a step uses are buffers made once: a captured step creates no tensor from a Python
        # value and copies nothing from the host
        self.register_buffer("embed_scale_t", torch.tensor(self.embed_scale, **factory), persistent=False)
        self.register_buffer("slot_index", torch.arange(max_positions, device=device), persistent=False)
        self.mask_open: torch.Tensor
        self.mask_shut: torch.Tensor
        self.embed_scale_t: torch.Tensor
        self.slot_index: torch.Tensor
        self.register_buffer("mask_open", torch.zeros((), **factory), persistent=False)
        self.register_buffer("mask_shut", torch.full((), float("-inf"), **factory), persistent=False)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, self.matmul, **factory)
                                    for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, spec.rms_eps, arch.family == "gemma3", **factory)
        rows = spec.head_rows or arch.vocab_size
        self.lm_head = nn.Linear(arch.hidden_size, rows, bias=False, **factory)
        if arch.tie_word_embeddings and rows == arch.vocab_size:
            self.lm_head.weight = self.embed_tokens.weight
        self.matmul.register(self.lm_head.weight)
        # buffers, so that moving the decoder (`.to("cuda")`) moves the tables with it
        dim = arch.head_dim
        tables = {"global": _rope_table(spec.rope_theta, spec.rope_factor, dim, max_positions, dtype, device),
                  "local": _rope_table(spec.local_rope_theta, 1.0, dim, max_positions, dtype, device)}
        for kind, (cos, sin) in tables.items():
            self.register_buffer(f"rope_{kind}_cos", cos, persistent=False)
            self.register_buffer(f"rope_{kind}_sin", sin, persistent=False)
        self.rope_global_cos: torch.Tensor
        self.rope_global_sin: torch.Tensor
        self.rope_local_cos: torch.Tensor
        self.rope_local_sin: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def head_rows(self) -> int:
        return int(self.lm_head.weight.shape[0])

    def quantize_weights(self, weights: str = "int8") -> StaticDecoder:
        """Multiply each layer group (attention, MLP, head) in its format of `weights` from now on (CPU;
        `models.records.weight_roles`, `MatmulChooser.quantize`). Dense weights stay (healing reads them)."""
        linears = {name: m for name, m in self.named_modules() if isinstance(m, nn.Linear)}
        for name, kind in linear_formats(weights, list(linears)).items():
            self.matmul.quantize(linears[name].weight, kind)
        return self

    def init_random(self, seed: int, std: float = 0.02, pool: int | None = None,
                    timing_only: bool = False) -> StaticDecoder:
        """Random weights (`models.random_weights.fill_random`; norms at their identity). `timing_only`:
        the model is built to be timed, its outputs read by no one, so its products may compute other
        values at the same cost (`MatmulChooser.timing_only`)."""
        fill_random(self, seed, std, pool, norm_value=0.0 if self.arch.family == "gemma3" else 1.0)
        self.matmul.timing_only = timing_only
        return self

    def new_cache(self, batch_size: int, slots: int, layers: int | None = None) -> KVCache:
        """A zeroed cache of `slots` positions for the first `layers` layers (default: all)."""
        n = self.arch.num_hidden_layers if layers is None else layers
        shape = (n, batch_size, self.arch.num_key_value_heads, slots, self.arch.head_dim)
        return KVCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                       torch.zeros(shape, dtype=self.dtype, device=self.device))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                layers: int | None = None, *, keep: int | None = None, slots: int | None = None,
                hidden: dict[int, torch.Tensor | None] | None = None) -> torch.Tensor:
        """input_ids: [B, T]; positions: int64 [T] (slots to write, increasing), or [B, T] when each
        sequence reads at its own positions (a batch of sequences of different lengths)
        -> logits [B, keep, V].

        A token attends to every slot at or before its own position (and, in a sliding
        layer, within the window); slots past it — stale drafts, never written — are masked.
        `keep`: logits of the last `keep` tokens only (default all T). `slots`: attend over the
        cache's first `slots` slots only (eager callers that know the sequence length; a
        captured step attends over the whole cache). `hidden`: for each layer index i among its keys,
        set to the residual stream entering layer i for every row read, [B, T, h] (transformers'
        `hidden_states[i]`; i = the layer count: after the last layer, before the final norm).
        """
        n = len(self.layers) if layers is None else layers
        if slots is not None:
            cache = KVCache(cache.keys[:, :, :, :slots], cache.values[:, :, :, :slots])
        x = self.embed_tokens(input_ids)  # [B, T, h]
        if self.embed_scale != 1.0:
            x = x * self.embed_scale_t
        slot = self.slot_index[:cache.slots]
        rows = positions if positions.dim() == 2 else positions[None]  # [B or 1, T]
        causal = slot <= rows[..., None]  # [B or 1, T, S]
        # additive masks (0 where a token may attend, -inf elsewhere): a boolean mask is converted inside
        # attention with a tensor made from a Python value, which a captured step must not contain
        masks = {False: torch.where(causal, self.mask_open, self.mask_shut)[:, None]}  # [B or 1, 1, T, S]
        if self.spec.sliding_layers:
            window = causal & (slot > rows[..., None] - self.spec.sliding_window)
            masks[True] = torch.where(window, self.mask_open, self.mask_shut)[:, None]
        ropes = {False: (self.rope_global_cos[rows][:, None], self.rope_global_sin[rows][:, None]),
                 True: (self.rope_local_cos[rows][:, None], self.rope_local_sin[rows][:, None])}
        for i in range(n):
            if hidden is not None and i in hidden:
                hidden[i] = x
            layer = self.layers[i]
            assert isinstance(layer, DecoderLayer)
            x = layer(x, ropes[layer.sliding], cache.keys[i], cache.values[i], positions, masks)
        if hidden is not None and n in hidden:
            hidden[n] = x
        if keep is not None:
            x = x[:, -keep:]
        logits = self.matmul(self.norm(x), self.lm_head.weight)
        if self.spec.final_softcap:
            logits = torch.tanh(logits / self.spec.final_softcap) * self.spec.final_softcap
        return logits

    def load_hf_weights(self, state_dict: Mapping[str, torch.Tensor]) -> StaticDecoder:
        """Copy a transformers state dict in (LLaMA or Gemma-3 names, with or without `model.`)."""
        own = dict(self.named_parameters())
        renamed = {k.removeprefix("model.").replace("self_attn.", "").replace("mlp.", ""): v
                   for k, v in state_dict.items()}
        tied = self.lm_head.weight is self.embed_tokens.weight
        missing = [k for k in own if k not in renamed and not (k == "lm_head.weight" and tied)]
        if missing:
            raise InvalidInputError(f"weights miss {len(missing)} tensors of {self.arch.name}, "
                                    f"e.g. {', '.join(missing[:3])}")
        with torch.no_grad():
            for name, p in own.items():
                if name in renamed:
                    src = renamed[name]
                    if tuple(src.shape) != tuple(p.shape):
                        raise InvalidInputError(f"{name}: shape {tuple(src.shape)} does not match "
                                                f"{tuple(p.shape)} of {self.arch.name}")
                    p.copy_(src)
        return self

    @classmethod
    def from_hf(cls, model: Any, *, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None, max_positions: int = 4096,
                matmul: str = "auto") -> StaticDecoder:
        """The static decoder of a loaded transformers LLaMA/Gemma-3 causal LM, its head included
        (a reduced draft head keeps its rows)."""
        weight = model.get_input_embeddings().weight
        head_rows = int(model.get_output_embeddings().weight.shape[0])
        vocab = int(weight.shape[0])
        spec = spec_from_hf_config(model.config, head_rows=0 if head_rows == vocab else head_rows)
        spec = replace(spec, arch=replace(spec.arch, vocab_size=vocab))
        decoder = cls(spec, dtype=dtype or weight.dtype, device=device or weight.device,
                      max_positions=max_positions, matmul=matmul)
        return decoder.load_hf_weights(model.state_dict()).eval()
