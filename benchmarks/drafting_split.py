"""Where a bench's speculative seconds went, read from its stored JSON: per arm of draftnas's loop, the
share spent inside the drafter, the speedup had drafting cost nothing at the same tokens per step (the
verify passes, prefills and loop alone: `draftnas.bench.stats.drafting_split`, which `draftnas bench`
prints under its table), and, for a speedup bar, how much faster the drafter would have to be, pooled
over every run, to reach it at the same tokens per step (or that no drafter speed reaches it).

Nothing is run: every figure comes from the runs the bench kept (seconds, seconds inside the drafter
and new tokens of each prompt, round and arm).

    python benchmarks/drafting_split.py benchmarks/results/cpu-amd-zen3-qwen2.5-coder-1.5b-printed-bench.json
    python benchmarks/drafting_split.py --bar 2.3 results/*.json --out split.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftnas.bench.records import BenchPrompt, BenchResult
from draftnas.bench.stats import drafting_split


def pooled(prompts: Sequence[BenchPrompt], arm: str, baseline: str, bar: float) -> tuple[float, float | None]:
    """`arm`'s pooled speedup over `baseline` (all tokens over all seconds), and how many times faster
    its drafter must run, at the same tokens per step, for that to reach `bar` (None where the seconds
    outside the drafter alone already miss it)."""
    runs = [(p.run(arm), p.run(baseline)) for p in prompts]
    own_tokens, base_tokens = sum(r.new_tokens for r, _ in runs), sum(b.new_tokens for _, b in runs)
    base_tps, seconds = base_tokens / sum(b.seconds for _, b in runs), sum(r.seconds for r, _ in runs)
    speedup, allowed = own_tokens / seconds / base_tps, own_tokens / (bar * base_tps)  # seconds at the bar
    drafting = sum(r.draft_s for r, _ in runs)
    if allowed <= seconds - drafting:
        return speedup, None
    return speedup, max(drafting / (allowed - seconds + drafting), 1.0) if drafting > 0 else 1.0


def split_rows(path: Path, bar: float | None) -> list[dict[str, Any]]:
    result = BenchResult.from_dict(json.loads(path.read_text()))
    rows = []
    for arm in result.arms:
        if arm.baseline is None or arm.draft_ms_per_token is None:  # draftnas's loop arms only
            continue
        share, free, interval = drafting_split(result.prompts, arm.name, arm.baseline)
        row = {"file": path.name, "host": result.host, "arm": arm.name, "weights": arm.draft_weights,
               "gamma": arm.gamma, "p_min": arm.p_min, "speedup": arm.speedup,
               "speedup_interval": list(arm.speedup_interval), "tokens_per_step": arm.tokens_per_step,
               "draft_ms_per_token": arm.draft_ms_per_token, "draft_share": share,
               "free_draft_speedup": free, "free_draft_speedup_interval": list(interval)}
        if bar is not None:
            speedup, factor = pooled(result.prompts, arm.name, arm.baseline, bar)
            row |= {"bar": bar, "pooled_speedup": speedup, "drafter_faster_by": factor}
        rows.append(row)
    return rows


def _line(row: dict[str, Any]) -> str:
    low, high = row["speedup_interval"] or (row["speedup"], row["speedup"])
    f_low, f_high = row["free_draft_speedup_interval"]
    stop = f" <{row['p_min']:g}" if row["p_min"] else ""
    text = (f"{row['arm']:<10} {row['weights'] or 'dense':<6} γ{row['gamma']}{stop:<5} "
            f"{row['speedup']:.3f}x [{low:.3f}, {high:.3f}]  {row['tokens_per_step']:.2f} tok/step  "
            f"{row['draft_ms_per_token']:6.1f} ms/draft  {row['draft_share']:4.0%} drafting  "
            f"free drafts {row['free_draft_speedup']:.3f}x [{f_low:.3f}, {f_high:.3f}]")
    if "bar" in row:
        factor = row["drafter_faster_by"]
        reach = "not reached by any drafter speed" if factor is None else f"drafter {factor:.2f}x faster"
        text += f"  pooled {row['pooled_speedup']:.3f}x, to {row['bar']:g}x: {reach}"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="bench JSONs (draftnas bench --out-json)")
    ap.add_argument("--bar", type=float, help="a speedup over the target alone to price the drafter against")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args()
    if args.bar is not None and args.bar <= 1:
        ap.error(f"--bar must be above 1 (a speedup over the target alone), not {args.bar:g}")
    rows = []
    for path in args.results:
        if not path.is_file():
            ap.error(f"{path}: no such file")
        try:
            found = split_rows(path, args.bar)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            ap.error(f"{path}: not a draftnas bench result ({type(e).__name__}: {e})")
        if found:
            print(f"{path.name} ({found[0]['host'] or 'host not recorded'})")
        for row in found:
            print("  " + _line(row))
        rows += found
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
