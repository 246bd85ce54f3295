"""The model-drafter family: a causal LM sharing the target's tokenizer (a folder, a .gguf file or an
embedded name), drafting γ tokens a step. Its acceptance is estimated by teacher forcing on the target's
traces (exact for greedy decoding, `acceptance.estimate`)."""

from __future__ import annotations

from typing import Any

from draftnas.core.engine_kinds import HF, LLAMA_CPP, STATIC, VLLM
from draftnas.drafter.families.table import DrafterFamily, DrafterSpec, register_family, short_name
from draftnas.drafter.lookup import server_flags


@register_family
class ModelFamily(DrafterFamily):
    name = "model"
    title = "model drafter"
    syntax = "a model folder, a .gguf file or an embedded name (draftnas targets)"
    engines = (STATIC, HF, LLAMA_CPP, VLLM)
    pricing = "teacher-forced estimate on the target's traces (exact for greedy)"
    catch_all = True

    def matches(self, text: str) -> bool:
        return True

    def parse(self, text: str) -> DrafterSpec:
        return DrafterSpec(self.name, text, model=text)

    def label(self, spec: DrafterSpec) -> str:
        return short_name(spec.model)

    def llama_server(self, spec: DrafterSpec, gamma: int, *, draft_file: str = "", threads: int = 1
                     ) -> list[str]:
        """The drafter file at a fixed draft length (no confidence stop)."""
        return server_flags(draft_file or spec.model, gamma, None, threads)

    def vllm(self, spec: DrafterSpec, gamma: int, *, draft_folder: str = "") -> dict[str, Any]:
        return {"method": "draft_model", "model": draft_folder or spec.model, "num_speculative_tokens": gamma}

    def transformers(self, spec: DrafterSpec, gamma: int) -> dict[str, Any]:
        """Assisted generation at a constant draft length (the drafter's generation config may say the
        same; these keywords make it explicit)."""
        return {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
