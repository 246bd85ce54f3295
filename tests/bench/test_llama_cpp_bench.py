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


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_head_drafts_in_llama_cpp_exactly_what_it_drafts_in_draftnas(family, tmp_path):
    """A head exported as its eagle3 GGUF runs in llama-server's draft-eagle3 beside an F32 target, and
    llama.cpp's drafted and accepted counts equal draftnas's loop's over the same prompt, its answer the
    target's: the two read the same layers' inputs, rows and rotary order. A Qwen2 target needs the build's
    layer-input patch. The target's head keeps 4 rows so a random head's drafts sometimes match."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from draftnas.bench.llama_cpp import LlamaArm, _run, arm_of, arm_server, check_arm_files, check_head_build
    from draftnas.bench.request_records import BenchOptions
    from draftnas.core.registry import Architecture
    from draftnas.drafter.head.build import head_proposer, new_head
    from draftnas.drafter.head.folder import write_head
    from draftnas.drafter.head.shape import head_shape
    from draftnas.export.head_gguf import write_head_gguf
    from draftnas.models.gguf_file import gguf_of, write_gguf
    from draftnas.models.gguf_tensors import model_tensors
    from draftnas.models.speculative import speculate

    llama = _build()
    # the tokenizer's file, its size and the ids llama.cpp ends an answer on (<|endoftext|>, <|im_end|>)
    tokenizer, vocab, ends = (gguf_of("smollm2-135m"), 49152, (0, 2)) if family == "llama" else \
        (gguf_of("qwen2.5-coder-1.5b"), 151936, (151643, 151645))
    sizes = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                 rope_theta=10000.0, initializer_range=0.2, tie_word_embeddings=False)
    torch.manual_seed(0)
    target = (LlamaForCausalLM(LlamaConfig(**sizes)) if family == "llama"
              else Qwen2ForCausalLM(Qwen2Config(**sizes))).eval()
    with torch.no_grad():  # the target answers with 4 tokens only (other rows 0)
        head_rows = target.lm_head.weight
        kept = head_rows[100:104].clone() * 3
        head_rows.zero_()
        head_rows[100:104] = kept
    arch = Architecture.from_hf_config(target.config, name="tiny")
    target_file = write_gguf(tmp_path / "t.gguf", arch, model_tensors(target), "F32", tokenizer, "tiny",
                             settings=(10000.0, 1e-6, 256))
    shape = head_shape(target.config.to_dict(), "tiny", layers=(1, 2, 3), draft_vocab=300, ffn=96)
    head = new_head(target, shape, list(range(50, 350)), seed=1)
    folder = write_head(head, tmp_path / "head")
    write_head_gguf(folder, target_file, folder / "head-F32.gguf", "F32")
    arm = arm_of("head", target_file, f"head:{folder}", 3)
    assert arm.draft == folder / "head-F32.gguf" and "draft-eagle3" in arm.spec_flags(2)
    check_arm_files(target_file, arm)
    check_head_build(target_file, [arm], llama)  # this build carries the Qwen2 patch
    prompt, options = [1, 5, 9, 3, 7, 2, 8, 11, 40], BenchOptions(max_new_tokens=40)
    ours = speculate(target, head_proposer(head, target, 64), prompt, gamma=3, max_new_tokens=40,
                     eos_token_ids=ends)
    with arm_server(llama, LlamaArm("target", target_file), 2, 256) as alone, \
            arm_server(llama, arm, 2, 256) as drafting:
        _, plain = _run(alone, LlamaArm("target", target_file), prompt, options)
        counted, tokens = _run(drafting, arm, prompt, options)
    assert tokens == plain == ours.tokens
    assert sum(ours.accepted) > 0  # the test exercises accepted drafts
    assert (counted.drafted, counted.accepted) == (sum(ours.drafted), sum(ours.accepted))
