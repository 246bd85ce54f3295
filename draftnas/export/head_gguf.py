"""A head folder (`drafter.head.folder`, EAGLE-3's layout) as the GGUF llama.cpp's `--spec-type draft-eagle3`
loads beside the target's GGUF: architecture `eagle3`, the head's one layer under llama.cpp's names (its
`hidden_norm` as `attn_norm_2`, `fc` as is), its q and k rows in llama.cpp's rotary order, the draft
vocabulary's rows as `output` with `d2t` holding each row's target id (absolute, int64, as the pinned
llama.cpp's converter writes it), the layers it reads (`eagle3.target_layers`, exactly three there) and the
target's width, and the target's tokenizer. Written by draftnas's own writer (no converter, no tokenizer
library); what llama.cpp's loader reads is checked by `head_gguf_problems` before any server starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.head.folder import WEIGHTS, read_shape
from draftnas.drafter.head.model import MIDLAYER
from draftnas.drafter.head.shape import HeadShape
from draftnas.models.ggml_quants import WRITTEN
from draftnas.models.gguf_file import (
    GgufInfo,
    add_weight,
    copy_tokenizer,
    file_type,
    finish,
    header_values,
    read_info,
)
from draftnas.models.gguf_tensors import gguf_name, interleave_rotary

ARCH = "eagle3"
LAYERS_READ = 3  # llama.cpp's draft-eagle3 takes exactly three target layers
_OWN = {"fc.weight": "fc.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
        f"{MIDLAYER}hidden_norm.weight": "blk.0.attn_norm_2.weight"}


def head_gguf_name(folder: str | Path, quant: str) -> str:
    return f"{Path(folder).resolve().name}-{quant}.gguf"


def _tensors(folder: Path, shape: HeadShape) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor) of the head in `folder`, q and k rows reordered for llama.cpp's rotary layout."""
    from safetensors.torch import load_file

    weights = load_file(str(folder / WEIGHTS))
    for name, t in weights.items():
        if name in ("d2t", "t2d"):
            continue
        out: str | None
        if name in _OWN:
            out = _OWN[name]
        elif name.startswith(MIDLAYER):
            out = gguf_name("model.layers.0." + name[len(MIDLAYER):])
        else:
            out = None
        if out is None:
            raise InvalidInputError(f"{folder}: its weights hold {name}, which no EAGLE-3 head has")
        if name.endswith("self_attn.q_proj.weight"):
            t = interleave_rotary(t, shape.heads)
        elif name.endswith("self_attn.k_proj.weight"):
            t = interleave_rotary(t, shape.kv_heads)
        yield out, t


def draft_to_target(folder: Path, shape: HeadShape) -> np.ndarray | None:
    """Each draft row's target id (None where the head drafts the target's whole vocabulary)."""
    from safetensors.torch import load_file

    if shape.draft_vocab == shape.target.vocab_size:
        return None
    offsets = load_file(str(folder / WEIGHTS))["d2t"].to(torch.int64)
    return (offsets + torch.arange(offsets.numel())).numpy()


def write_head_gguf(folder: str | Path, target_gguf: str | Path, out: str | Path, quant: str = "F16") -> Path:
    """The head in `folder` as an eagle3 GGUF at `out` (matrices in `quant`, one of `ggml_quants.WRITTEN`;
    vectors F32), the tokenizer copied from `target_gguf` (the target's GGUF the head drafts for, checked
    to be that target). Atomic: a `.part` file renamed at the end."""
    source = Path(folder)
    shape = read_shape(source)
    if quant not in WRITTEN:
        raise InvalidInputError(f"a head's GGUF is written in {', '.join(WRITTEN)}; not {quant}")
    problems = fit_problems(shape, read_info(target_gguf))
    if problems:
        raise InvalidInputError(f"{source}: llama.cpp cannot run this head with {target_gguf}: "
                                + "; ".join(problems))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(str(part), ARCH)
    writer.add_name(source.resolve().name)
    for key, value in (("block_count", 1), ("context_length", shape.max_positions),
                       ("embedding_length", shape.hidden_size), ("feed_forward_length", shape.ffn),
                       ("attention.head_count", shape.heads), ("attention.head_count_kv", shape.kv_heads),
                       ("attention.key_length", shape.head_dim), ("attention.value_length", shape.head_dim),
                       ("rope.dimension_count", shape.head_dim), ("vocab_size", shape.target.vocab_size),
                       ("target_hidden_size", shape.target.hidden_size)):
        writer.add_uint32(f"{ARCH}.{key}", value)
    writer.add_float32(f"{ARCH}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", shape.rms_norm_eps)
    writer.add_array(f"{ARCH}.target_layers", [int(i) for i in shape.layers])
    writer.add_bool(f"{ARCH}.norm_before_residual", False)
    copy_tokenizer(writer, Path(target_gguf))
    writer.add_file_type(file_type(quant))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, t in _tensors(source, shape):
        add_weight(writer, name, t.float(), quant)
    d2t = draft_to_target(source, shape)
    if d2t is not None:
        writer.add_tensor("d2t", d2t.astype(np.int64), raw_dtype=gguf.GGMLQuantizationType.I64)
    return finish(writer, part, path)


def fit_problems(shape: HeadShape, target: GgufInfo) -> list[str]:
    """Why llama.cpp's draft-eagle3 would not run a head of `shape` beside the target GGUF `target` (empty:
    it runs): three layers read, each within the target, the target's width and vocabulary."""
    out = []
    if len(shape.layers) != LAYERS_READ:
        out.append(f"it reads {len(shape.layers)} target layers; llama.cpp's draft-eagle3 takes exactly "
                   f"{LAYERS_READ} (train it with --layers A,B,C)")
    outside = [i for i in shape.layers if not 0 <= i <= target.block_count]
    if outside:
        out.append(f"layers {','.join(map(str, outside))} lie outside the target's {target.block_count}")
    if shape.target.hidden_size != target.embedding_length:
        out.append(f"it reads width {shape.target.hidden_size}, the target's is {target.embedding_length}")
    if shape.target.vocab_size != target.vocab_tokens:
        out.append(f"it drafts for {shape.target.vocab_size:,} tokens, the target has "
                   f"{target.vocab_tokens:,}")
    if shape.target.layers and shape.target.layers != target.block_count:
        out.append(f"it was made for a {shape.target.layers}-layer target, this one has {target.block_count}")
    return out


def head_gguf_problems(target_file: str | Path, head_file: str | Path) -> list[str]:
    """Why llama.cpp would not run the eagle3 GGUF `head_file` beside `target_file` (empty: it runs): the
    layers and width its header names against the target's, and the target's tokenizer."""
    head, target = read_info(head_file), read_info(target_file)
    header = header_values(head_file)
    said = header.get(f"{ARCH}.target_layers")
    layers = [int(i) for i in said] if isinstance(said, list) else []
    width = int(header.get(f"{ARCH}.target_hidden_size", 0) or 0)  # type: ignore[call-overload]
    out = []
    if len(layers) != LAYERS_READ:
        out.append(f"it names {len(layers)} target layers; draft-eagle3 takes exactly {LAYERS_READ}")
    outside = [i for i in layers if not 0 <= i <= target.block_count]
    if outside:
        out.append(f"layers {','.join(map(str, outside))} lie outside the target's {target.block_count}")
    if width != target.embedding_length:
        out.append(f"it reads width {width}, the target's is {target.embedding_length}")
    if (head.tokenizer_model, head.tokens_sha) != (target.tokenizer_model, target.tokens_sha):
        out.append("its tokenizer is not the target's")
    return out
