"""The llama.cpp search's pricing, constraints and verdict, on a hand-made calibration (no engine runs)."""

from __future__ import annotations

import pytest

from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.machine import cpu_identity
from draftnas.core.registry import get_architecture
from draftnas.core.throughput import break_even_acceptance, expected_tokens_per_step
from draftnas.latency.llama_cpp import EngineModel
from draftnas.latency.records import EngineCalibration, EngineTiming
from draftnas.search.llama_cpp import space_problems, verdict
from draftnas.search.spaces import default_space_for, load_search_space

TARGET = get_architecture("qwen2.5-coder-1.5b")
BASE = get_architecture("qwen2.5-coder-0.5b")


def _timing(decode: float, per_token: float) -> EngineTiming:
    return EngineTiming(
        file="f.gguf",
        decode_ms=decode,
        batch_ms={k: decode + per_token * (k - 1) for k in range(1, 8)},
        repeats=3,
    )


def calibration() -> EngineCalibration:
    """The Intel host's shape of costs: a 4-token batch about 2x a decode; drafters linear in depth."""
    quants = {
        "Q8_0": {2: _timing(8.0, 2.0), 12: _timing(24.0, 4.0), 24: _timing(44.0, 6.0)},
        "Q4_0": {2: _timing(6.0, 2.0), 12: _timing(18.0, 3.0), 24: _timing(30.0, 4.0)},
    }
    return EngineCalibration(
        engine="llama.cpp",
        version="test",
        cpu=cpu_identity(),
        threads=2,
        context_tokens=128,
        target=_timing(80.0, 25.0),
        base=BASE.name,
        quants=quants,
        references={"qwen2.5-coder-0.5b": _timing(36.0, 5.0)},
    )


def test_engine_model_prices_target_references_and_drafters_by_quant_and_depth():
    model = EngineModel(calibration(), TARGET, BASE)
    assert model.predict_ms(TARGET) == 80.0 and model.predict_ms(TARGET, new_tokens=4) == 155.0
    assert model.predict_ms(BASE) == 36.0  # the reference's own file (registry name)
    drafter = BASE.with_shape(name="qwen2.5-coder-0.5b:L12", num_hidden_layers=12)
    q8 = model.for_weights("Q8_0")
    assert q8.predict_ms(drafter) == pytest.approx(24.0, abs=0.5)  # on the fitted line through 2/12/24
    assert q8.drafter_batch_ms(drafter, 4) == pytest.approx(24.0 + 12.0, abs=1.0)
    assert model.for_weights("Q4_0").predict_ms(drafter) < q8.predict_ms(drafter)
    with pytest.raises(InfeasibleCandidateError, match="full vocabulary"):
        q8.predict_ms(drafter, head_vocab_size=32768)
    with pytest.raises(InfeasibleCandidateError, match="full width"):
        q8.predict_ms(drafter.with_shape(intermediate_size=2048))
    with pytest.raises(InfeasibleCandidateError, match="not timed in llama.cpp"):
        model.for_weights("int8")


def test_break_even_acceptance_is_where_the_speedup_is_one():
    """The engine's verify and catch-up priced as one step (the core's break-even, which llama.cpp's verdict
    reads with the step it measured)."""
    alpha = break_even_acceptance(3, 10.0, 80.0, 80.0 + 25.0 * 3 + 12.0)
    assert alpha is not None
    step = 3 * 10.0 + 80.0 + 75.0 + 12.0
    assert expected_tokens_per_step(alpha, 3) * 80.0 / step == pytest.approx(1.0, abs=1e-6)
    # a drafter as slow as the target never pays, whatever it accepts
    assert break_even_acceptance(3, 80.0, 80.0, 155.0 + 50.0) is None


def test_verdict_uses_the_fastest_drafter_the_space_holds():
    space = default_space_for("qwen2.5-coder-1.5b", "llama.cpp")
    said = verdict(EngineModel(calibration(), TARGET, BASE), space, "qwen2.5-coder-0.5b", 0.74, 0.93)
    assert not said.pays and said.fastest.endswith("Q4_0") and said.fastest.startswith(f"{space.depth.min} ")
    assert said.verify_ratio[4] == pytest.approx(155.0 / 80.0, abs=1e-3)
    text = "\n".join(said.lines())
    assert "no drafter pays here" in text and "qwen2.5-coder-0.5b: 0.740x" in text and "break-even" in text
    assert verdict(EngineModel(calibration(), TARGET, BASE), space, best_speedup=1.1).pays


def test_llama_cpp_space_constraints():
    assert space_problems(default_space_for("qwen2.5-coder-1.5b", "llama.cpp")) == []
    problems = space_problems(load_search_space("qwen2.5-coder-1.5b"))  # draftnas's own space
    assert any("reduced draft heads" in p for p in problems)
    formats = "dense, int8, int4, attn=int8,mlp=int8,head=int4"
    assert any(f"weights {formats} are not GGUF types" in p for p in problems)
    assert any("prunes widths" in p for p in problems)
    assert default_space_for("qwen2.5-coder-1.5b").name == "qwen2.5-coder-1.5b"
