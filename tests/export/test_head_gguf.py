"""A head as the eagle3 GGUF llama.cpp's draft-eagle3 loads: what its header and tensors say, read back from
the file, and the one-line refusals where llama.cpp could not run it beside a target. Where a llama.cpp build
exists, the head drafts in llama-server exactly what it drafts in draftnas's loop (tests/bench)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.head.build import new_head
from draftnas.drafter.head.folder import write_head
from draftnas.drafter.head.shape import head_shape
from draftnas.export.head_gguf import fit_problems, head_gguf_problems, write_head_gguf
from draftnas.models.gguf_file import GgufInfo, gguf_of, header_values, read_info, write_gguf
from draftnas.models.gguf_tensors import random_tensors
from tests.helpers import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")
SMOL_VOCAB = 49152


@pytest.fixture(scope="module")
def target(tiny_llama_config):
    """A tiny LLaMA with SmolLM2's vocabulary size (its GGUF gives the tokenizer)."""
    return tiny_llama(tiny_llama_config, vocab_size=SMOL_VOCAB, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def head(target):
    shape = head_shape(target.config.to_dict(), "tiny", layers=(1, 2, 4), draft_vocab=300, ffn=48)
    return new_head(target, shape, list(range(100, 400)), seed=1)


@pytest.fixture(scope="module")
def target_gguf(target, tmp_path_factory):
    from draftnas.core.registry import Architecture

    arch = Architecture.from_hf_config(target.config, name="tiny")
    path = tmp_path_factory.mktemp("target") / "t.gguf"
    return write_gguf(path, arch, random_tensors(arch), "F32", gguf_of("smollm2-135m"), "tiny",
                      settings=(10000.0, 1e-6, 256))


def test_the_gguf_holds_the_head_under_llama_cpps_eagle3_names(head, target_gguf, tmp_path):
    from gguf import GGUFReader

    folder = write_head(head, tmp_path / "head")
    path = write_head_gguf(folder, target_gguf, tmp_path / "head.gguf", "F32")
    values = header_values(path)
    assert values["general.architecture"] == "eagle3"
    assert list(values["eagle3.target_layers"]) == [1, 2, 4]  # type: ignore[call-overload]
    assert values["eagle3.target_hidden_size"] == 32 and values["eagle3.block_count"] == 1
    assert values["eagle3.feed_forward_length"] == 48 and values["eagle3.attention.head_count_kv"] == 2
    info = read_info(path)
    assert (info.tokenizer_model, info.tokens_sha) == (read_info(target_gguf).tokenizer_model,
                                                        read_info(target_gguf).tokens_sha)
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    assert set(tensors) == {"fc.weight", "d2t", "output_norm.weight", "output.weight",
                            "blk.0.attn_norm.weight", "blk.0.attn_norm_2.weight", "blk.0.attn_q.weight",
                            "blk.0.attn_k.weight",
                            "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
                            "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"}
    # d2t: each draft row's absolute target id (the head stores offsets)
    assert np.array_equal(np.asarray(tensors["d2t"].data), head.draft_ids().numpy())
    assert np.allclose(np.asarray(tensors["blk.0.attn_norm_2.weight"].data), head.hidden_norm.weight.detach())
    # q's rows: each head's two halves interleaved (llama.cpp's rotary pairs); v's as they are
    q = torch.as_tensor(np.array(tensors["blk.0.attn_q.weight"].data)).reshape(head.q_proj.weight.shape)
    half = head.shape.head_dim // 2
    assert torch.equal(q[1], head.q_proj.weight.detach()[half]) and torch.equal(q[0], head.q_proj.weight[0])
    v = torch.as_tensor(np.array(tensors["blk.0.attn_v.weight"].data)).reshape(head.v_proj.weight.shape)
    assert torch.equal(v, head.v_proj.weight.detach())


def test_a_head_of_the_whole_vocabulary_has_no_map(target, target_gguf, tmp_path):
    from gguf import GGUFReader

    shape = head_shape(target.config.to_dict(), "tiny", layers=(1, 2, 3), draft_vocab=SMOL_VOCAB, ffn=48)
    folder = write_head(new_head(target, shape, list(range(SMOL_VOCAB))), tmp_path / "head")
    path = write_head_gguf(folder, target_gguf, tmp_path / "head.gguf", "Q8_0")
    names = {t.name: t for t in GGUFReader(str(path)).tensors}
    assert "d2t" not in names and names["output.weight"].tensor_type.name == "Q8_0"
    assert head_gguf_problems(target_gguf, path) == []


def _info(**changes):
    base = dict(path="t.gguf", architecture="llama", block_count=4, embedding_length=32,
                feed_forward_length=64, head_count=4, head_count_kv=2, vocab_tokens=SMOL_VOCAB,
                tokenizer_model="gpt2", bos=1, eos=2,
                tokens_sha="x", tensor_types={}, tensor_shapes={})
    return GgufInfo(**(base | changes))


@pytest.mark.parametrize(("changes", "said"), [
    ({}, []),
    ({"block_count": 6}, ["it was made for a 4-layer target, this one has 6"]),
    ({"embedding_length": 64}, ["it reads width 32, the target's is 64"]),
    ({"vocab_tokens": 151936}, ["it drafts for 49,152 tokens, the target has 151,936"]),
    ({"block_count": 3}, ["layers 4 lie outside the target's 3", "it was made for a 4-layer target, this one "
                                                                    "has 3"]),
])
def test_a_head_that_does_not_fit_the_target_gguf_is_named(head, changes, said):
    assert fit_problems(head.shape, _info(**changes)) == said


def test_llama_cpp_takes_exactly_three_layers(target):
    two = head_shape(target.config.to_dict(), "tiny", layers=(1, 3), draft_vocab=300, ffn=48)
    assert fit_problems(two, _info()) == [
        "it reads 2 target layers; llama.cpp's draft-eagle3 takes exactly 3 (train it with --layers A,B,C)"]


def test_a_head_for_another_target_writes_nothing(head, tmp_path):
    folder = write_head(head, tmp_path / "head")
    other = gguf_of("qwen2.5-coder-1.5b")  # width, layers and vocabulary all differ
    with pytest.raises(InvalidInputError, match="llama.cpp cannot run this head with .*: .*width 32"):
        write_head_gguf(folder, other, tmp_path / "head.gguf", "F16")
    assert not list(tmp_path.glob("head.gguf*"))


def _head_run(folder, layers):
    """A `distill head` run folder for SmolLM2-135M holding an untrained head of `layers`."""
    import json

    from draftnas.drafter.head.model import Eagle3Head
    from draftnas.drafter.head.records import RESULT_FILE, HeadTrainResult
    from draftnas.models.sources import ensure_local_folder

    config = json.loads((ensure_local_folder("smollm2-135m")[1] / "config.json").read_text())
    shape = head_shape(config, "smollm2-135m", layers=layers, draft_vocab=512, ffn=256)
    head = Eagle3Head(shape)
    head.set_draft_ids(range(512))
    written = write_head(head, folder / "head")
    result = HeadTrainResult(out=str(folder), head=str(written), target="smollm2-135m", label=shape.label(),
                             parameters=shape.parameters(), trained_tokens=0, budget_tokens=0, train_s=0.0,
                             features_s=0.0, readings=(), kept="trained", command="draftnas distill head",
                             shape=shape)
    (folder / RESULT_FILE).write_text(json.dumps(result.to_dict()))
    return folder


def test_distill_export_writes_a_head_runs_folder_and_its_gguf(tmp_path):
    from draftnas.drafter.training.distill_records import DistillExportRequest
    from draftnas.export.trained import export_trained

    run = _head_run(tmp_path / "run", (2, 15, 27))
    folder, path = export_trained(DistillExportRequest(run=str(run), out=str(tmp_path / "out"), gguf="f16"))
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "out-F16.gguf"}
    assert path == folder / "out-F16.gguf" and head_gguf_problems(gguf_of("smollm2-135m"), path) == []
    alone, none = export_trained(DistillExportRequest(run=str(run), out=str(tmp_path / "plain")))
    assert none is None and not list(alone.glob("*.gguf"))


