"""The llama.cpp bench's arms through the real llama-server, with tiny random GGUFs (the target's tokenizer),
where a llama.cpp build exists (`draftnas engines --build`); skipped otherwise."""

from __future__ import annotations

import pytest

from tests.models.test_llama_cpp import tiny_qwen2


def _build():
    from draftnas.models.llama_cpp import LlamaCppError, find_llama_cpp

    try:
        return find_llama_cpp(None)
    except LlamaCppError:
        pytest.skip("no llama.cpp build here (`draftnas engines --build`)")


def test_server_arms_decode_and_draft(tmp_path):
    from draftnas.bench.llama_cpp import LlamaArm, Server, _run
    from draftnas.bench.records import BenchOptions
    from draftnas.latency.llama_cpp import probe_flags
    from draftnas.models.gguf_file import gguf_of, write_gguf
    from draftnas.models.gguf_tensors import random_tensors

    tokenizer = gguf_of("qwen2.5-coder-1.5b")
    llama = probe_flags(_build(), tokenizer, threads=2)
    shape = tiny_qwen2(vocab=151936)  # the target's tokenizer's rows
    target = write_gguf(tmp_path / "t.gguf", shape, random_tensors(shape), "Q8_0", tokenizer, "tiny target")
    small = shape.with_shape(num_hidden_layers=1)
    draft = write_gguf(tmp_path / "d.gguf", small, random_tensors(small), "Q4_0", tokenizer, "tiny drafter")
    options = BenchOptions(max_new_tokens=12)
    with (
        Server(llama, LlamaArm("target", target), 2, 256) as alone,
        Server(llama, LlamaArm("draftnas", target, draft, 3, "d.gguf"), 2, 256) as spec,
    ):
        plain, plain_tokens = _run(alone, [151644, 872, 198], options)
        drafted, tokens = _run(spec, [151644, 872, 198], options)
    assert plain.new_tokens == len(plain_tokens) > 0 and plain.seconds > 0 and plain.drafted == 0
    assert drafted.drafted > 0 and 0 <= drafted.accepted <= drafted.drafted
    assert drafted.steps == max(drafted.new_tokens - drafted.accepted, 1)
