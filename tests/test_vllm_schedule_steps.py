"""benchmarks/vllm_schedule_steps.py: one arm's vLLM steps at one batch, read from its timed forwards."""

from __future__ import annotations

import pytest

from benchmarks.vllm_schedule_steps import summary
from draftnas.latency.vllm_timing import TimedRun


def test_a_group_prefilled_in_one_step_and_one_prefilled_over_two():
    together = TimedRun(2, 1.0, [["target", 80, 0.3], ["draft", 82, 0.1],
                                 ["target", 4, 0.2], ["draft", 6, 0.1]])
    staggered = TimedRun(2, 1.4, [["target", 40, 0.2], ["draft", 41, 0.05], ["draft", 1, 0.02],
                                  ["target", 44, 0.3], ["draft", 46, 0.1], ["target", 4, 0.2]])
    other_batch = TimedRun(4, 9.0, [["target", 160, 1.0]])
    got = summary([together, staggered, other_batch], batch=2, most=3)
    assert got["groups"] == 2
    assert got["steps"] == 5
    assert got["seconds"] == pytest.approx(2.4)
    assert got["ms_per_step"] == pytest.approx(480.0)
    # a target forward over more rows than B (γ + 1) can verify is a prefill: the staggered group has two
    assert got["prefill_steps_per_group"] == [1, 2]
    assert got["forwards"]["target"] == {"count": 5, "rows": 172, "ms_per_step": pytest.approx(240.0)}
    assert got["forwards"]["draft"]["count"] == 5
    assert got["forwards"]["draft"]["rows"] == 176
    # vLLM's own work: each group's wall time less its forwards, over its steps (median over groups)
    own = ((1.0 - 0.7) / 2 * 1000 + (1.4 - 0.87) / 3 * 1000) / 2
    assert got["vllm_own_ms_per_step"] == pytest.approx(own, abs=1e-3)
