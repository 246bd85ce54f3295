"""What export healing buys, per recipe: held-out top-1 agreement of one drafter plan healed with
its workload's prompts alone or with prompts the target writes itself, toward the live target
(a target forward every step) or toward the target's top-k kept while the data was made.

    python benchmarks/export_heal_data.py --draft drafters/L1bi-h9kv3-i1536-v4096 \\
        --recipe 0:0:80 --recipe 0:64:80 --recipe 128:0:80 --recipe 128:64:400

A recipe is WRITTEN:TOPK:STEPS (`HealOptions.written_prompts`, `.teacher_topk`, `.steps`); each
starts from the plan's pruned weights with the same seed, batch and learning rate, and data made
once per WRITTEN:TOPK. The held-out sequences are the workload's own prompts (every 5th), the same
for every recipe. Prints one JSON line per recipe (also to --out) with the data and training time.
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
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import load_plan
    from draftnas.models.sources import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", required=True, help="a drafter folder (its draftnas.json plan is used)")
    parser.add_argument("--prompts", default="chat", help="the workload's prompt set")
    parser.add_argument("--recipe", action="append", required=True, help="WRITTEN:TOPK:STEPS")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    loaded = load_model(args.target)
    plan = load_plan(Path(args.draft) / "draftnas.json")
    base = HealOptions(prompts=args.prompts, prompts_per_domain=40, eval_every=0,
                       batch_size=args.batch_size, lr=args.lr)
    host = {"cpu": cpu_model_name(), "threads": torch.get_num_threads(), "load_average": load_average()}
    data: dict[tuple[int, int], tuple[object, float]] = {}
    rows = []
    for recipe in args.recipe:
        written, topk, steps = (int(v) for v in recipe.split(":"))
        options = replace(base, written_prompts=written, teacher_topk=topk, steps=steps)
        if (written, topk) not in data:
            started = time.perf_counter()
            data[(written, topk)] = (generate_heal_data(loaded.model, loaded.tokenizer, options),
                                     time.perf_counter() - started)
        made, data_s = data[(written, topk)]
        torch.manual_seed(0)
        drafter = apply_plan(loaded.model, plan)
        result = heal(drafter, loaded.model, options, tokenizer=loaded.tokenizer, data=made)
        row = {"recipe": recipe, "written_prompts": written, "teacher_topk": topk, "steps": steps,
               "train_sequences": result.n_train_sequences, "heldout_sequences": result.n_heldout_sequences,
               "heldout_positions": result.n_heldout_positions, "data_s": round(data_s, 1),
               "train_s": round(result.train_s, 1), "top1_before": round(result.top1_before, 4),
               "top1_after": round(result.top1_after, 4),
               "tokens_per_step_g4_after": round(result.tokens_per_step_after, 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"host": host, "plan": plan.label(), "target": args.target, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
