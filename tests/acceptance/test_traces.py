"""Traces: generation (batched = unbatched), file round-trip, resume after interruption, identity checks."""

from __future__ import annotations

import json

import pytest
import torch

from draftnas.acceptance.records import TraceOptions
from draftnas.acceptance.traces import (
    check_compatible,
    load_traces,
    same_tokenizer_files,
    tokenizer_fingerprint,
)
from draftnas.acceptance.tracing import build_traces, decode_batch
from draftnas.core.errors import InvalidInputError, TraceError
from draftnas.core.prompts import Prompt
from draftnas.models.records import ModelSource
from draftnas.models.sources import LoadedModel
from tests.helpers import TinyTokenizer, tiny_llama


@pytest.fixture(scope="module")
def tiny_target(tiny_llama_config):
    model = tiny_llama(tiny_llama_config, initializer_range=0.2)
    model.generation_config.eos_token_id = 5
    return LoadedModel(model, TinyTokenizer(), ModelSource(spec="tiny", kind="folder", location="/tiny"),
                       None, 0.0, True)


PROMPTS = [Prompt(id=f"p{i}", domain="ab"[i % 2], text="hello draft " * (i + 1)) for i in range(6)]


def test_batched_decoding_equals_one_prompt_at_a_time(tiny_target):
    encoded = [[ord(c) % 128 for c in p.text] for p in PROMPTS]
    kw = dict(temperature=0.0, max_new_tokens=12, top_k=4, eos_ids=[5])
    together = decode_batch(tiny_target.model, encoded, **kw)
    alone = [decode_batch(tiny_target.model, [e], **kw)[0] for e in encoded]
    for a, b in zip(together, alone, strict=True):
        assert a.continuation == b.continuation
        assert torch.allclose(a.topk_probs, b.topk_probs, atol=1e-5)
        assert a.continuation[0] == int(a.topk_ids[0, 0])  # greedy picks the top-1
        assert (a.leftover >= 0).all() and (a.leftover <= 1).all()


def test_round_trip_metadata_and_records(tiny_target, tmp_path):
    options = TraceOptions(max_new_tokens=10, temperatures=(0.0, 0.8), top_k=6, seed=3, batch_size=4)
    path = build_traces(tiny_target, PROMPTS, options, tmp_path / "t.safetensors", prompt_set="tiny-set")
    traces = load_traces(path)
    meta = traces.metadata
    assert (meta.target, meta.vocab_size, meta.top_k, meta.seed) == ("tiny", 128, 6, 3)
    assert meta.temperatures == (0.0, 0.8) and meta.n_records == 12 == len(traces)
    assert meta.tokenizer_fingerprint == tokenizer_fingerprint(TinyTokenizer())
    assert meta.n_tokens == traces.n_tokens > 0
    assert traces.temperatures == (0.0, 0.8) and set(traces.domains) == {"a", "b"}
    for rec in traces.records:
        c = rec.info.continuation_len
        assert rec.topk_ids.shape == (c, 6) == rec.topk_probs.shape and rec.leftover.shape == (c,)
        assert torch.allclose(rec.topk_probs.sum(-1) + rec.leftover, torch.ones(c), atol=2e-3)
        assert rec.input_ids.tolist() == rec.prompt_ids.tolist() + rec.continuation_ids.tolist()
    assert len(traces.select(temperature=0.8)) == 6 and len(traces.select(domains=["a"])) == 6
    with pytest.raises(TraceError, match="no records at temperature 0.5"):
        traces.select(temperature=0.5)
    assert not (tmp_path / "t.safetensors.partial").exists()


def test_sampled_traces_are_seeded(tiny_target, tmp_path):
    options = TraceOptions(max_new_tokens=10, temperatures=(1.0,), top_k=4, seed=1)
    a = load_traces(build_traces(tiny_target, PROMPTS, options, tmp_path / "a.safetensors"))
    b = load_traces(build_traces(tiny_target, PROMPTS, options, tmp_path / "b.safetensors"))
    c = load_traces(build_traces(tiny_target, PROMPTS, TraceOptions(
        max_new_tokens=10, temperatures=(1.0,), top_k=4, seed=2), tmp_path / "c.safetensors"))
    seqs = [[r.continuation_ids.tolist() for r in t.records] for t in (a, b, c)]
    assert seqs[0] == seqs[1] and seqs[0] != seqs[2]


