"""The engines draftnas decodes in, declared once with what each can do. Stages ask an engine's
capabilities (`engine_kind(name).batched`, ...) instead of comparing its name; a flag's allowed engines
are derived from here.

- `static`: draftnas's decoder over a cache allocated once (CUDA graphs on a GPU), its own loop;
- `hf`: transformers' models over a growing cache, draftnas's loop around them (and transformers'
  assisted generation beside it in the bench);
- `llama.cpp`: the GGUF files in llama.cpp's own tools (llama-server, llama-bench), a separate program;
- `vllm`: vLLM (its CPU build on a CPU host), in a virtualenv of its own (its pins differ from draftnas's),
  driven as a separate process. `commands` says which draftnas commands run in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from draftnas.core.errors import InvalidInputError

STATIC, HF, LLAMA_CPP, VLLM = "static", "hf", "llama.cpp", "vllm"


@dataclass(frozen=True)
class EngineKind:
    name: str
    devices: tuple[str, ...]
    batched: bool  # runs B sequences at once (`bench --batch-size`, `search --batch`)
    sampling: bool  # decodes at temperature > 0 (else greedy only)
    own_loop: bool  # draftnas's loop: confidence stop, per-step accept counts, lookup and hybrid arms
    quantized_kernels: bool  # runs a drafter's int8/int4 weights with draftnas's kernels (else dense)
    drafter_file: str  # what it loads a drafter from: "folder" (HF/draftnas) or "gguf"
    decode_only: bool  # its tokens/s leave the prompt's prefill out (a server's timings)
    timing_mode: str  # how the latency profile times its steps: "static", "eager" or "" (its own tools)
    external: bool  # a separate program draftnas starts, not torch in this process
    commands: tuple[str, ...] = ("engines", "search", "bench")  # the draftnas commands that drive it
    space_suffix: str = ""  # its shipped search spaces are named <target><suffix> ("": draftnas's loops')

    def limits(self, device: str, temperature: float) -> str:
        """'' where it runs on `device` at `temperature`; else what it runs ("runs on cpu, greedy only")."""
        if device in self.devices and (temperature <= 0 or self.sampling):
            return ""
        return f"runs on {' or '.join(self.devices)}" + ("" if self.sampling else ", greedy only")

    def graph_mode(self, device: str) -> str:
        """The profile mode its steps are timed in on `device` (CUDA graphs for the static engine)."""
        return "cuda-graph" if self.timing_mode == STATIC and device == "cuda" else self.timing_mode


ENGINE_KINDS: dict[str, EngineKind] = {k.name: k for k in (
    EngineKind(STATIC, devices=("cpu", "cuda"), batched=True, sampling=True, own_loop=True,
               quantized_kernels=True, drafter_file="folder", decode_only=False, timing_mode="static",
               external=False),
    EngineKind(HF, devices=("cpu", "cuda"), batched=False, sampling=True, own_loop=True,
               quantized_kernels=False, drafter_file="folder", decode_only=False, timing_mode="eager",
               external=False),
    EngineKind(LLAMA_CPP, devices=("cpu",), batched=False, sampling=False, own_loop=False,
               quantized_kernels=False, drafter_file="gguf", decode_only=True, timing_mode="",
               external=True, space_suffix="-llama-cpp"),
    EngineKind(VLLM, devices=("cpu", "cuda"), batched=True, sampling=True, own_loop=False,
               quantized_kernels=False, drafter_file="folder", decode_only=False, timing_mode="",
               external=True, space_suffix="-vllm"),
)}


def engine_kind(name: str) -> EngineKind:
    """The declared engine `name`; one line naming the allowed ones otherwise."""
    kind = ENGINE_KINDS.get(name)
    if kind is None:
        raise InvalidInputError(f"engine {name!r} is not one draftnas drives (allowed: "
                                f"{', '.join(ENGINE_KINDS)})")
    return kind


def engine_names(where: Callable[[EngineKind], bool] = lambda kind: True) -> tuple[str, ...]:
    """The declared engines with a capability, in declaration order (a flag's allowed values)."""
    return tuple(k.name for k in ENGINE_KINDS.values() if where(k))


def engines_for(command: str) -> tuple[str, ...]:
    """The engines a command's --engine takes (`EngineKind.commands`)."""
    return engine_names(lambda kind: command in kind.commands)
