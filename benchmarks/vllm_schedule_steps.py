"""vLLM's steps with a batch-size schedule set, beside a server drafting a fixed γ: does a schedule cost
anything per step at the same live batch and γ? Each arm is one vLLM engine (the target with a draft model),
every model forward and head timed inside vLLM's engine process (as the vLLM calibration times them), over
groups of B prompts submitted together, greedy, end-of-sequence ignored. Per arm and batch: steps, seconds,
ms per step, vLLM's own work per step, each model's forwards (count, rows read, ms per step), and how many
steps the group's prompts were prefilled over (one since the driver holds vLLM's scheduler while a group is
sent; before, vLLM's engine often stepped before every request had arrived, so some steps ran below B,
where a schedule drafts its γ for that batch).

    python benchmarks/vllm_schedule_steps.py --drafter FOLDER [--target qwen2.5-coder-1.5b] [--gamma 1]
        [--schedule '[[1,1,3],[2,65536,1]]'] [--batches 2,4] [--rounds 4] [--new-tokens 24]
        [--prompts code --per-domain 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from draftnas.core.machine import host_fields
from draftnas.core.prompts import encode_prompt, load_prompts
from draftnas.latency.vllm_timing import TimedRun, overhead_by_batch, timed_runs
from draftnas.models.sources import ensure_local_folder
from draftnas.models.vllm_engine import find_vllm, run_vllm
from draftnas.search.vllm import parse_schedule, speculative_config


def summary(runs: list[TimedRun], batch: int, most: int) -> dict[str, Any]:
    """One arm at one batch: its groups' steps, seconds, forwards and prefill steps (a target forward
    reading more rows than the batch's verify can, `most` drafts a sequence plus one)."""
    mine = [r for r in runs if r.batch == batch]
    steps = sum(r.steps for r in mine)
    seconds = sum(r.seconds for r in mine)
    forwards: dict[str, list[float]] = {}
    for role, rows, s in (f for r in mine for f in r.forwards):
        count = forwards.setdefault(role, [0, 0, 0.0])
        count[0] += 1
        count[1] += int(rows)
        count[2] += float(s)
    prefills = [sum(1 for role, rows, _ in r.forwards if role == "target" and rows > batch * (most + 1))
                for r in mine]
    return {"groups": len(mine), "steps": steps, "seconds": round(seconds, 3),
            "ms_per_step": round(1000 * seconds / max(1, steps), 1),
            "vllm_own_ms_per_step": overhead_by_batch(mine).get(batch),
            "forwards": {role: {"count": c, "rows": n, "ms_per_step": round(1000 * s / max(1, steps), 1)}
                         for role, (c, n, s) in sorted(forwards.items())},
            "prefill_steps_per_group": prefills}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", required=True, help="a draft model folder or an export")
    parser.add_argument("--gamma", type=int, default=1, help="the fixed-γ server's γ")
    parser.add_argument("--schedule", default="[[1,1,3],[2,65536,1]]", help="the schedule served beside it")
    parser.add_argument("--batches", default="2,4")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--prompts", default="code")
    parser.add_argument("--per-domain", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    _, target, _ = ensure_local_folder(args.target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    chosen = load_prompts(args.prompts, per_domain=args.per_domain)
    prompts = [encode_prompt(tokenizer, p.text) for p in chosen]
    schedule = parse_schedule(args.schedule)
    batches = [int(b) for b in args.batches.split(",")]
    most = max(args.gamma, *(g for _, _, g in schedule))
    job = {"model": str(target), "dtype": "float32", "prompts": prompts, "max_tokens": args.new_tokens,
           "rounds": args.rounds, "seed": 0, "ignore_eos": True, "time_forwards": True, "batches": batches,
           "max_model_len": max(map(len, prompts)) + args.new_tokens + most + 64, "kv_cache_gb": 2}
    arms = {f"fixed γ {args.gamma}": speculative_config(args.drafter, args.gamma),
            "schedule": speculative_config(args.drafter, args.gamma, schedule)}
    out: dict[str, Any] = {"command": "python benchmarks/vllm_schedule_steps.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        **host_fields(), "prompt_ids": [p.id for p in chosen], "arms": {}, "configs": arms}
    vllm = find_vllm()
    for name, config in arms.items():
        started = time.perf_counter()
        result = run_vllm(vllm, job | {"speculative_config": config}, threads=args.threads)
        runs = timed_runs(result)
        out["vllm"] = result.get("vllm")
        out["arms"][name] = {str(b): summary(runs, b, most) for b in batches}
        print(f"{name} ({time.perf_counter() - started:.0f} s)")
        for b, row in out["arms"][name].items():
            own = row["vllm_own_ms_per_step"]
            parts = ", ".join(f"{role} {f['count']}x {f['ms_per_step']} ms/step"
                              for role, f in row["forwards"].items())
            print(f"  B={b}: {row['steps']} steps, {row['ms_per_step']} ms a step (vLLM's own {own} ms), "
                  f"prefilled over {row['prefill_steps_per_group']} steps per group; {parts}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
