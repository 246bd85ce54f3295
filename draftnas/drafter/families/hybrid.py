"""The hybrid family: lookup first, a model drafter where lookup finds nothing (`fallback`) or the longer of
the two every step (`longer`; draftnas's loop only). Written `lookup:n=N,m=M+DRAFTER`, a bench record adds
` (POLICY)`. llama.cpp runs it as two spec types (the lookup type, then `draft-simple`); vLLM and
transformers run one proposer per request, so not there."""

from __future__ import annotations

from typing import Any

from draftnas.core.engine_kinds import LLAMA_CPP, STATIC
from draftnas.core.errors import InvalidInputError
from draftnas.drafter.families.table import DrafterFamily, DrafterSpec, register_family, short_name
from draftnas.drafter.lookup import is_lookup, parse_lookup, server_flags

POLICIES = ("fallback", "longer")


@register_family
class HybridFamily(DrafterFamily):
    name = "hybrid"
    title = "hybrid"
    syntax = "lookup:n=N,m=M+DRAFTER (DRAFTER a model drafter; a record may add ' (fallback|longer)')"
    engines = (STATIC, LLAMA_CPP)
    pricing = "exact replay of the lookup, teacher-forced estimate of the model where lookup finds nothing"

    def matches(self, text: str) -> bool:
        return is_lookup(text.partition("+")[0]) and "+" in text

    def parse(self, text: str) -> DrafterSpec:
        lookup_part, _, rest = text.partition("+")
        model, _, note = rest.strip().partition(" (")
        policy = note.rstrip(")").strip() or "fallback"
        if not model.strip():
            raise InvalidInputError(f"hybrid drafter {text!r} names no model after '+' "
                                    f"(allowed: {self.syntax})")
        if policy not in POLICIES:
            raise InvalidInputError(f"hybrid policy {policy!r} is unknown (allowed: {', '.join(POLICIES)})")
        return DrafterSpec(self.name, text, model=model.strip(), lookup=parse_lookup(lookup_part),
                           policy=policy)

    def label(self, spec: DrafterSpec) -> str:
        assert spec.lookup is not None
        return f"{spec.lookup.label} + {short_name(spec.model)}"

    def llama_server(self, spec: DrafterSpec, gamma: int, *, draft_file: str = "", threads: int = 1
                     ) -> list[str]:
        return server_flags(draft_file or spec.model, gamma, spec.lookup, threads)

    def vllm(self, spec: DrafterSpec, gamma: int, *, draft_folder: str = "") -> dict[str, Any]:
        raise InvalidInputError("vLLM runs one proposer per request: a hybrid does not run there")

    def transformers(self, spec: DrafterSpec, gamma: int) -> dict[str, Any]:
        raise InvalidInputError("transformers runs one candidate source per call: a hybrid does not run "
                                "there")
