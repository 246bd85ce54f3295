"""`export --format gguf`: a Qwen2.5-Coder-0.5B cut written as a GGUF drafter for the 1.5B, read back with the
`gguf` package (runs in CI without llama.cpp); loaded and run in llama.cpp where a build exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftnas.drafter.records import PruningPlan

pytestmark = pytest.mark.real_model


def _plan(tmp_path: Path) -> Path:
    plan = PruningPlan(
        base="qwen2.5-coder-0.5b",
        base_num_layers=24,
        layers=(0, 1, 23),
        layer_selection="explicit",
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
    )
    return plan.save(tmp_path / "plan.json")


def _export(tmp_path: Path, quant: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "draftnas",
            "export",
            "--plan",
            str(_plan(tmp_path)),
            "--target",
            "qwen2.5-coder-1.5b",
            "--heal-steps",
            "0",
            "--format",
            "gguf",
            "--quant",
            quant,
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_gguf_export_reads_back_with_the_targets_tokenizer(tmp_path):
    from draftnas.models.gguf_file import gguf_of, read_info, vocab_problems

    out = _export(tmp_path, "Q4_0")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    path = Path(result["gguf"])
    assert path.parent == tmp_path / "out" and path.name.endswith("-Q4_0.gguf")
    info, target = read_info(path), read_info(gguf_of("qwen2.5-coder-1.5b"))
    assert (info.architecture, info.block_count, info.embedding_length, info.feed_forward_length) == (
        "qwen2",
        3,
        896,
        4864,
    )
    assert (info.head_count, info.head_count_kv) == (14, 2)
    assert (
        info.tensor_types["blk.2.ffn_up.weight"] == "Q4_0"
        and info.tensor_types["output_norm.weight"] == "F32"
    )
    assert info.tensor_shapes["blk.0.attn_k.weight"] == (128, 896)
    head = info.tensor_shapes.get("output.weight", info.tensor_shapes["token_embd.weight"])
    assert head == (151936, 896)
    assert (info.tokens_sha, info.bos, info.eos) == (target.tokens_sha, target.bos, target.eos)
    assert vocab_problems(target, info) == []


def test_gguf_drafter_runs_in_llama_cpp(tmp_path):
    from draftnas.latency.llama_cpp import probe_flags, time_gguf
    from draftnas.models.gguf_file import gguf_of
    from draftnas.models.llama_cpp import LlamaCppError, find_llama_cpp

    try:
        llama = find_llama_cpp(None)
    except LlamaCppError:
        pytest.skip("no llama.cpp build here (`draftnas engines --build`)")
    out = _export(tmp_path, "Q8_0")
    assert out.returncode == 0, out.stderr
    path = Path(json.loads(out.stdout)["gguf"])
    llama = probe_flags(llama, gguf_of("qwen2.5-coder-1.5b"), threads=2)
    timing = time_gguf(llama, path, (1, 2), context=16, threads=2, repeats=1, gen=4)
    assert timing.decode_ms > 0 and timing.batch_ms[2] > 0


def test_llama_gguf_decodes_as_transformers_does_in_llama_cpp(tmp_path):
    """A 2-layer cut of SmolLM2 (LLaMA: q/k rows reordered for llama.cpp's rotary layout) written in F32
    greedily continues a prompt in llama-server exactly as transformers does; without the reordering
    the continuation differs."""
    import torch

    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.export.gguf import export_gguf
    from draftnas.models.llama_cpp import LlamaCppError, find_llama_cpp
    from draftnas.models.llama_server import Server
    from draftnas.models.sources import load_model

    try:
        llama = find_llama_cpp(None)
    except LlamaCppError:
        pytest.skip("no llama.cpp build here (`draftnas engines --build`)")
    loaded = load_model("smollm2-135m")
    plan = PruningPlan(base="smollm2-135m", base_num_layers=30, layers=(0, 29), layer_selection="explicit",
                       num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    drafter = apply_plan(loaded.model, plan).eval()
    path = export_gguf(drafter, "smollm2-135m", tmp_path, "L2-test", "F32")
    ids = loaded.tokenizer("The capital of France is a city where", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        want = drafter.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    with Server(llama, "drafter", path, (), threads=2, context=128) as server:
        got = server.complete(ids, 8, seed=0)["tokens"]
    assert got == want
