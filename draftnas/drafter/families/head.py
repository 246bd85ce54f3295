"""The head family: one decoder layer on the target's hidden states (EAGLE-3's layout, `drafter.head`),
written `head:FOLDER`. It drafts from the residual stream of a few target layers that each verify returns,
so it runs where the engine hands those over: draftnas's own loop, vLLM (`method: eagle3`) and llama.cpp
(`--spec-type draft-eagle3`, from the head's eagle3 GGUF: `export.head_gguf`). Its
acceptance is counted by running it in draftnas's loop beside the target (exact for greedy: the head is
deterministic given the target's hidden states)."""

from __future__ import annotations

from typing import Any

from draftnas.core.engine_kinds import LLAMA_CPP, STATIC, VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.drafter.families.table import DrafterFamily, DrafterSpec, register_family, short_name

PREFIX = "head:"


@register_family
class HeadFamily(DrafterFamily):
    name = "head"
    title = "hidden-state head"
    syntax = "head:FOLDER (a head folder, EAGLE-3 layout)"
    engines = (STATIC, VLLM, LLAMA_CPP)
    pricing = "counted by running it in draftnas's loop on the target's hidden states (exact for greedy)"

    def matches(self, text: str) -> bool:
        return text.startswith(PREFIX)

    def parse(self, text: str) -> DrafterSpec:
        folder = text[len(PREFIX):].strip()
        if not folder:
            raise InvalidInputError(f"{text!r}: name the head's folder after 'head:' "
                                    f"(allowed: {self.syntax})")
        return DrafterSpec(self.name, text, model=folder)

    def label(self, spec: DrafterSpec) -> str:
        return f"head {short_name(spec.model)}"

    def llama_server(self, spec: DrafterSpec, gamma: int, *, draft_file: str = "", threads: int = 1
                     ) -> list[str]:
        """The head's eagle3 GGUF at a fixed draft length (no confidence stop), as llama.cpp's EAGLE-3
        proposer runs it beside the target."""
        if not draft_file:
            raise InvalidInputError(f"{spec.text}: llama.cpp runs a head from its eagle3 GGUF "
                                    "(`draftnas distill export RUN OUT --gguf F16`)")
        return ["-md", draft_file, "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(gamma),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(threads)]

    def vllm(self, spec: DrafterSpec, gamma: int, *, draft_folder: str = "") -> dict[str, Any]:
        return {"method": "eagle3", "model": draft_folder or spec.model, "num_speculative_tokens": gamma}
