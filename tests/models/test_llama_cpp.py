"""llama.cpp found, probed and read: a fake build (shell scripts standing in for the stock tools) for the
logic, and the real build where one exists (`draftnas engines --build`; skipped otherwise)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.registry import Architecture
from draftnas.models.llama_cpp import LlamaCppError, check_quant, find_llama_cpp, host_flags, server_flags

BENCH_JSON = [
    {"n_prompt": 2, "n_gen": 0, "n_depth": 128, "samples_ns": [100e6, 110e6, 105e6]},
    {"n_prompt": 4, "n_gen": 0, "n_depth": 128, "samples_ns": [150e6, 160e6, 155e6]},
    {"n_prompt": 0, "n_gen": 16, "n_depth": 128, "samples_ns": [16 * 80e6, 16 * 82e6, 16 * 78e6]},
]


def fake_build(folder: Path, crash_unless_repack_off: bool = False, version_exit: int = 0) -> Path:
    """A folder with a `llama-bench` that prints `BENCH_JSON` (and crashes on signal 11 with repacking on,
    like this pin's AMX path on the Intel family 6 model 167 host, when asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    crash = (
        'case " $* " in *" --repack 0 "*) ;; *) kill -SEGV $$ ;; esac\n' if crash_unless_repack_off else ""
    )
    script = folder / "llama-bench"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "version: 0.6.0-dev (fake)"; exit {version_exit}; fi\n'
        + crash
        + f"cat <<'EOF'\n{json.dumps(BENCH_JSON)}\nEOF\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def test_find_llama_cpp_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTNAS_LLAMA_CPP", raising=False)
    monkeypatch.setenv("DRAFTNAS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LlamaCppError, match="no llama.cpp build here: run `draftnas engines --build`"):
        find_llama_cpp(None)
    with pytest.raises(LlamaCppError, match="--llama-cpp .*: no llama-bench in it"):
        find_llama_cpp(tmp_path / "empty")
    broken = fake_build(tmp_path / "broken", version_exit=3)
    with pytest.raises(LlamaCppError, match="is broken: llama-bench --version exited 3"):
        find_llama_cpp(broken)
    found = find_llama_cpp(fake_build(tmp_path / "ok" / "build" / "bin").parents[1])  # a checkout's build/bin
    assert found.version == "version: 0.6.0-dev (fake)" and found.bin_dir.name == "bin"


def test_host_flags_turn_repacking_off_only_where_batches_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTNAS_STATE", str(tmp_path / "state"))
    from draftnas.latency.llama_cpp import probe_flags
    from draftnas.models.gguf_file import write_gguf
    from draftnas.models.gguf_tensors import random_tensors

    shape = tiny_qwen2()  # probe_flags reads the file's header before it runs the build
    tokenizer = _tokenizer_gguf(tmp_path / "tok.gguf", [f"t{i}" for i in range(64)])
    write_gguf(tmp_path / "model.gguf", shape, random_tensors(shape), "Q8_0", tokenizer, "t",
               settings=(1e6, 1e-6, 2048))
    crashing = find_llama_cpp(fake_build(tmp_path / "crash", crash_unless_repack_off=True))
    probed = probe_flags(crashing, tmp_path / "model.gguf", threads=2)
    assert probed.flags == ("--repack", "0") and "crashed" in probed.flags_why
    assert find_llama_cpp(crashing.bin_dir).flags == ("--repack", "0")  # kept for this host and build
    assert server_flags(probed.flags) == ["--no-repack"]
    fine = find_llama_cpp(fake_build(tmp_path / "fine"))
    assert probe_flags(fine, tmp_path / "model.gguf", threads=2).flags == ()
    calls = []
    with pytest.raises(LlamaCppError, match="crashed with and without weight repacking"):
        host_flags(find_llama_cpp(fake_build(tmp_path / "bad")), lambda flags: calls.append(flags) or False)
    assert calls == [(), ("--repack", "0")]


def test_time_gguf_reads_medians_from_llama_bench(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTNAS_STATE", str(tmp_path / "state"))
    from draftnas.latency.llama_cpp import time_gguf

    timing = time_gguf(find_llama_cpp(fake_build(tmp_path / "b")), tmp_path / "m.gguf", (1, 2, 4), 128, 2)
    assert timing.decode_ms == pytest.approx(80.0)
    assert timing.batch_ms == {1: pytest.approx(80.0), 2: pytest.approx(105.0), 4: pytest.approx(155.0)}


def test_check_quant_lists_the_types_llama_cpp_has():
    assert check_quant("q4_k_m") == "Q4_K_M"
    with pytest.raises(InvalidInputError, match="'Q3_0' is not a llama.cpp quant type .*Q8_0"):
        check_quant("Q3_0")


def test_ggml_block_quantizers_match_the_gguf_package_bit_for_bit():
    import gguf.quants as gq

    from draftnas.models.ggml_quants import quantize, rounded

    torch.manual_seed(0)
    w = torch.randn(16, 256) * 0.05
    w[1, :32] = 0  # an all-zero block (scale 0)
    w[2, 7] = -1.0  # a block whose largest magnitude is negative (Q4_0 keeps the sign)
    for name in ("Q8_0", "Q4_0"):
        kind = getattr(gq.GGMLQuantizationType, name)
        ours, theirs = quantize(w, name), gq.quantize(w.numpy(), kind)
        assert np.array_equal(ours, theirs), name
        assert np.array_equal(rounded(w, name).numpy(), gq.dequantize(theirs, kind)), name
    assert not torch.equal(rounded(w, "Q4_0"), w)


def _tokenizer_gguf(path: Path, tokens: list[str], bos: int = 1, eos: int = 2) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_token_types([1] * len(tokens))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_qwen2(vocab: int = 64) -> Architecture:
    return Architecture(
        name="tiny-qwen2",
        family="qwen2",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=vocab,
    )


def test_gguf_written_reads_back_with_shapes_tokenizer_and_types(tmp_path):
    from draftnas.models.gguf_file import read_info, vocab_problems, write_gguf
    from draftnas.models.gguf_tensors import random_tensors

    tokens = [f"t{i}" for i in range(64)]
    target = _tokenizer_gguf(tmp_path / "target.gguf", tokens)
    arch = tiny_qwen2()
    path = write_gguf(
        tmp_path / "d.gguf",
        arch,
        random_tensors(arch),
        "Q8_0",
        target,
        "tiny drafter",
        settings=(1e6, 1e-6, 2048),
    )
    info = read_info(path)
    assert (info.architecture, info.block_count, info.embedding_length, info.feed_forward_length) == (
        "qwen2",
        2,
        64,
        128,
    )
    assert (info.head_count, info.head_count_kv, info.vocab_tokens, info.bos, info.eos) == (4, 2, 64, 1, 2)
    assert (
        info.tensor_types["blk.0.ffn_down.weight"] == "Q8_0"
        and info.tensor_types["blk.1.attn_q.bias"] == "F32"
    )
    assert info.tensor_shapes["token_embd.weight"] == (64, 64)
    assert info.tensor_shapes["blk.0.ffn_down.weight"] == (64, 128)
    assert vocab_problems(read_info(target), info) == []
    assert not (tmp_path / "d.gguf.part").exists()


def test_vocab_problems_say_what_llama_cpp_would_refuse(tmp_path):
    from draftnas.models.gguf_file import check_drafter_gguf, read_info, vocab_problems

    target = read_info(_tokenizer_gguf(tmp_path / "t.gguf", [f"t{i}" for i in range(300)]))
    other = read_info(_tokenizer_gguf(tmp_path / "o.gguf", [f"x{i}" for i in range(300)], eos=5))
    small = read_info(_tokenizer_gguf(tmp_path / "s.gguf", [f"t{i}" for i in range(100)]))
    problems = vocab_problems(target, other)
    assert any("BOS/EOS 1/5" in p for p in problems) and any("token texts differ" in p for p in problems)
    assert any("100 tokens against the target's 300" in p for p in vocab_problems(target, small))
    with pytest.raises(InvalidInputError, match="cannot draft for .* in llama.cpp"):
        check_drafter_gguf(tmp_path / "t.gguf", tmp_path / "o.gguf")


def test_round_model_rounds_matrices_and_leaves_vectors(tiny_llama_config):
    from transformers import LlamaForCausalLM

    from draftnas.models.ggml_quants import round_model, rounded

    model = LlamaForCausalLM(tiny_llama_config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert round_model(model, "Q4_0") > 0
    after = model.state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(after[q], rounded(before[q], "Q4_0")) and not torch.equal(after[q], before[q])
    assert torch.equal(after["model.norm.weight"], before["model.norm.weight"])


def test_gguf_export_refuses_a_reduced_head_and_unknown_types_before_any_work():
    from draftnas.core.errors import ExportError
    from draftnas.export.gguf import check_gguf_export, gguf_path

    with pytest.raises(ExportError, match=r"reduced draft head \(32768 rows\); llama.cpp loads only"):
        check_gguf_export("Q8_0", "qwen2.5-coder-1.5b", 32768, None)
    with pytest.raises(InvalidInputError, match="not a llama.cpp quant type"):
        check_gguf_export("Q9_9", "qwen2.5-coder-1.5b", 0, None)
    assert gguf_path("out", "base-L4-Q4_0", "Q4_0").name == "base-L4-Q4_0.gguf"
    assert gguf_path("out", "base-L4", "Q6_K").name == "base-L4-Q6_K.gguf"


def test_the_build_patch_goes_in_once_and_a_source_without_its_anchor_is_refused(tmp_path):
    from draftnas.models.llama_cpp import PATCHES, QWEN2_PATCH, LlamaCppError, apply_patches

    relative, old, new = PATCHES[QWEN2_PATCH]
    graph = tmp_path / relative
    graph.parent.mkdir(parents=True)
    graph.write_text(f"// before\n{old}        cur = inpL;\n")
    apply_patches(tmp_path)
    assert graph.read_text() == f"// before\n{new}        cur = inpL;\n"
    assert "res->t_layer_inp[il] = inpL;" in graph.read_text()
    with pytest.raises(LlamaCppError, match="holds its anchor 0 times, not once: the source is not"):
        apply_patches(tmp_path)  # patched already: the anchor is gone


def test_the_pinned_source_takes_the_patch_and_the_stamp_names_it():
    """Where draftnas built llama.cpp here: its source holds the patched line and its stamp the patch."""
    import json

    from draftnas.models.llama_cpp import PATCHES, QWEN2_PATCH, build_root

    stamp = build_root() / "draftnas-build.json"
    if not stamp.is_file():
        pytest.skip("no llama.cpp build here (`draftnas engines --build`)")
    relative, _, new = PATCHES[QWEN2_PATCH]
    source = next((build_root() / "src").glob("*/llama.cpp"))
    assert new in (source / relative).read_text()
    assert json.loads(stamp.read_text())["patches"] == [QWEN2_PATCH]