def test_interrupted_run_resumes_from_finished_shards(tiny_target, tmp_path, monkeypatch):
    import draftnas.acceptance.tracing as traces_mod

    options = TraceOptions(max_new_tokens=8, top_k=4, batch_size=2, shard_size=2)
    out = tmp_path / "r.safetensors"
    calls = []
    real = traces_mod.decode_batch
    monkeypatch.setattr(traces_mod, "decode_batch", lambda *a, **k: calls.append(1) or real(*a, **k))

    def interrupt(done, total):
        if done >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_traces(tiny_target, PROMPTS, options, out, progress=interrupt)
    assert not out.exists() and len(list((tmp_path / "r.safetensors.partial").glob("shard-*"))) == 1
    calls.clear()
    seen = []
    build_traces(tiny_target, PROMPTS, options, out, progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (2, 6) and seen[-1] == (6, 6)
    assert len(calls) == 2  # only the two unfinished batches ran again
    fresh = build_traces(tiny_target, PROMPTS, options, tmp_path / "fresh.safetensors")
    resumed, whole = load_traces(out), load_traces(fresh)
    assert [r.info for r in resumed.records] == [r.info for r in whole.records]
    assert all(torch.equal(a.continuation_ids, b.continuation_ids)
               for a, b in zip(resumed.records, whole.records, strict=True))


def test_partial_from_other_options_is_discarded(tiny_target, tmp_path):
    out = tmp_path / "x.safetensors"
    partial = tmp_path / "x.safetensors.partial"
    partial.mkdir()
    (partial / "manifest.json").write_text(json.dumps({"seed": 99}))
    (partial / "shard-00000.safetensors").write_text("stale")
    build_traces(tiny_target, PROMPTS[:2], TraceOptions(max_new_tokens=4, top_k=2), out)
    assert len(load_traces(out)) == 2


def test_bad_files_and_options_are_refused(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_traces(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(TraceError, match="not a readable safetensors"):
        load_traces(junk)
    with pytest.raises(InvalidInputError, match="top_k.*temperatures|temperatures"):
        TraceOptions(temperatures=(0.0, 0.0), top_k=0).validate()


def test_tokenizer_mismatch_is_refused(tiny_target, tmp_path):
    traces = load_traces(build_traces(tiny_target, PROMPTS[:1], TraceOptions(max_new_tokens=3, top_k=2),
                                      tmp_path / "m.safetensors"))
    check_compatible(traces, vocab_size=128, fingerprint=tokenizer_fingerprint(TinyTokenizer()))
    with pytest.raises(TraceError, match="tokenizer.*differs"):
        check_compatible(traces, vocab_size=128, fingerprint=tokenizer_fingerprint(TinyTokenizer(shift=1)))
    with pytest.raises(TraceError, match="vocabulary of 256 ids"):
        check_compatible(traces, vocab_size=256)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_traces_written_on_cuda_equal_the_cpus(tiny_target, tmp_path):
    import copy
    import dataclasses

    options = TraceOptions(max_new_tokens=10, temperatures=(0.0, 1.0), top_k=4, seed=1)
    cpu = load_traces(build_traces(tiny_target, PROMPTS, options, tmp_path / "cpu.safetensors"))
    on_gpu = dataclasses.replace(tiny_target, model=copy.deepcopy(tiny_target.model).to("cuda"))
    gpu = load_traces(build_traces(on_gpu, PROMPTS, dataclasses.replace(options, device="cuda"),
                                   tmp_path / "gpu.safetensors"))
    for a, b in zip(cpu.records, gpu.records, strict=True):  # fp32: the same tokens, host tensors
        assert a.continuation_ids.tolist() == b.continuation_ids.tolist()
        assert b.topk_probs.device.type == "cpu"


def test_same_tokenizer_files_are_byte_for_byte_and_need_a_tokenizer_json(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "tokenizer.json").write_text('{"model": {"vocab": {"x": 0}}}')
        (folder / "chat_template.jinja").write_text(folder.name)  # not a tokenizer file: ignored
    assert same_tokenizer_files(a, b)
    (b / "tokenizer_config.json").write_text("{}")  # a file only one side has
    assert not same_tokenizer_files(a, b)
    (a / "tokenizer_config.json").write_text("{}")
    assert same_tokenizer_files(a, b)
    (b / "tokenizer.json").write_text('{"model": {"vocab": {"y": 0}}}')  # one byte apart
    assert not same_tokenizer_files(a, b)
    for folder in (a, b):
        (folder / "tokenizer.json").unlink()
    assert not same_tokenizer_files(a, b)  # no tokenizer.json: not known to be the same


def test_a_shipped_trace_is_used_only_for_the_weights_it_was_made_from(tmp_path, monkeypatch):
    import dataclasses
    import json

    from draftnas.acceptance import shipped
    from draftnas.models.records import EMBEDDED

    made = tmp_path / "traces-abc123.safetensors"
    made.write_bytes(b"a trace")
    folder = tmp_path / "shipped"
    path = shipped.ship(made, "qwen2.5-coder-1.5b", "abc123", "a test", folder)
    assert path.read_bytes() == b"a trace"
    entry = json.loads((folder / shipped.INDEX).read_text())["qwen2.5-coder-1.5b"]["abc123"]
    assert entry["weights_sha256"] == EMBEDDED["qwen2.5-coder-1.5b"].sha256 and entry["made"] == "a test"
    out = tmp_path / "run" / "traces-abc123.safetensors"
    assert shipped.copy_shipped("qwen2.5-coder-1.5b", "abc123", out, folder) == out
    assert out.read_bytes() == b"a trace"
    assert shipped.shipped_traces("qwen2.5-coder-1.5b", "other-key", folder) is None
    other = dataclasses.replace(EMBEDDED["qwen2.5-coder-1.5b"], sha256="0" * 64)  # new weights: trace anew
    monkeypatch.setitem(shipped.EMBEDDED, "qwen2.5-coder-1.5b", other)
    assert shipped.shipped_traces("qwen2.5-coder-1.5b", "abc123", folder) is None
    with pytest.raises(InvalidInputError, match="not an embedded target"):
        shipped.ship(made, "smollm2-135m", "abc123", "a test", folder)
