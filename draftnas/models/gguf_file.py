"""GGUF drafters: written with the `gguf` package from a model's tensors (or random weights of a shape,
for timing), the tokenizer copied from the target's GGUF, read back for checks.

llama.cpp loads a drafter only if its vocabulary matches the target's: the same tokenizer model,
BOS and EOS, the same token texts, and vocabulary sizes within 128 (`vocab_problems`, the check
llama.cpp's `common_speculative_are_compatible` makes, in one line before any engine runs).
Only full-vocabulary drafters qualify; a reduced draft head is refused here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.core.registry import Architecture
from draftnas.models.ggml_quants import BLOCK_BYTES, WRITTEN, quantize
from draftnas.models.gguf_tensors import gguf_name, rotary_rows
from draftnas.models.records import EMBEDDED
from draftnas.models.sources import locate_embedded_gguf, resolve_source

#: the families whose GGUF layout draftnas writes (llama.cpp's architecture names). LLaMA's q and k rows
#: are reordered for llama.cpp's rotary layout (`rotary_rows`); Qwen2's are used as they are
GGUF_ARCH = {"qwen2": "qwen2", "llama": "llama"}
VOCAB_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file says about itself (what the checks and tests read)."""

    path: str
    architecture: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    vocab_tokens: int
    tokenizer_model: str
    bos: int | None
    eos: int | None
    tokens_sha: str
    tensor_types: dict[str, str]
    tensor_shapes: dict[str, tuple[int, ...]]
    name: str = ""


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass(frozen=True)
class _Header:
    """A GGUF file's key-values (key -> (type, array item type or None, value)) and tensor table
    (name -> (ggml type name, shape in PyTorch order))."""

    kv: dict[str, tuple[int, int | None, object]]
    tensors: dict[str, tuple[str, tuple[int, ...]]]

    def get(self, key: str, default: object = None) -> object:
        return self.kv[key][2] if key in self.kv else default


