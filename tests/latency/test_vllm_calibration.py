"""The vLLM calibration in vLLM itself (SmolLM2 as target and base, small and quick): what it times inside the
engine process is read into a model that prices steps as the engine ran them, an eagle3 head's too."""

from __future__ import annotations

import json

import pytest

from tests.helpers import needs_vllm


@needs_vllm
def test_the_calibration_times_forwards_heads_and_steps_inside_vllm(tmp_path):
    from draftnas.core.registry import get_architecture
    from draftnas.drafter.head.build import untrained_head
    from draftnas.drafter.head.shape import head_shape
    from draftnas.latency.vllm import VllmModel
    from draftnas.latency.vllm_timing import TimedHead, calibrate_vllm
    from draftnas.models.sources import ensure_local_folder, state_dir
    from draftnas.models.vllm_engine import find_vllm
    from draftnas.search.vllm import head_arch

    folder = ensure_local_folder("smollm2-135m")[1]
    arch = get_architecture("smollm2-135m")
    prompts = [list(range(200, 224)), list(range(300, 316))]
    said = []
    shape = head_shape(json.loads((folder / "config.json").read_text()), "smollm2-135m", draft_vocab=2048,
                       ffn=512)
    head = untrained_head(shape, tmp_path / "head")
    c = calibrate_vllm(find_vllm(), folder, folder, arch, prompts, (1, 2), gamma=2, threads=2, new_tokens=6,
                       rounds=1, progress=lambda done, total: said.append((done, total)),
                       head=TimedHead(head, shape.label(), shape.draft_vocab))
    # the target alone, drafting with the base, with n-gram lookup, with the head as eagle3, the cut
    assert said[-1] == (5, 5)
    assert c.version.startswith("0.32.") and c.batches == (1, 2) and c.gamma == 2
    assert {1, 2, 3}.issubset(c.target_ms)  # decodes at batch 1 and 2, verifies of γ + 1 at batch 1
    assert 24 in c.target_ms and 16 in c.target_ms  # each prompt's prefill at batch 1, timed too
    assert set(c.drafter_ms) == {2, arch.num_hidden_layers} and 1 in c.drafter_ms[2]
    assert c.catch_up_tokens == 2  # vLLM 0.32's draft_model reads γ + 2 tokens a sequence first
    assert set(c.plain_overhead_ms) == set(c.spec_overhead_ms) == set(c.ngram_overhead_ms) == {1, 2}
    assert c.drafter_ms[2][1] < c.drafter_ms[arch.num_hidden_layers][1]  # two layers cost less than thirty
    model = VllmModel(c, arch, arch)
    # a pass over 24 tokens costs more than a decode (a verify of 3 need not: on a 2-core Zen 4 it timed
    # 51.3 ms beside the decode's 52.0, both one read of SmolLM2's weights, and failed a CI run)
    assert 0 < model.predict_ms(arch) < model.predict_ms(arch, new_tokens=24)
    assert model.predict_ms(arch, new_tokens=3) > 0
    assert not list((state_dir() / "vllm-cuts").glob("*"))  # the two-layer cut is removed once timed
    # the head: its forward by tokens, its fc over the verified rows, its head over one row a sequence, the
    # catch-up its first forward reads, and its steps priced from them
    assert c.head_label == shape.label() and c.head_rows == 2048
    assert 1 in c.head_ms and 1 in c.head_logits_ms and c.head_fc_ms and set(c.head_overhead_ms) == {1, 2}
    assert c.head_catch_up_tokens >= 1
    priced = head_arch(arch, shape)
    with_head = VllmModel(c, arch, arch, head=priced)
    one = with_head.predict_ms(priced, head_vocab_size=2048)
    assert one == pytest.approx(c.head_ms[1] + c.head_logits_ms[1])
