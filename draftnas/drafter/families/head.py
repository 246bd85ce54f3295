"""The head family: one decoder layer on the target's hidden states (EAGLE-3's layout, `drafter.head`),
written `head:FOLDER`. It drafts from the residual stream of a few target layers that each verify returns,
so it runs where the engine hands those over: draftnas's own loop and vLLM (`method: eagle3`). Its
acceptance is counted by running it in draftnas's loop beside the target (exact for greedy: the head is
deterministic given the target's hidden states)."""

from __future__ import annotations

from typing import Any

from draftnas.core.engine_kinds import STATIC, VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.drafter.families.table import DrafterFamily, DrafterSpec, register_family, short_name

PREFIX = "head:"


@register_family
class HeadFamily(DrafterFamily):
    name = "head"
    title = "hidden-state head"
    syntax = "head:FOLDER (a head folder, EAGLE-3 layout)"
    engines = (STATIC, VLLM)
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

    def vllm(self, spec: DrafterSpec, gamma: int, *, draft_folder: str = "") -> dict[str, Any]:
        return {"method": "eagle3", "model": draft_folder or spec.model, "num_speculative_tokens": gamma}