@functools.lru_cache(maxsize=8)
def _header_cached(path: str, size: int, mtime: float) -> _Header:
    with open(path, "rb") as f:
        data = f.read(64 << 20) if size > (64 << 20) else f.read()
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def text() -> str:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n : pos].decode("utf-8", errors="replace")

    def value(kind: int) -> object:
        nonlocal pos
        if kind == 8:
            return text()
        if kind == 9:
            sub, n = take("<I"), take("<Q")
            if sub == 8:
                return [text() for _ in range(n)]
            fmt = _SCALARS[sub]
            size_one = struct.calcsize(fmt)
            items = np.frombuffer(data, dtype=np.dtype(fmt), count=n, offset=pos).tolist()
            pos += n * size_one
            return items
        return take(_SCALARS[kind])

    if data[:4] != b"GGUF":
        raise InvalidInputError(f"{path} is not a GGUF file")
    try:
        pos = 4
        take("<I")
        n_tensors, n_kv = take("<Q"), take("<Q")
        kv: dict[str, tuple[int, int | None, object]] = {}
        for _ in range(n_kv):
            key = text()
            kind = take("<I")
            sub = struct.unpack_from("<I", data, pos)[0] if kind == 9 else None
            kv[key] = (kind, sub, value(kind))
        tensors, end = {}, 0
        for _ in range(n_tensors):
            name = text()
            dims = [take("<Q") for _ in range(take("<I"))]
            kind = take("<I")
            offset = take("<Q")
            qtype = gguf.GGMLQuantizationType(kind)
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            end = max(end, offset + math.prod(dims) // block * nbytes)
            tensors[name] = (qtype.name, tuple(reversed(dims)))
    except (struct.error, ValueError, KeyError, IndexError, MemoryError) as e:
        raise InvalidInputError(f"{path} is a truncated or damaged GGUF file (its header ends early: {e})"
                                ) from e
    align = int(kv["general.alignment"][2]) if "general.alignment" in kv else 32  # type: ignore[call-overload]
    if -(-pos // align) * align + end > size:
        raise InvalidInputError(f"{path} is a truncated GGUF file: its tensors need "
                                f"{-(-pos // align) * align + end:,} bytes, the file holds {size:,}")
    return _Header(kv=kv, tensors=tensors)


def _header(path: str | Path) -> _Header:
    stat = Path(path).stat()
    return _header_cached(str(Path(path).resolve()), stat.st_size, stat.st_mtime)


def header_values(path: str | Path) -> dict[str, object]:
    """A GGUF's key-values, key -> value."""
    return {k: v[2] for k, v in _header(path).kv.items()}


def read_info(path: str | Path) -> GgufInfo:
    h = _header(path)
    arch = str(h.get("general.architecture", ""))
    tokens = h.get("tokenizer.ggml.tokens", []) or []
    assert isinstance(tokens, list)

    def num(key: str) -> int:
        return int(h.get(f"{arch}.{key}", 0))  # type: ignore[call-overload]

    return GgufInfo(
        path=str(path),
        architecture=arch,
        name=str(h.get("general.name", "")),
        block_count=num("block_count"),
        embedding_length=num("embedding_length"),
        feed_forward_length=num("feed_forward_length"),
        head_count=num("attention.head_count"),
        head_count_kv=num("attention.head_count_kv"),
        vocab_tokens=len(tokens),
        tokenizer_model=str(h.get("tokenizer.ggml.model", "")),
        bos=_maybe_int(h.get("tokenizer.ggml.bos_token_id")),
        eos=_maybe_int(h.get("tokenizer.ggml.eos_token_id")),
        tokens_sha=hashlib.sha256("\n".join(map(str, tokens)).encode()).hexdigest()[:16],
        tensor_types={k: v[0] for k, v in h.tensors.items()},
        tensor_shapes={k: v[1] for k, v in h.tensors.items()},
    )


def _maybe_int(v: object) -> int | None:
    return None if v is None else int(v)  # type: ignore[call-overload]


def vocab_problems(target: GgufInfo, draft: GgufInfo) -> list[str]:
    """Why llama.cpp would refuse `draft` as a drafter for `target` (empty: it loads)."""
    out = []
    if draft.tokenizer_model != target.tokenizer_model:
        out.append(f"tokenizer {draft.tokenizer_model!r} is not the target's {target.tokenizer_model!r}")
    if (draft.bos, draft.eos) != (target.bos, target.eos):
        out.append(f"BOS/EOS {draft.bos}/{draft.eos} are not the target's {target.bos}/{target.eos}")
    if abs(draft.vocab_tokens - target.vocab_tokens) > VOCAB_SLACK:
        out.append(
            f"{draft.vocab_tokens} tokens against the target's {target.vocab_tokens} (llama.cpp allows a "
            f"difference of {VOCAB_SLACK})"
        )
    elif draft.tokens_sha != target.tokens_sha:
        out.append("its token texts differ from the target's")
    rows = draft.tensor_shapes.get("output.weight", draft.tensor_shapes.get("token_embd.weight", (0,)))[0]
    if abs(rows - target.vocab_tokens) > VOCAB_SLACK:
        out.append(f"its head has {rows} rows against the target's {target.vocab_tokens} tokens")
    return out


def tokenizer_digest(path: str | Path) -> str:
    """sha256 (first 16 hex digits) of every `tokenizer.ggml.*` key a GGUF file holds: its token texts,
    merges, token types, special ids and tokenizer model. Two files with one digest map text to the same
    ids, read from their headers alone (no tokenizer built, no weights converted)."""
    h = _header(path)
    keys = sorted(k for k in h.kv if k.startswith("tokenizer.ggml."))
    payload = json.dumps([(k, h.kv[k][2]) for k in keys], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def check_drafter_gguf(target: str | Path, draft: str | Path) -> None:
    """One line, before any engine runs, when llama.cpp would not take `draft` for `target`."""
    problems = vocab_problems(read_info(target), read_info(draft))
    if problems:
        raise InvalidInputError(
            f"drafter {draft} cannot draft for {target} in llama.cpp: " + "; ".join(problems)
        )


def _metadata(
    writer: gguf.GGUFWriter,
    arch: Architecture,
    name: str,
    tokenizer_from: Path,
    rope_theta: float,
    rms_eps: float,
    context_length: int,
) -> None:
    a = GGUF_ARCH[arch.family]
    writer.add_name(name)
    writer.add_uint32(f"{a}.block_count", arch.num_hidden_layers)
    writer.add_uint32(f"{a}.context_length", context_length)
    writer.add_uint32(f"{a}.embedding_length", arch.hidden_size)
    writer.add_uint32(f"{a}.feed_forward_length", arch.intermediate_size)
    writer.add_uint32(f"{a}.attention.head_count", arch.num_attention_heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", arch.num_key_value_heads)
    writer.add_float32(f"{a}.rope.freq_base", rope_theta)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", rms_eps)
    copy_tokenizer(writer, tokenizer_from)


def copy_tokenizer(writer: gguf.GGUFWriter, tokenizer_from: Path) -> None:
    """Every `tokenizer.*` key of the GGUF `tokenizer_from`, written as it is there."""
    for key, (kind, sub, value) in _header(tokenizer_from).kv.items():
        if key.startswith("tokenizer."):
            writer.add_key_value(
                key,
                value,
                gguf.GGUFValueType(kind),
                sub_type=None if sub is None else gguf.GGUFValueType(sub),
            )


def source_settings(tokenizer_from: Path) -> tuple[float, float, int]:
    """(rope theta, RMS norm epsilon, context length) of the GGUF the tokenizer comes from."""
    h = _header(tokenizer_from)
    arch = h.get("general.architecture")

    def num(key: str, default: float) -> float:
        return float(h.get(f"{arch}.{key}", default))  # type: ignore[arg-type]

    return (
        num("rope.freq_base", 10000.0),
        num("attention.layer_norm_rms_epsilon", 1e-6),
        int(num("context_length", 4096)),
    )


def write_gguf(
    path: Path,
    arch: Architecture,
    tensors: Iterable[tuple[str, torch.Tensor]],
    quant: str,
    tokenizer_from: Path,
    name: str,
    settings: tuple[float, float, int] | None = None,
) -> Path:
    """Write a GGUF of `arch` from Hugging Face-named `tensors` (matrices in `quant`: one of
    `ggml_quants.WRITTEN`; vectors in F32), the tokenizer copied from `tokenizer_from` (the target's
    GGUF). Atomic: a `.part` file renamed at the end."""
    if arch.family not in GGUF_ARCH:
        raise InvalidInputError(
            f"GGUF export writes {', '.join(GGUF_ARCH)} models; {arch.name} is {arch.family}"
        )
    if quant not in WRITTEN:
        raise InvalidInputError(
            f"GGUF written directly in {', '.join(WRITTEN)}; {quant} goes through llama-quantize"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(str(part), GGUF_ARCH[arch.family])
    _metadata(writer, arch, name, tokenizer_from, *(settings or source_settings(tokenizer_from)))
    writer.add_file_type(file_type(quant))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for hf_name, t in tensors:
        out = gguf_name(hf_name)
        if out is None:
            continue
        if arch.family == "llama":
            t = rotary_rows(hf_name, t, arch)
        add_weight(writer, out, t, quant)
    return finish(writer, part, path)


def add_weight(writer: gguf.GGUFWriter, name: str, t: torch.Tensor, quant: str) -> None:
    """One tensor into `writer`: a matrix whose rows split into 32-wide blocks in `quant`, anything else
    (vectors, narrow matrices) in F32."""
    if t.dim() == 2 and t.shape[1] % 32 == 0:
        qtype = getattr(gguf.GGMLQuantizationType, quant)
        writer.add_tensor(name, quantize(t, quant),
                          raw_dtype=qtype if quant in BLOCK_BYTES or quant == "BF16" else None)
    else:
        writer.add_tensor(name, t.detach().to(torch.float32).contiguous().numpy())


def finish(writer: gguf.GGUFWriter, part: Path, path: Path) -> Path:
    """The file `writer` fills at `part` written out and renamed to `path` (nothing half-written there)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.replace(path)
    return path


def file_type(quant: str) -> int:
    """`general.file_type` of a file whose matrices are in `quant`."""
    return int(getattr(gguf.LlamaFileType, f"MOSTLY_{quant}" if quant != "F32" else "ALL_F32"))


def engine_target(spec: str, given: str | None) -> Path:
    """The target's GGUF llama.cpp runs: `given` (--target-gguf: another quantization of the target, e.g.
    a Q8_0 made with llama-quantize), checked to have the target's shape and tokenizer; else its own."""
    own = gguf_of(spec)
    if given is None:
        return own
    path = Path(given).expanduser()
    if not path.is_file() or path.suffix != ".gguf":
        raise option_error("target_gguf", f"{given}: not a .gguf file")
    mine, theirs = read_info(own), read_info(path)
    shape = ("architecture", "block_count", "embedding_length", "feed_forward_length", "head_count")
    differs = [f"{k} {getattr(theirs, k)} (target: {getattr(mine, k)})" for k in shape
               if getattr(theirs, k) != getattr(mine, k)]
    differs += vocab_problems(mine, theirs)
    if differs:
        raise option_error("target_gguf", f"{given} is not a quantization of {spec}: " + "; ".join(differs))
    return path.resolve()


def gguf_of(spec: str) -> Path:
    """The GGUF file a model spec runs from in llama.cpp: a .gguf path, or an embedded model's file."""
    source = resolve_source(spec)
    if source.kind == "gguf":
        return Path(source.location)
    if source.kind == "embedded":
        return locate_embedded_gguf(EMBEDDED[source.location])
    raise InvalidInputError(
        f"{spec} has no GGUF file; llama.cpp runs GGUF files (give a .gguf path, or export "
        "one with `draftnas export --format gguf`)"
    )
