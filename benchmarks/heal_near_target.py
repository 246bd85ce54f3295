"""Why healing can lower a drafter's agreement: Adam on a drafter that already matches its target.

    python benchmarks/heal_near_target.py --target gemma-3-270m

A drafter with every layer of its target and the full head is the target: its KL is 0 and its
gradients are rounding noise, which Adam scales up to steps of about the learning rate in every
weight. This heals that drafter a few steps at several learning rates, and a 4-layer drafter (far
from the target, real gradients) for longer, toward the target's top-64 kept with the data, and
prints held-out top-1 agreement before and after as JSON lines (also to --out).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path


def main() -> None:
    import torch

    from draftnas.core.machine import cpu_model_name, load_average
    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.heal.heal_data import generate_heal_data
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from draftnas.models.sources import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gemma-3-270m")
    parser.add_argument("--same-lrs", default="1e-3,1e-4,3e-5", help="learning rates for the full drafter")
    parser.add_argument("--same-steps", type=int, default=6)
    parser.add_argument("--shallow-layers", type=int, default=4)
    parser.add_argument("--shallow-lrs", default="2e-3,3e-4,1e-4")
    parser.add_argument("--shallow-steps", type=int, default=60)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    loaded = load_model(args.target)
    target, tok = loaded.model, loaded.tokenizer
    options = HealOptions(prompts="chat", prompts_per_domain=40, max_new_tokens=48, batch_size=4,
                          eval_every=0, teacher_topk=64)
    data = generate_heal_data(target, tok, options)
    rows = [{"host": {"cpu": cpu_model_name(), "threads": torch.get_num_threads(),
                      "load_average": load_average()},
             "train_sequences": len(data.train), "heldout_sequences": len(data.heldout)}]
    print(json.dumps(rows[0]), flush=True)
    layers = int(target.config.num_hidden_layers)
    runs = [("every layer", layers, float(lr), args.same_steps) for lr in args.same_lrs.split(",")]
    runs += [(f"first {args.shallow_layers}", args.shallow_layers, float(lr), args.shallow_steps)
             for lr in args.shallow_lrs.split(",")]
    for name, depth, lr, steps in runs:
        plan = plan_pruning(target, PlanOptions(num_layers=depth, layer_selection="first", base=args.target),
                            tokenizer=tok)
        drafter = apply_plan(target, plan)
        started = time.perf_counter()
        result = heal(drafter, target, replace(options, lr=lr, steps=steps), tokenizer=tok, data=data)
        row = {"drafter": name, "lr": lr, "steps": steps, "top1_before": round(result.top1_before, 4),
               "top1_after": round(result.top1_after, 4), "seconds": round(time.perf_counter() - started, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
