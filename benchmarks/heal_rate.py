"""Heal-rate benchmark: build drafters from SmolLM2-135M, heal them toward the live target,
export, reload with from_pretrained and check they are lossless as `assistant_model`.

Prints top-1 agreement (and greedy tokens/step at gamma=4) on held-out prompts before and
after healing, the healing minutes and the rise per minute, as one JSON line per drafter.

    python benchmarks/heal_rate.py --steps 80 --threads 1 --out /tmp/heal-bench

Figures depend heavily on machine load; record the machine with them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", type=Path, default=None, help="cache of the self-distillation data")
    ap.add_argument("--out", type=Path, default=Path("heal-bench"))
    ap.add_argument("--only", default=None, help="bi4 or width8")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.heal.heal_data import HealData, generate_heal_data
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from draftnas.export.folder import export_drafter
    from draftnas.export.records import ExportInfo
    from draftnas.models.sources import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model("smollm2-135m")
    target, tok = loaded.model, loaded.tokenizer
    options = HealOptions(steps=args.steps, batch_size=args.batch_size, lr=args.lr, eval_every=20)
    if args.data and args.data.is_file():
        data = HealData(**torch.load(args.data, weights_only=False)["data"])
    else:
        data = generate_heal_data(target, tok, options)
        if args.data:
            torch.save({"data": data.__dict__}, args.data)
    print(json.dumps({"data": {"train": len(data.train), "heldout": len(data.heldout),
                               "heldout_positions": sum(s.continuation_len for s in data.heldout),
                               "build_s": round(data.build_s, 1)}}), flush=True)
    drafters = {
        "bi4": PlanOptions(num_layers=4, layer_selection="block_influence", base="smollm2-135m"),
        "width8": PlanOptions(num_layers=8, layer_selection="block_influence", num_attention_heads=6,
                              num_key_value_heads=2, intermediate_size=768, importance="activation",
                              base="smollm2-135m"),
    }
    prompts = ["The three primary colours are", "def add(a, b):", "Translate to French: good morning"]
    for name, plan_options in drafters.items():
        if args.only and name != args.only:
            continue
        plan = plan_pruning(target, plan_options, tokenizer=tok)
        drafter = apply_plan(target, plan)
        started = time.perf_counter()
        result = heal(drafter, target, options, tokenizer=tok, data=data,
                      on_reading=lambda r: print(json.dumps({"reading": r.to_dict()}), flush=True))
        heal_wall = time.perf_counter() - started
        out = export_drafter(drafter, tok, args.out / name, ExportInfo(
            base="smollm2-135m", target="smollm2-135m", plan=plan, heal=result, gamma=4,
            measured={"top1_agreement_after_healing": result.top1_after}), force=True)
        assistant = AutoModelForCausalLM.from_pretrained(out).eval()
        same = []
        for text in prompts:
            ids = tok(text, return_tensors="pt")
            with torch.no_grad():
                plain = target.generate(**ids, max_new_tokens=16, do_sample=False)
                assisted = target.generate(**ids, assistant_model=assistant, max_new_tokens=16,
                                           do_sample=False)
            same.append(bool(torch.equal(plain, assisted)))
        print(json.dumps({
            "drafter": name, "plan": plan.label(), "layers": list(plan.layers),
            "params": sum(p.numel() for p in {id(p): p for p in drafter.parameters()}.values()),
            "top1_before": round(result.top1_before, 4), "top1_after": round(result.top1_after, 4),
            "tps4_before": round(result.tokens_per_step_before, 3),
            "tps4_after": round(result.tokens_per_step_after, 3),
            "train_min": round(result.train_s / 60, 2), "heal_wall_min": round(heal_wall / 60, 2),
            "top1_rise_per_min": round(result.top1_rise_per_minute, 4),
            "s_per_step": round(result.train_s / max(result.steps, 1), 2),
            "export": str(out), "assistant_lossless": same,
        }), flush=True)


if __name__ == "__main__":
    main()
