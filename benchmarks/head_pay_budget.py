"""The budget at which a head's training curve says it pays in an engine, from one bench of that engine.

The step's cost: c = (the head arm's seconds over its steps) / (the target alone's seconds over its new
tokens), paired per prompt and round of one `draftnas bench` (so a drift of the host reaches both arms
alike); a step that emits more than c tokens pays. The engine's steps draft γ and verify γ + 1 whatever is
accepted, so c does not depend on acceptance (requests that end early aside). The curve (`draftnas distill
curve` over a `distill head` run) gives held-out greedy tokens per step at its own γ; the per-position
acceptance that makes that many (i.i.d., `acceptance_rate_from_tokens_per_step`) gives the tokens per step
at the bench's γ. The budget is where that reaches c: at c's median and at the ends of its 95% interval
(a bootstrap over prompts). Past the curve's last reading it is extrapolated and said so; where the slope's
interval spans 0 no budget is read off the fit.

What it checks first: c against the bench's own figures (its measured tokens per step over c is the
speedup the bench measured, to the pairing's rounding).

    python benchmarks/head_pay_budget.py CURVES.json BENCH.json [--arm draftnas] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from draftnas.core.bisection import turning_point
from draftnas.core.intervals import median_interval
from draftnas.core.throughput import acceptance_rate_from_tokens_per_step, expected_tokens_per_step
from draftnas.drafter.training.curve_fit import load_curves
from draftnas.drafter.training.distill_records import TrainingCurve
from draftnas.search.trained import MAX_BUDGET


def step_costs(bench: dict[str, Any], arm: str) -> dict[str, list[float]]:
    """Per prompt: the arm's seconds per step over the target alone's seconds per token, one per round."""
    out: dict[str, list[float]] = defaultdict(list)
    for entry in bench["prompts"]:
        runs = {r["arm"]: r for r in entry["runs"]}
        head, alone = runs.get(arm), runs.get("target")
        if head and alone and head["steps"] and alone["new_tokens"]:
            out[entry["prompt_id"]].append((head["seconds"] / head["steps"])
                                           / (alone["seconds"] / alone["new_tokens"]))
    return out


def at_gamma(curve: TrainingCurve, tokens: float, gamma: int) -> float:
    """The curve's tokens per step at `tokens`, carried from its own γ to `gamma`."""
    alpha = acceptance_rate_from_tokens_per_step(curve.predict(tokens), curve.gamma)
    return expected_tokens_per_step(alpha, gamma)


def pay_budget(curve: TrainingCurve, cost: float, gamma: int) -> float | None:
    """Training tokens at which the curve's tokens per step at `gamma` reach `cost` (0: already; None: not
    within the search's largest budget, or never at that γ)."""
    if at_gamma(curve, 0.0, gamma) >= cost:
        return 0.0
    if cost >= gamma + 1 or at_gamma(curve, MAX_BUDGET, gamma) < cost:
        return None
    _, hi = turning_point(lambda log_tokens: at_gamma(curve, math.exp(log_tokens), gamma) >= cost, 0.0,
                          math.log(MAX_BUDGET))
    return math.exp(hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("curves", help="curves file of `draftnas distill curve` (the head's curve in it)")
    parser.add_argument("bench", help="a `draftnas bench --out-json` file with the head's arm")
    parser.add_argument("--arm", default="draftnas", help="the head's arm in the bench (default: draftnas)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    curves = [c for c in load_curves(args.curves).curves if c.family == "head"]
    if not curves:
        raise SystemExit(f"{args.curves}: no head's curve in it")
    bench = json.loads(Path(args.bench).read_text())
    gamma = int(bench["gamma"])
    costs = step_costs(bench, args.arm)
    if not costs:
        raise SystemExit(f"{args.bench}: no {args.arm!r} arm paired with the target alone")
    per_prompt = [statistics.median(v) for v in costs.values()]
    mid, low, high = median_interval(per_prompt)
    arm = next(a for a in bench["arms"] if a["name"] == args.arm)
    where = f"{bench.get('host', '?')}, load before {bench.get('load_average_before', '?')}"
    print(f"{bench.get('engine')} bench of {bench['target']} ({len(per_prompt)} prompts x {bench['rounds']} "
          f"rounds, γ {gamma}, {where})")
    print(f"  step cost over the target alone's token: {mid:.3f} [{low:.3f}, {high:.3f}]")
    print(f"  check: its measured {arm['tokens_per_step']:.3f} tokens/step over that cost = "
          f"{arm['tokens_per_step'] / mid:.3f}x; the bench measured {arm['speedup']:.3f}x")
    figures: dict[str, Any] = {"bench": args.bench, "curves": args.curves, "gamma": gamma,
                               "step_cost": [mid, low, high], "heads": []}
    for curve in curves:
        last = curve.measured_max()
        interval = curve.slope_interval()
        row: dict[str, Any] = {"label": curve.label, "measured_to": last, "slope_interval": interval,
                               "at_last_reading": at_gamma(curve, last, gamma)}
        print(f"{curve.label}: the curve says {row['at_last_reading']:.3f} tokens/step at γ {gamma} at its "
              f"last reading ({last:,} tokens; read at γ {curve.gamma} on the data's held-out prompts); the "
              f"bench's arm measured {arm['tokens_per_step']:.3f} on its prompts")
        if not curve.measurable_slope:
            span = "fewer than 3 readings" if interval is None else \
                f"95% [{interval[0]:+.4f}, {interval[1]:+.4f}] per e-fold"
            print(f"  no measurable slope ({span}): no budget read off the fit")
            row["budgets"] = None
        else:
            budgets = [pay_budget(curve, c, gamma) for c in (mid, low, high)]
            row["budgets"] = budgets

            def said(b: float | None, last: int = last) -> str:
                if b is None:
                    return f"not within {MAX_BUDGET:.0e}"
                return f"{b:.2g}" + (" (extrapolated)" if b > last else "")

            assert interval is not None  # a measurable slope has one
            print(f"  pays past {said(budgets[0])} tokens (at the cost's interval: {said(budgets[1])} to "
                  f"{said(budgets[2])}); slope {curve.slope:.4f} per e-fold, 95% [{interval[0]:+.4f}, "
                  f"{interval[1]:+.4f}]")
        figures["heads"].append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
