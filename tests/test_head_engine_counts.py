"""benchmarks/head_engine_counts.py: a head's drafts as llama.cpp counted them beside draftnas's loop,
compared only on the prompts both answered alike."""

from __future__ import annotations

import pytest

from benchmarks.head_engine_counts import compare, counts, same_answers


def _run(drafted: int, accepted: int, tokens: int = 20, lossless: bool = True, arm: str = "draftnas") -> dict:
    return {"arm": arm, "drafted": drafted, "accepted": accepted, "new_tokens": tokens,
            "steps": tokens - accepted, "lossless": lossless}


def _bench(*prompts: tuple[str, list[dict]]) -> dict:
    return {"prompts": [{"prompt_id": pid, "round": 0, "runs": runs} for pid, runs in prompts]}


def test_counts_total_every_run_of_the_arm_and_its_rates():
    bench = _bench(("a", [_run(10, 4), _run(0, 0, arm="target")]), ("b", [_run(6, 2, tokens=10)]))
    got = counts(bench, "draftnas")
    assert (got["requests"], got["drafted"], got["accepted"]) == (2, 16, 6)
    assert got["acceptance_rate"] == pytest.approx(6 / 16)
    assert got["tokens_per_step"] == pytest.approx(30 / 24)
    assert got["outputs_equal_to_target_alone"] == 1.0
    assert counts(bench, "draftnas", {"b"})["drafted"] == 6


def test_llama_cpps_rate_is_compared_on_the_prompts_answered_alike_only():
    loop = _bench(("a", [_run(10, 4)]), ("b", [_run(10, 5)]), ("c", [_run(8, 2)]))
    # b: llama.cpp's answer is not its target alone's; c: another length (another continuation)
    llama = _bench(("a", [_run(10, 4)]), ("b", [_run(10, 1, lossless=False)]), ("c", [_run(9, 2, tokens=22)]))
    assert same_answers(loop, llama, "draftnas") == {"a"}
    out = compare(loop, {"llama.cpp": llama}, "draftnas")["engines"]["llama.cpp"]
    assert out["prompts_answered_alike"] == ["a"] and out["acceptance_rate_over_loop"] == pytest.approx(1.0)
    assert out["drafted"] == 29 and out["outputs_equal_to_target_alone"] == pytest.approx(2 / 3)
    off = _bench(("a", [_run(10, 3)]))
    assert compare(loop, {"llama.cpp": off}, "draftnas")["engines"]["llama.cpp"][
        "acceptance_rate_over_loop"] == pytest.approx(0.75)