@pytest.mark.parametrize(("layers", "gguf", "message"), [
    ((2, 27), "F16", "gguf asks for a file llama.cpp cannot run beside .*: it reads 2 target layers"),
    ((2, 15, 27), "Q4_K_M", r"gguf Q4_K_M: not a type a head's GGUF is written in \(allowed: F32, F16"),
])
def test_a_head_export_llama_cpp_cannot_run_writes_nothing(tmp_path, layers, gguf, message):
    from draftnas.core.options import OptionError
    from draftnas.drafter.training.distill_records import DistillExportRequest
    from draftnas.export.trained import export_trained

    run = _head_run(tmp_path / "run", layers)
    with pytest.raises(OptionError, match=message):
        export_trained(DistillExportRequest(run=str(run), out=str(tmp_path / "out"), gguf=gguf))
    assert not (tmp_path / "out").exists()


def test_a_head_gguf_beside_another_target_is_refused_before_a_server_starts(head, target_gguf, tmp_path):
    from draftnas.bench.llama_cpp import arm_of, check_arm_files
    from draftnas.core.options import OptionError

    folder = write_head(head, tmp_path / "head")
    write_head_gguf(folder, target_gguf, folder / "head-F16.gguf", "F16")
    other = gguf_of("qwen2.5-coder-1.5b")
    arm = arm_of("head", other, f"head:{folder}", 2)
    refused = r"draft head:.*: llama.cpp cannot run this head beside .*: .*width 32, the target's is 1536"
    with pytest.raises(OptionError, match=refused + "; its tokenizer is not the target's"):
        check_arm_files(other, arm)
    check_arm_files(target_gguf, arm_of("head", target_gguf, f"head:{folder}", 2))  # its own: runs
