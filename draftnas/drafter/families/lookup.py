"""The lookup family: drafts copied from where the last n tokens occurred before (`drafter.lookup`). No
weights; its acceptance on the target's greedy output is replayed exactly by the rule draftnas's loop and
llama.cpp's `ngram-simple` share. vLLM's `ngram` proposer matches n-grams of `prompt_lookup_min` to
`prompt_lookup_max` tokens with its own rule, so there its acceptance is measured, not replayed."""

from __future__ import annotations

from typing import Any

from draftnas.core.engine_kinds import HF, LLAMA_CPP, STATIC, VLLM
from draftnas.drafter.families.table import DrafterFamily, DrafterSpec, register_family
from draftnas.drafter.lookup import is_lookup, parse_lookup


@register_family
class LookupFamily(DrafterFamily):
    name = "lookup"
    title = "lookup"
    syntax = "lookup, lookup:n=N,m=M or lookup:KIND,n=N,m=M (KIND a llama.cpp ngram type)"
    engines = (STATIC, HF, LLAMA_CPP, VLLM)
    pricing = "exact replay on the target's greedy output (draftnas's loop, llama.cpp ngram-simple)"
    drafts_gamma = False  # it drafts up to m tokens of what it matched

    def matches(self, text: str) -> bool:
        return is_lookup(text) and "+" not in text

    def parse(self, text: str) -> DrafterSpec:
        settings = parse_lookup(text)
        return DrafterSpec(self.name, text, lookup=settings)

    def label(self, spec: DrafterSpec) -> str:
        assert spec.lookup is not None
        return spec.lookup.label

    def llama_server(self, spec: DrafterSpec, gamma: int, *, draft_file: str = "", threads: int = 1
                     ) -> list[str]:
        assert spec.lookup is not None
        return spec.lookup.llama_cpp_flags()

    def vllm(self, spec: DrafterSpec, gamma: int, *, draft_folder: str = "") -> dict[str, Any]:
        """vLLM's n-gram proposer at exactly n tokens of match, drafting m."""
        assert spec.lookup is not None
        n = spec.lookup.n
        return {"method": "ngram", "prompt_lookup_min": n, "prompt_lookup_max": n,
                "num_speculative_tokens": spec.lookup.m}

    def transformers(self, spec: DrafterSpec, gamma: int) -> dict[str, Any]:
        assert spec.lookup is not None
        return dict(spec.lookup.transformers_kwargs())
