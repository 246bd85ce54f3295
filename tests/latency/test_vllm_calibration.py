"""The vLLM calibration in vLLM itself (SmolLM2 as target and base, small and quick): what it times inside the
engine process is read into a model that prices steps as the engine ran them."""

from __future__ import annotations

from tests.helpers import needs_vllm


@needs_vllm
def test_the_calibration_times_forwards_heads_and_steps_inside_vllm():
    from draftnas.core.registry import get_architecture
    from draftnas.latency.vllm import VllmModel, calibrate_vllm
    from draftnas.models.sources import ensure_local_folder, state_dir
    from draftnas.models.vllm_engine import find_vllm

    folder = ensure_local_folder("smollm2-135m")[1]
    arch = get_architecture("smollm2-135m")
    prompts = [list(range(200, 224)), list(range(300, 316))]
    said = []
    c = calibrate_vllm(find_vllm(), folder, folder, arch, prompts, (1, 2), gamma=2, threads=2, new_tokens=6,
                       rounds=1, progress=lambda done, total: said.append((done, total)))
    assert said[-1] == (4, 4)  # the target alone, drafting with the base, with n-gram lookup, the cut
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
