"""ggml's block quantizers in torch, bit for bit: the bytes a GGUF drafter stores and the weights it
therefore computes with, so a search estimates acceptance with the rounding llama.cpp will see.

Q8_0: blocks of 32 along a row, one fp16 scale d = max|x| / 127, codes round-half-away(x / d).
Q4_0: blocks of 32, d = (the block's value of largest magnitude, signed) / -8, codes
trunc(x / d + 8.5) clipped to 0..15, stored two per byte (the block's first 16 codes in the low
nibbles). Both match `gguf.quants` (the reference the `gguf` package ships; tests compare them)
and ggml-quants.c's reference quantizers. F16, BF16 and F32 are casts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

BLOCK = 32
#: the types draftnas writes itself (the rest go through llama-quantize), and bytes per block of 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18}
CASTS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
WRITTEN = (*CASTS, *BLOCK_BYTES)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    floored = a.floor()
    return torch.sign(x) * (floored + (2 * (a - floored)).floor())


def _codes(w: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp16 scales [blocks, 1], codes [blocks, 32] as float: signed for Q8_0, 0..15 for Q4_0)."""
    if w.shape[-1] % BLOCK:
        raise ValueError(f"{qtype} needs rows that are a multiple of {BLOCK} values, got {w.shape[-1]}")
    blocks = w.detach().to(torch.float32).reshape(-1, BLOCK)
    if qtype == "Q8_0":
        d = blocks.abs().amax(dim=1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        return d.half(), _round_half_away(blocks * inv)
    if qtype == "Q4_0":
        index = blocks.abs().argmax(dim=1, keepdim=True)
        d = torch.gather(blocks, 1, index) / -8
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        return d.half(), torch.trunc(blocks * inv + 8.5).clamp(0, 15)
    raise ValueError(f"no block quantizer for {qtype} (have {', '.join(BLOCK_BYTES)})")


def quantize(w: torch.Tensor, qtype: str) -> np.ndarray:
    """`w` [rows, cols] in `qtype`'s bytes, [rows, cols / 32 * bytes per block] uint8 (a cast type:
    the cast values' bytes, as the `gguf` writer takes them)."""
    if qtype in CASTS:
        data = w.detach().to(CASTS[qtype]).contiguous()
        return (data.view(torch.int16) if qtype == "BF16" else data).numpy()
    rows = w.shape[0]
    d, codes = _codes(w, qtype)
    scale = d.view(torch.uint8)
    if qtype == "Q8_0":
        packed = codes.to(torch.int8).view(torch.uint8)
    else:
        nibbles = codes.to(torch.uint8).reshape(-1, 2, BLOCK // 2)
        packed = nibbles[:, 0] | (nibbles[:, 1] << 4)
    return torch.cat([scale, packed], dim=1).reshape(rows, -1).numpy()


def rounded(w: torch.Tensor, qtype: str) -> torch.Tensor:
    """`w` as `qtype` stores it, read back, in `w`'s dtype and shape."""
    if qtype in CASTS:
        return w.detach().to(CASTS[qtype]).to(w.dtype)
    d, codes = _codes(w, qtype)
    values = d.float() * (codes if qtype == "Q8_0" else codes - 8)
    return values.reshape(w.shape).to(w.dtype)


def round_model(model: nn.Module, qtype: str) -> int:
    """Round every matrix of `model` (linear layers, embeddings, the head) to `qtype` in place, as a
    GGUF drafter holds them (norms and biases stay float, as GGUF keeps them); returns the count."""
    n = 0
    with torch.no_grad():
        for p in {id(p): p for p in model.parameters()}.values():
            if p.dim() == 2:
                p.copy_(rounded(p, qtype))
                n += 1
    return n
