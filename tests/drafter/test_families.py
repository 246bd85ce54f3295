"""Drafter families declared once: a spec is read by the family that claims it, each family's settings per
engine are what that engine takes, an engine that does not run a family says so, and no stage outside the
table parses a spec string to learn its family."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from draftnas.core.engine_kinds import ENGINE_KINDS, HF, LLAMA_CPP, STATIC, VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.drafter.families import (
    FAMILIES,
    NOT_RUN,
    DrafterFamily,
    DrafterSpec,
    parse_drafter,
    register_family,
)
from draftnas.drafter.lookup import LookupSettings

PACKAGE = Path(__file__).resolve().parents[2] / "draftnas"


@pytest.mark.parametrize(("text", "family", "model", "lookup", "policy"), [
    ("qwen2.5-coder-0.5b", "model", "qwen2.5-coder-0.5b", None, ""),
    ("/tmp/x/drafter/", "model", "/tmp/x/drafter/", None, ""),
    ("lookup", "lookup", "", LookupSettings(), ""),
    ("lookup:n=4,m=8", "lookup", "", LookupSettings(n=4, m=8), ""),
    ("lookup:ngram-mod,n=8,m=32", "lookup", "", LookupSettings(n=8, m=32, kind="ngram-mod"), ""),
    ("lookup:n=4,m=8+out/drafter", "hybrid", "out/drafter", LookupSettings(n=4, m=8), "fallback"),
    ("lookup:n=4,m=8+out/drafter (longer)", "hybrid", "out/drafter", LookupSettings(n=4, m=8), "longer"),
])
def test_a_spec_is_read_once_by_the_family_that_claims_it(text, family, model, lookup, policy):
    spec = parse_drafter(text)
    assert (spec.family, spec.model, spec.lookup, spec.policy) == (family, model, lookup, policy)
    assert DrafterSpec.from_dict(spec.to_dict()) == spec  # a record, stored as it is


def test_labels_name_what_runs():
    assert parse_drafter("out/run/drafter/").label == "drafter"
    assert parse_drafter("lookup:n=4,m=8").label == "lookup:n=4,m=8"
    assert parse_drafter("lookup:n=4,m=8+out/drafter (longer)").label == "lookup:n=4,m=8 + drafter"


def test_each_family_gives_each_engine_its_own_settings():
    model, lookup = parse_drafter("out/drafter"), parse_drafter("lookup:n=3,m=5")
    assert model.settings(VLLM, 4, draft_folder="/f") == {
        "method": "draft_model", "model": "/f", "num_speculative_tokens": 4}
    assert lookup.settings(VLLM, 0) == {"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 3,
                                        "num_speculative_tokens": 5}
    flags = model.settings(LLAMA_CPP, 4, draft_file="d.gguf", threads=2)
    assert flags[:4] == ["-md", "d.gguf", "--spec-type", "draft-simple"] and "--spec-draft-n-max" in flags
    assert flags[flags.index("--spec-draft-n-max") + 1] == "4"
    assert lookup.settings(LLAMA_CPP, 0)[:2] == ["--spec-type", "ngram-simple"]
    assert lookup.settings(HF, 0) == {"prompt_lookup_num_tokens": 5, "max_matching_ngram_size": 3}
    assert model.settings(HF, 6)["num_assistant_tokens"] == 6
    assert model.settings(STATIC, 6) == model  # draftnas's loop runs the spec itself


def test_an_engine_that_does_not_run_a_family_says_so():
    hybrid = parse_drafter("lookup:n=4,m=8+out/drafter")
    assert hybrid.settings(VLLM, 3) is NOT_RUN and hybrid.settings(HF, 3) is NOT_RUN
    assert hybrid.settings(LLAMA_CPP, 3, draft_file="d.gguf")[:4] == ["-md", "d.gguf", "--spec-type",
                                                                       "ngram-simple,draft-simple"]
    for family in FAMILIES.values():
        assert set(family.engines) <= set(ENGINE_KINDS) and family.pricing and family.syntax


@pytest.mark.parametrize(("text", "message"), [
    ("", "a drafter spec is empty"),
    ("lookup:n=99,m=4", "lookup setting n=99 is out of range"),
    ("lookup:n=4,m=8+", "names no model after '+'"),
    ("lookup:n=4,m=8+d (both)", "hybrid policy 'both' is unknown"),
])
def test_a_bad_spec_is_one_line_naming_what_is_wrong(text, message):
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        parse_drafter(text)


def test_a_new_family_is_one_registered_class():
    @register_family
    class Echo(DrafterFamily):
        name, title, syntax, engines, pricing = "echo", "echo", "echo:WORD", (STATIC,), "none"

        def matches(self, text):
            return text.startswith("echo:")

        def parse(self, text):
            return DrafterSpec(self.name, text, model=text[5:])

        def label(self, spec):
            return spec.model

    try:
        spec = parse_drafter("echo:hi")
        assert (spec.family, spec.label) == ("echo", "hi")
        assert spec.settings(VLLM, 3) is NOT_RUN
        assert parse_drafter("lookup:n=4,m=8").family == "lookup"  # the others still claim their own
    finally:
        FAMILIES.pop("echo")


def test_no_stage_outside_the_table_parses_a_spec_string_for_its_family():
    """Only the family table (and lookup's own parser) read a spec's text for its family: an `is_lookup`
    call or a `lookup:` test on a spec anywhere else fails here."""
    allowed = {PACKAGE / "drafter" / "lookup.py"} | set((PACKAGE / "drafter" / "families").glob("*.py"))
    pattern = re.compile(r"is_lookup\(|\"lookup:\" (not )?in |startswith\(\"lookup")
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py") if p not in allowed
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"spec strings parsed outside the family table: {found}"
