"""Files a user names, damaged or incomplete, and a misspelled weight format: one line naming what is wrong,
never a traceback from deep inside a reader."""

from __future__ import annotations

import json

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError
from tests.models.test_llama_cpp import tiny_qwen2


@pytest.fixture()
def tiny_gguf(tmp_path):
    from draftnas.models.gguf_file import gguf_of, write_gguf
    from draftnas.models.gguf_tensors import random_tensors

    shape = tiny_qwen2(vocab=151936)
    return write_gguf(tmp_path / "t.gguf", shape, random_tensors(shape), "Q8_0",
                      gguf_of("qwen2.5-coder-1.5b"),
                      "tiny")


def test_a_truncated_gguf_is_named_truncated(tiny_gguf, tmp_path):
    from draftnas.models.gguf_file import read_info

    assert read_info(tiny_gguf).block_count == 2
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])  # the tensors end early
    with pytest.raises(InvalidInputError, match="cut.gguf is a truncated GGUF file: its tensors need"):
        read_info(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:3000])  # the header itself ends early
    with pytest.raises(InvalidInputError, match="head.gguf is a truncated or damaged GGUF file"):
        read_info(head)


def test_a_damaged_file_is_not_called_a_broken_build(tmp_path):
    from draftnas.latency.llama_cpp import probe_flags
    from draftnas.models.llama_cpp import LlamaCpp

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x01")
    with pytest.raises(InvalidInputError, match="bad.gguf is a truncated or damaged GGUF file"):
        probe_flags(LlamaCpp(bin_dir=tmp_path, version="none"), bad, threads=2)


@pytest.mark.parametrize("weights", ["attn=int9,mlp=int8,head=int4",
                                     "attn=int8/int8/int8/int8/int4,mlp=int8,head=int4"])
def test_a_misspelled_per_layer_format_is_one_line(weights):
    from draftnas.bench.request_records import BenchOptions

    with pytest.raises(OptionError) as e:
        BenchOptions(draft_weights=weights).validate()
    said = e.value.for_flags()
    assert said.startswith(f"--draft-weights weight format {weights!r}: use one of dense, int8")


def test_an_accepts_file_with_missing_fields_is_one_line(tmp_path):
    from draftnas.acceptance.accepts import SCHEMA, read_accepts

    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"schema": SCHEMA, "traces": {"x": {"gamma": 3}}}))
    with pytest.raises(OptionError, match="is an accepts file with missing or malformed fields"):
        read_accepts(path)
