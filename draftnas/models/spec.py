"""A decoder's arithmetic beyond its shape (`DecoderSpec`), read from a transformers config.
Pure: no torch. The static decoder (`models.decoder`) is built from one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Record
from draftnas.core.registry import Architecture

FAMILIES = ("llama", "qwen2", "gemma3")


@dataclass(frozen=True)
class DecoderSpec(Record):
    """Everything that decides a decoder's arithmetic beyond its shape.

    `head_rows`: rows of the LM head (a reduced draft head), 0 for the full vocabulary.
    `sliding_layers`: indices of sliding-window layers (gemma3), which use `local_rope_theta`.
    `query_scale`: 0 means head_dim ** -0.5.
    """

    arch: Architecture
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_factor: float = 1.0  # linear RoPE scaling of the full-attention layers
    local_rope_theta: float = 10000.0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    query_scale: float = 0.0
    final_softcap: float = 0.0
    head_rows: int = 0

    def problems(self) -> list[str]:
        out = list(self.arch.problems())
        if self.arch.family not in FAMILIES:
            out.append(f"family: the static decoder builds {', '.join(FAMILIES)}, got {self.arch.family!r}")
        if self.head_rows < 0 or self.head_rows > self.arch.vocab_size:
            out.append(f"head_rows: must be in [0, {self.arch.vocab_size}], got {self.head_rows}")
        if self.sliding_layers and self.sliding_window < 1:
            out.append("sliding_window: sliding layers need a window >= 1")
        return out


def spec_from_hf_config(config: Any, head_rows: int = 0) -> DecoderSpec:
    """The `DecoderSpec` of a transformers LLaMA, Qwen2 or Gemma-3 text config."""
    arch = Architecture.from_hf_config(config)
    params = getattr(config, "rope_parameters", None) or {}
    if arch.family == "gemma3":
        full = params.get("full_attention") or {"rope_theta": 1e6, "rope_type": "default"}
        local = params.get("sliding_attention") or {"rope_theta": 1e4, "rope_type": "default"}
        for kind, p in (("full_attention", full), ("sliding_attention", local)):
            if p.get("rope_type", "default") not in ("default", "linear") or (
                    kind == "sliding_attention" and p.get("rope_type", "default") != "default"):
                raise InvalidInputError(f"{kind} RoPE type {p.get('rope_type')!r} is not supported here")
        layer_types = list(getattr(config, "layer_types", None) or [])
        return DecoderSpec(
            arch=arch, rms_eps=float(config.rms_norm_eps), rope_theta=float(full["rope_theta"]),
            rope_factor=float(full.get("factor", 1.0)) if full.get("rope_type") == "linear" else 1.0,
            local_rope_theta=float(local["rope_theta"]), sliding_window=int(config.sliding_window or 0),
            sliding_layers=tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention"),
            query_scale=float(config.query_pre_attn_scalar) ** -0.5,
            final_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0), head_rows=head_rows)
    if getattr(config, "use_sliding_window", False):
        raise InvalidInputError("a Qwen2 model with use_sliding_window is not supported by the static "
                                "decoder")
    rope = params if "rope_theta" in params else {"rope_theta": getattr(config, "rope_theta", 10000.0)}
    if rope.get("rope_type", "default") != "default":
        raise InvalidInputError(f"RoPE type {rope.get('rope_type')!r} is not supported by the static decoder")
    return DecoderSpec(arch=arch, rms_eps=float(config.rms_norm_eps), rope_theta=float(rope["rope_theta"]),
                       head_rows=head_rows)
