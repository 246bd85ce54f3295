"""A drafter as a GGUF file llama.cpp loads (`export --format gguf --quant TYPE`, and a llama.cpp search's
`--export`): its matrices in TYPE, the target's tokenizer, beside the Hugging Face folder.

Q8_0, Q4_0, F16, BF16 and F32 are written directly (`models.gguf_file`; the bytes the search rounded
acceptance with); any other llama.cpp type (Q4_K_M, Q6_K, ...) is written as F16 and converted by the
build's stock `llama-quantize`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from draftnas.core.errors import ExportError
from draftnas.core.registry import Architecture
from draftnas.models.ggml_quants import WRITTEN
from draftnas.models.gguf_file import check_drafter_gguf, gguf_of, write_gguf
from draftnas.models.gguf_tensors import model_tensors
from draftnas.models.llama_cpp import check_quant, find_llama_cpp

log = logging.getLogger(__name__)


def check_gguf_export(quant: str, target: str, reduced_head_rows: int, build: str | None) -> str:
    """Before any work: the quant type's canonical name, the target's GGUF (its tokenizer) and a full
    head; a type draftnas does not write needs a llama.cpp build. One line otherwise."""
    name = check_quant(quant)
    if reduced_head_rows:
        raise ExportError(
            f"this drafter has a reduced draft head ({reduced_head_rows} rows); llama.cpp loads "
            "only drafters with the target's full vocabulary: search with --engine llama.cpp "
            "(full heads only) or export a plan without a reduced head"
        )
    gguf_of(target)
    if name not in WRITTEN:
        find_llama_cpp(build)
    return name


def gguf_path(out_dir: str | Path, name: str, quant: str) -> Path:
    """OUT/<name>.gguf when the drafter's name already says its type (a trial searched in it), else
    OUT/<name>-<quant>.gguf."""
    return Path(out_dir) / (f"{name}.gguf" if name.endswith(f"-{quant}") else f"{name}-{quant}.gguf")


def export_gguf(
    model: Any, target: str, out_dir: str | Path, name: str, quant: str, build: str | None = None
) -> Path:
    """Write `model` (a transformers decoder) as `out_dir/<name>-<quant>.gguf` with `target`'s tokenizer,
    then check llama.cpp would take it as `target`'s drafter."""
    target_file = gguf_of(target)
    arch = Architecture.from_hf_config(model.config, name=name)
    path = gguf_path(out_dir, name, quant)
    direct = quant if quant in WRITTEN else "F16"
    written = write_gguf(
        path if direct == quant else path.with_name(path.stem + "-F16.gguf"),
        arch,
        model_tensors(model),
        direct,
        target_file,
        name,
    )
    if direct != quant:
        llama = find_llama_cpp(build)
        part = path.with_name(path.name + ".part")
        llama.run("llama-quantize", [str(written), str(part), quant])
        part.replace(path)
        written.unlink()
    check_drafter_gguf(target_file, path)
    log.info("wrote %s (%s) for %s", path, quant, target)
    return path
