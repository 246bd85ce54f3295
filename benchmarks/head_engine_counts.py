"""One head's drafts as llama.cpp counted them beside draftnas's loop, on the same prompts: `draftnas bench`
JSONs of the head in draftnas's loop and in llama.cpp (`--spec-type draft-eagle3`), run at one γ over the
same held-out prompts. Per engine: requests, drafted and accepted drafts, the acceptance rate (accepted /
drafted), tokens per step and the share of outputs equal to that engine's target alone; then llama.cpp's
acceptance rate over the loop's (the replay: the head run on the target's hidden states in fp32) on the
prompts both answered alike (a prompt whose answer differs drafted against another continuation, so its
counts are not the same count). Both engines draft at most the tokens left minus one and stop at the end of
the answer, so on one answer their counts are one count. (vLLM's last step drafts past the budget; its
bench replays vLLM's own steps and prints the comparison itself.)

    python benchmarks/head_engine_counts.py LOOP.json LLAMA.json [--arm draftnas] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def counts(bench: dict[str, Any], arm: str, prompts: set[str] | None = None) -> dict[str, Any]:
    """The arm's totals over every run (or over runs of `prompts`)."""
    runs = [r for p in bench["prompts"] for r in p["runs"]
            if r["arm"] == arm and (prompts is None or p["prompt_id"] in prompts)]
    drafted, accepted = sum(r["drafted"] for r in runs), sum(r["accepted"] for r in runs)
    tokens, steps = sum(r["new_tokens"] for r in runs), sum(r["steps"] for r in runs)
    return {"requests": len(runs), "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_step": tokens / steps if steps else None,
            "outputs_equal_to_target_alone": sum(bool(r.get("lossless")) for r in runs) / len(runs) if runs
            else None}


def same_answers(loop: dict[str, Any], other: dict[str, Any], arm: str) -> set[str]:
    """Prompts every run of which, in both benches, emitted the same number of tokens and matched its own
    target alone (so both drafted against one continuation: greedy, lossless, the same length)."""
    def lengths(bench: dict[str, Any]) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for p in bench["prompts"]:
            for r in p["runs"]:
                if r["arm"] == arm:
                    out.setdefault(p["prompt_id"], set()).add(r["new_tokens"] if r.get("lossless") else -1)
        return out

    mine, theirs = lengths(loop), lengths(other)
    return {p for p in mine if p in theirs and mine[p] == theirs[p] and -1 not in mine[p]}


def compare(loop: dict[str, Any], others: dict[str, dict[str, Any]], arm: str) -> dict[str, Any]:
    out: dict[str, Any] = {"arm": arm, "engines": {"draftnas's loop": counts(loop, arm)}}
    for name, bench in others.items():
        shared = same_answers(loop, bench, arm)
        mine, theirs = counts(loop, arm, shared), counts(bench, arm, shared)
        ratio = (theirs["acceptance_rate"] / mine["acceptance_rate"]
                 if mine["acceptance_rate"] and theirs["acceptance_rate"] is not None else None)
        out["engines"][name] = counts(bench, arm) | {
            "prompts_answered_alike": sorted(shared), "on_those": {"loop": mine, name: theirs},
            "acceptance_rate_over_loop": ratio}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("loop", help="bench JSON of the head in draftnas's loop")
    parser.add_argument("llama_cpp", help="bench JSON of the head in llama.cpp")
    parser.add_argument("--arm", default="draftnas", help="the head's arm name in each bench")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    others = {"llama.cpp": json.loads(Path(args.llama_cpp).read_text())}
    result = compare(json.loads(Path(args.loop).read_text()), others, args.arm)
    for name, c in result["engines"].items():
        rate = "-" if c["acceptance_rate"] is None else f"{c['acceptance_rate']:.4f}"
        line = (f"{name}: {c['requests']} requests, {c['accepted']}/{c['drafted']} drafts accepted ({rate}), "
                f"{c['tokens_per_step']:.3f} tokens per step, {c['outputs_equal_to_target_alone']:.0%} of "
                "outputs the target alone's")
        if "acceptance_rate_over_loop" in c:
            ratio = c["acceptance_rate_over_loop"]
            line += (f"; on the {len(c['prompts_answered_alike'])} prompts answered as in the loop, its "
                     f"acceptance rate over the loop's: " + ("-" if ratio is None else f"{ratio:.4f}"))
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
