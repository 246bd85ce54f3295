"""The engines are declared once: flags, checks and dispatch read the declaration, never a name literal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from draftnas.bench.request_records import BenchOptions
from draftnas.core.engine_kinds import (
    ENGINE_KINDS,
    HF,
    LLAMA_CPP,
    STATIC,
    VLLM,
    engine_kind,
    engine_names,
    engines_for,
)
from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError, spec_of

PACKAGE = Path(__file__).resolve().parents[2] / "draftnas"
LITERAL = re.compile(r"""((==|!=)\s*|\bin\s+\((\w+,\s*)*)["'](static|hf|llama\.cpp)["']""")


def test_no_module_compares_an_engine_with_a_name_literal():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "engines.py" and path.parent.name == "core":
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if "engine" in code and LITERAL.search(code):
                hits.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not hits, "compare with draftnas.core.engine_kinds' constants or capabilities:\n" + "\n".join(hits)


def test_each_engine_declares_what_it_can_do():
    assert engine_names() == (STATIC, HF, LLAMA_CPP, VLLM)
    assert engine_names(lambda k: k.batched) == (STATIC, VLLM)
    assert engine_names(lambda k: k.own_loop) == (STATIC, HF)
    assert engine_kind(LLAMA_CPP).drafter_file == "gguf" and engine_kind(LLAMA_CPP).decode_only
    assert engine_kind(STATIC).graph_mode("cuda") == "cuda-graph"
    assert engine_kind(STATIC).graph_mode("cpu") == "static" and engine_kind(HF).graph_mode("cuda") == "eager"
    assert engine_kind(LLAMA_CPP).limits("cuda", 0.0) == "runs on cpu, greedy only"
    assert engine_kind(LLAMA_CPP).limits("cpu", 0.7) == "runs on cpu, greedy only"
    assert engine_kind(LLAMA_CPP).limits("cpu", 0.0) == ""
    assert engine_kind(VLLM).external and engine_kind(VLLM).devices == ("cpu", "cuda")
    with pytest.raises(InvalidInputError, match="engine 'sglang' is not one draftnas drives"):
        engine_kind("sglang")


def test_the_bench_flag_allows_the_declared_engines_and_checks_their_capabilities():
    field = next(f for f in BenchOptions.__dataclass_fields__.values() if f.name == "engine")
    assert spec_of(field).choices == engines_for("bench") == tuple(ENGINE_KINDS)
    assert engines_for("search") == (STATIC, HF, LLAMA_CPP, VLLM)
    cases = ((BenchOptions(engine=LLAMA_CPP, device="cuda"), "--engine llama.cpp runs on cpu, greedy only"),
             (BenchOptions(engine=HF, batch_sizes=(1, 2)), "runs in the static engine: drop --engine hf"),
             (BenchOptions(engine="sglang"), "--engine must be one of static, hf, llama.cpp, vllm"))
    for options, said in cases:
        with pytest.raises(OptionError) as caught:
            options.validate()
        assert said in caught.value.for_flags()
    assert BenchOptions(engine=LLAMA_CPP).kind.external and BenchOptions(device="cuda").kind.name == STATIC
