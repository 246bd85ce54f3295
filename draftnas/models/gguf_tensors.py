"""Hugging Face tensors as a GGUF holds them: llama.cpp's tensor names, LLaMA's q/k rows in llama.cpp's
rotary order, and the tensors written (a model's own, or random ones of a shape for timing)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from draftnas.core.registry import Architecture

_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str | None:
    """A Hugging Face tensor name's GGUF name (None: not stored, e.g. rotary buffers)."""
    if hf_name in _TOP:
        return _TOP[hf_name]
    parts = hf_name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"]:
        module = ".".join(parts[3:-1])
        if module in _LAYER:
            return f"blk.{parts[2]}.{_LAYER[module]}.{parts[-1]}"
    return None


def rotary_rows(hf_name: str, t: torch.Tensor, arch: Architecture) -> torch.Tensor:
    """A LLaMA q or k projection's rows in the order llama.cpp's rotary embedding reads them: Hugging Face
    rotates the two halves of each head (rotate_half), llama.cpp adjacent pairs, so each head's rows
    [first half, second half] are interleaved; other tensors unchanged."""
    if hf_name.endswith("self_attn.q_proj.weight"):
        heads = arch.num_attention_heads
    elif hf_name.endswith("self_attn.k_proj.weight"):
        heads = arch.num_key_value_heads
    else:
        return t
    return interleave_rotary(t, heads)


def interleave_rotary(t: torch.Tensor, heads: int) -> torch.Tensor:
    """A q or k projection of `heads` heads with each head's rows [first half, second half] interleaved
    (Hugging Face's rotate_half order to llama.cpp's adjacent pairs)."""
    return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def random_tensors(arch: Architecture, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Hugging Face-named random tensors of `arch` for timing: one layer's drawn once and repeated (a
    step's time does not depend on the values), the embedding and an untied head."""
    g = torch.Generator().manual_seed(seed)
    h, kv, i = arch.hidden_size, arch.kv_dim, arch.intermediate_size

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    layer = {
        "input_layernorm.weight": torch.ones(h),
        "post_attention_layernorm.weight": torch.ones(h),
        "self_attn.q_proj.weight": rnd(arch.q_dim, h),
        "self_attn.k_proj.weight": rnd(kv, h),
        "self_attn.v_proj.weight": rnd(kv, h),
        "self_attn.o_proj.weight": rnd(h, arch.q_dim),
        "mlp.gate_proj.weight": rnd(i, h),
        "mlp.up_proj.weight": rnd(i, h),
        "mlp.down_proj.weight": rnd(h, i),
    }
    if arch.family == "qwen2":
        layer |= {
            "self_attn.q_proj.bias": rnd(arch.q_dim),
            "self_attn.k_proj.bias": rnd(kv),
            "self_attn.v_proj.bias": rnd(kv),
        }
    yield "model.embed_tokens.weight", rnd(arch.vocab_size, h)
    for n in range(arch.num_hidden_layers):
        for k, t in layer.items():
            yield f"model.layers.{n}.{k}", t
    yield "model.norm.weight", torch.ones(h)
    yield "lm_head.weight", rnd(arch.vocab_size, h)


def model_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A transformers model's tensors by Hugging Face name; a head tied to the embedding is left out
    (llama.cpp then reads the embedding as the head)."""
    state = model.state_dict()
    head, embed = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
    tied = head is not None and embed is not None and head.data_ptr() == embed.data_ptr()
    for name, t in state.items():
        if tied and name == "lm_head.weight":
            continue
        yield name, t
