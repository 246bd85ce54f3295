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
    from draftnas.bench.llama_cpp import LlamaArm, _run, arm_server
    from draftnas.bench.request_records import BenchOptions
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
        arm_server(llama, LlamaArm("target", target), 2, 256) as alone,
        arm_server(llama, spec_arm := LlamaArm("draftnas", target, draft, 3, "d.gguf"), 2, 256) as spec,
    ):
        plain, plain_tokens = _run(alone, LlamaArm("target", target), [151644, 872, 198], options)
        drafted, tokens = _run(spec, spec_arm, [151644, 872, 198], options)
    assert plain.new_tokens == len(plain_tokens) > 0 and plain.seconds > 0 and plain.drafted == 0
    assert plain.prompt_seconds > 0 and drafted.prompt_seconds > 0  # the prefill, kept apart from decode
    assert drafted.drafted > 0 and 0 <= drafted.accepted <= drafted.drafted
    assert drafted.steps == max(drafted.new_tokens - drafted.accepted, 1)


def test_llama_cpp_lookup_drafts_exactly_what_the_replay_says(tmp_path):
    """ngram-simple in llama-server drafts and accepts, step for step in total, what `replay_lookup` computes
    over the plain answer, and its answer is the plain one; a hybrid with a drafter file stays lossless."""
    from draftnas.bench.llama_cpp import LlamaArm, _run, arm_of, arm_server
    from draftnas.bench.request_records import BenchOptions
    from draftnas.drafter.lookup import LookupSettings, replay_lookup
    from draftnas.latency.llama_cpp import probe_flags
    from draftnas.models.gguf_file import gguf_of, write_gguf
    from draftnas.models.gguf_tensors import random_tensors

    tokenizer = gguf_of("qwen2.5-coder-1.5b")
    llama = probe_flags(_build(), tokenizer, threads=2)
    shape = tiny_qwen2(vocab=151936)
    target = write_gguf(tmp_path / "t.gguf", shape, random_tensors(shape), "Q8_0", tokenizer, "tiny target")
    small = shape.with_shape(num_hidden_layers=1)
    draft = write_gguf(tmp_path / "d.gguf", small, random_tensors(small), "Q8_0", tokenizer, "tiny drafter")
    settings = LookupSettings(n=2, m=4)
    prompt = [151644, 872, 198, *([40, 41, 42, 43, 44, 45] * 4)]
    options = BenchOptions(max_new_tokens=40)
    plain_arm, look_arm = LlamaArm("target", target), arm_of("lookup", target, settings.label, 4)
    hybrid_arm = arm_of("hybrid", target, f"{settings.label}+{draft}", 3)
    assert hybrid_arm.draft == draft and hybrid_arm.lookup == settings
    with (
        arm_server(llama, plain_arm, 2, 256) as alone,
        arm_server(llama, look_arm, 2, 256) as look,
        arm_server(llama, hybrid_arm, 2, 256) as hybrid,
    ):
        _, plain_tokens = _run(alone, plain_arm, prompt, options)
        looked, tokens = _run(look, look_arm, prompt, options)
        _, hybrid_tokens = _run(hybrid, hybrid_arm, prompt, options)
    replay = replay_lookup(prompt, plain_tokens, settings.n, settings.m)
    assert tokens == plain_tokens == hybrid_tokens
    assert sum(replay.drafted) > 0  # the test exercises drafting
    assert (looked.drafted, looked.accepted) == (sum(replay.drafted), sum(replay.accepted))


def test_the_plain_route_says_which_is_faster_and_is_absent_without_a_build(tmp_path):
    """The embedded target's Q4_K_M file timed alone (a few seconds of llama-bench) beside a pick."""
    from draftnas.search.llama_cpp import plain_route

    assert plain_route("qwen2.5-coder-1.5b", "pick", 5.0, build=str(tmp_path / "no-build")) is None
    _build()
    slow = plain_route("qwen2.5-coder-1.5b", "the pick", 0.01, threads=2)
    assert slow is not None and slow.faster and slow.tokens_per_s > 0.01
    assert "run the target in llama.cpp" in slow.line() and ".gguf alone at" in slow.line()
    fast = slow.__class__(**(slow.to_dict() | {"pick_tokens_per_s": 1e9}))
    assert not fast.faster and fast.line().startswith("the pick (")
