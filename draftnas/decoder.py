"""A compact LLaMA-family decoder over a static KV cache: the step serving engines run.

Serving engines (vLLM, SGLang, TensorRT-LLM; gpt-fast in a few hundred lines) run the
draft step (1 token) and the verify step (gamma + 1 tokens) over KV caches allocated once
at their final size, with the positions to write given to every step. That is what makes
a step capturable as a CUDA graph: nothing in it allocates, grows or keeps a hidden write
counter, so a replay writes exactly the slots its `positions` input names.

Shapes: B batch, T new tokens, S cache slots (allocated once), H query heads, K key/value
heads, D head dim, h hidden size, V head rows. Module and parameter names mirror
transformers' `LlamaForCausalLM` (without its `model.` prefix), so its weights load as
they are (`load_hf_weights`) and its logits check this decoder (tests/test_decoder.py).
torch is imported at module level: import this module lazily.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftnas.errors import InvalidInputError
from draftnas.registry import Architecture

ROPE_THETA = 10000.0
RMS_EPS = 1e-5


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm, in transformers' order of operations (fp32 statistics, weight last)."""

    def __init__(self, dim: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class KVCache:
    """Keys and values of every layer, allocated once: [layers, B, K, S, D] each."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def slots(self) -> int:
        return int(self.keys.shape[3])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nelement() * self.keys.element_size() * 2)


class DecoderLayer(nn.Module):
    """Pre-norm attention (GQA, RoPE) and SwiGLU MLP, writing its keys/values in place."""

    def __init__(self, arch: Architecture, **factory: Any) -> None:
        super().__init__()
        h, q, kv, inter = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
        self.heads, self.kv_heads, self.head_dim = arch.num_attention_heads, arch.num_key_value_heads, \
            arch.head_dim
        self.input_layernorm = RMSNorm(h, RMS_EPS, **factory)
        self.post_attention_layernorm = RMSNorm(h, RMS_EPS, **factory)
        self.q_proj = nn.Linear(h, q, bias=False, **factory)
        self.k_proj = nn.Linear(h, kv, bias=False, **factory)
        self.v_proj = nn.Linear(h, kv, bias=False, **factory)
        self.o_proj = nn.Linear(q, h, bias=False, **factory)
        self.gate_proj = nn.Linear(h, inter, bias=False, **factory)
        self.up_proj = nn.Linear(h, inter, bias=False, **factory)
        self.down_proj = nn.Linear(inter, h, bias=False, **factory)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, T, h]; cos/sin: [T, D]; keys/values: [B, K, S, D] (written at `positions`)."""
        b, t, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(y).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, K, T, D]
        v = self.v_proj(y).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys.index_copy_(2, positions, k)
        values.index_copy_(2, positions, v)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                              enable_gqa=self.heads != self.kv_heads)  # [B, H, T, D]
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class StaticDecoder(nn.Module):
    """A LLaMA-family causal LM whose forward writes into a preallocated `KVCache`.

    `forward(input_ids, positions, cache, layers=k)` runs only the first k layers (the
    profiler times a k-layer prefix of one built model); the cache then needs k layers.
    """

    def __init__(self, arch: Architecture, *, dtype: torch.dtype, device: torch.device | str,
                 max_positions: int = 16384, rope_theta: float = ROPE_THETA) -> None:
        super().__init__()
        if arch.family != "llama":
            raise InvalidInputError(
                f"the static decoder builds family 'llama' only, got {arch.family!r} ({arch.name})")
        factory: dict[str, Any] = {"dtype": dtype, "device": device}
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size, **factory)
        self.layers = nn.ModuleList(DecoderLayer(arch, **factory) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, RMS_EPS, **factory)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False, **factory)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        d = arch.head_dim
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
        freqs = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)  # [P, D], fp32 as transformers computes them
        self.cos_table: torch.Tensor
        self.sin_table: torch.Tensor
        self.register_buffer("cos_table", angles.cos().to(dtype), persistent=False)
        self.register_buffer("sin_table", angles.sin().to(dtype), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def init_random(self, seed: int, std: float = 0.02) -> StaticDecoder:
        """Random weights (N(0, std), norms at 1), generated on the device: no download, no CPU copy."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "norm.weight":
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
        return self

    def new_cache(self, batch_size: int, slots: int, layers: int | None = None) -> KVCache:
        """A zeroed cache of `slots` positions for the first `layers` layers (default: all)."""
        n = self.arch.num_hidden_layers if layers is None else layers
        shape = (n, batch_size, self.arch.num_key_value_heads, slots, self.arch.head_dim)
        return KVCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                       torch.zeros(shape, dtype=self.dtype, device=self.device))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                layers: int | None = None) -> torch.Tensor:
        """input_ids: [B, T]; positions: int64 [T] (slots to write, increasing) -> logits [B, T, V].

        Attention sees every slot at or before a token's own position; slots past it (stale
        tokens of a rejected draft, or never written) are masked out.
        """
        n = len(self.layers) if layers is None else layers
        x = self.embed_tokens(input_ids)  # [B, T, h]
        cos, sin = self.cos_table[positions], self.sin_table[positions]  # [T, D]
        slot = torch.arange(cache.slots, device=positions.device)
        mask = slot[None, :] <= positions[:, None]  # [T, S]
        for i in range(n):
            x = self.layers[i](x, cos, sin, cache.keys[i], cache.values[i], positions, mask)
        return self.lm_head(self.norm(x))

    def load_hf_weights(self, state_dict: Mapping[str, torch.Tensor]) -> StaticDecoder:
        """Copy a transformers LlamaForCausalLM state dict in (names with or without `model.`)."""
        own = dict(self.named_parameters())
        renamed = {k.removeprefix("model.").replace("self_attn.", "").replace("mlp.", ""): v
                   for k, v in state_dict.items()}
        missing = [k for k in own if k not in renamed and not (k == "lm_head.weight"
                                                                and self.arch.tie_word_embeddings)]
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


class StaticStep:
    """One forward at fixed inputs and write positions, eager or replayed from a CUDA graph.

    Every call writes the same cache slots (`positions`), so repeated calls see the same
    context: nothing to reset between timed repeats. `logits` holds the last output.
    """

    def __init__(self, decoder: StaticDecoder, cache: KVCache, input_ids: torch.Tensor,
                 positions: torch.Tensor, layers: int | None = None, *, capture: bool = False,
                 pool: Any = None, warmup: int = 2) -> None:
        self.decoder, self.cache, self.layers = decoder, cache, layers
        self.input_ids, self.positions = input_ids, positions
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = self._forward()
        if capture:
            self._capture(pool, warmup)

    def _forward(self) -> torch.Tensor:
        return self.decoder(self.input_ids, self.positions, self.cache, self.layers)

    def _capture(self, pool: Any, warmup: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the default stream, as capture requires
            for _ in range(warmup):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = self._forward()

    def __call__(self) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits = self._forward()
        return self.logits

    def reset(self) -> None:
        """Nothing to undo: the next call writes the same slots."""


def activation_bytes(arch: Architecture, batch_size: int, new_tokens: int, slots: int,
                     dtype_bytes: int, head_rows: int | None = None) -> int:
    """Peak transient memory of one forward (bytes): the largest live intermediates.

    The MLP's gate, up and product ([B, T, intermediate] x 3), the residual stream and norm
    (fp32 statistics), q/k/v, the attention weights if a math kernel materialises them
    ([B, H, T, S] in fp32) and the logits ([B, T, V]), with no reuse assumed between them.
    """
    tokens = batch_size * new_tokens
    rows = arch.vocab_size if head_rows is None else head_rows
    per_token = (3 * arch.intermediate_size + 4 * arch.hidden_size + arch.q_dim + 2 * arch.kv_dim
                 + rows) * dtype_bytes + 2 * arch.hidden_size * 4
    attention = 4 * batch_size * arch.num_attention_heads * new_tokens * slots
    return int(tokens * per_token + attention)
