"""benchmarks/head_pay_budget.py: a head's step cost paired per prompt and round from a bench, and the budget
at which its curve reaches it, recomputed from the stored SmolLM2 head's files."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from benchmarks.head_pay_budget import at_gamma, pay_budget, step_costs
from draftnas.drafter.training.curve_fit import load_curves

HEADS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "heads"
CURVE = HEADS / "cpu-amd-zen3-smollm2-135m-head-curve.json"
BENCH = HEADS / "cpu-amd-zen3-smollm2-135m-head-vllm-bench.json"


def test_the_step_cost_pairs_each_prompt_and_round_with_the_target_alone():
    def run(arm: str, seconds: float, steps: int) -> dict:
        return {"arm": arm, "seconds": seconds, "new_tokens": 10, "steps": steps}

    bench = {"prompts": [
        {"prompt_id": "a", "round": 0, "runs": [run("target", 2.0, 10), run("draftnas", 1.5, 5)]},
        {"prompt_id": "a", "round": 1, "runs": [run("target", 4.0, 10), run("draftnas", 1.5, 5)]},
        {"prompt_id": "b", "round": 0, "runs": [run("target", 1.0, 10)]}]}
    # a: 0.3 s a step over 0.2 s a token, then over 0.4; b has no head run to pair
    assert step_costs(bench, "draftnas") == {"a": [pytest.approx(1.5), pytest.approx(0.75)]}


def test_the_budget_is_where_the_curve_at_the_benchs_gamma_reaches_the_step_cost():
    curve = next(c for c in load_curves(CURVE).curves if c.family == "head")
    bench = json.loads(BENCH.read_text())
    cost = statistics.median(statistics.median(v) for v in step_costs(bench, "draftnas").values())
    # the stored bench's step cost times its measured tokens per step is the speedup it measured, within the
    # pairing's difference (per prompt and round here, a ratio of medians there)
    arm = next(a for a in bench["arms"] if a["name"] == "draftnas")
    assert arm["tokens_per_step"] / cost == pytest.approx(arm["speedup"], rel=0.03)
    budget = pay_budget(curve, cost, bench["gamma"])
    assert budget is not None and budget > curve.measured_max()  # this head did not pay at 150,000 tokens
    assert at_gamma(curve, budget, bench["gamma"]) == pytest.approx(cost, rel=1e-6)
    assert at_gamma(curve, budget / math.e, bench["gamma"]) < cost
    assert pay_budget(curve, 1.0, 2) == 0.0 and pay_budget(curve, 3.5, 2) is None  # past γ + 1: never
