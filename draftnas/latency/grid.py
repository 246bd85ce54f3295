"""The shapes and conditions a profiling run times (pure data; `plan_profile`).
"""

from __future__ import annotations

import dataclasses

from draftnas.core.registry import Architecture, get_architecture
from draftnas.latency.records import Condition, ProfileOptions, ProfilePlan


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
