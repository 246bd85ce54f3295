"""Per-domain drafters: one exported drafter's plan with its reduced head chosen from the
target's code-only, chat-only or all traces and, with --heal-steps N, its layers healed (distilled
toward the target's top-k) on those same traces, decoded for real on held-out prompts of each domain.

The drafters differ only in which vocabulary rows their head keeps (the same number) and, when
healed, in the text they were distilled on, so their draft latency is the same and tokens per
step says which helps where. Prompts the drafter's search traced (its `searched_prompts`, the
traces healed on) are left out; each prompt is decoded once per drafter in draftnas's loop
(static engine) after one warm-up.

    python benchmarks/domain_heads.py --drafter drafters/L24bi-h14kv2-i4864-v32768 \
        --traces runs/qwen2.5-coder-1.5b/traces-*.safetensors --dtype bf16 --per-domain 3 \
        --max-new-tokens 48 --json benchmarks/results/cpu-amd-zen5-qwen2.5-coder-1.5b-domain-heads.json

Tokens/s in its output include the products' first-meeting timings (only the first prompt is
run before counting): compare the heads by tokens per step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

HEADS = ("code", "chat", "all")


def main() -> None:
    import torch

    from draftnas.acceptance.traces import eos_token_ids, load_traces
    from draftnas.bench.run import unseen_prompts
    from draftnas.core.machine import cpu_identity, load_average
    from draftnas.core.prompts import load_prompts
    from draftnas.drafter.build import build_drafter, choose_head, heal_options
    from draftnas.drafter.records import PruningPlan
    from draftnas.export.folder import exported_record, load_drafter
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine
    from draftnas.models.records import TORCH_DTYPES
    from draftnas.models.sources import load_model
    from draftnas.models.speculative import speculative_generate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", required=True, help="an exported drafter folder (its plan is reused)")
    parser.add_argument("--traces", required=True, help="the target's traces the heads are chosen from")
    parser.add_argument("--prompts", default="code,chat,math")
    parser.add_argument("--per-domain", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--heal-steps", type=int, default=0,
                        help="distillation steps per drafter (0: heads only)")
    parser.add_argument("--heal-lr", type=float, default=1e-4)
    parser.add_argument("--heal-batch-size", type=int, default=4)
    parser.add_argument("--heal-seq-len", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    record = exported_record(Path(args.drafter)) or {}
    plan = PruningPlan.from_dict(record["plan"])
    if plan.vocab is None:
        raise SystemExit(f"{args.drafter} has a full head: nothing to choose per domain")
    load_before, started = load_average(), time.perf_counter()
    dtype = TORCH_DTYPES[args.dtype]
    target = load_model(record["target"], dtype=dtype)
    base = load_model(record["base"])  # the plan is applied in fp32, then cast
    traces = load_traces(args.traces)
    chosen = {h: traces if h == "all" else traces.select(domains=[h]) for h in HEADS}
    plans = {h: choose_head(plan, plan.vocab.size, chosen[h], base.tokenizer, source=f"{args.traces} ({h})")
             for h in HEADS}
    engines: dict[str, Any] = {}
    healed: dict[str, Any] = {}
    slots = 4096
    for head, p in plans.items():
        options = heal_options(steps=args.heal_steps, batch_size=args.heal_batch_size, lr=args.heal_lr,
                               seq_len=args.heal_seq_len, seed=0, n_records=len(chosen[head].records))
        built = build_drafter(p, base, heal=options, teacher=chosen[head] if options else None,
                              dtype=args.dtype)
        if built.heal is not None:
            healed[head] = {"records": len(chosen[head].records), "top1_before": built.heal.top1_before,
                            "top1_after": built.heal.top1_after, "train_s": built.heal.train_s}
            print(f"{head}: healed {args.heal_steps} steps on {len(chosen[head].records)} trace records, "
                  f"held-out top-1 {built.heal.top1_before:.3f} -> {built.heal.top1_after:.3f} "
                  f"({built.heal.train_s:.0f} s)", flush=True)
        engines[head] = StaticEngine(StaticDecoder.from_hf(built.model), slots)
    del base
    t_engine = StaticEngine(StaticDecoder.from_hf(target.model), slots)
    prompts, encoded, left_out = unseen_prompts(load_prompts(args.prompts), target.tokenizer,
                                                [load_drafter(args.drafter)], args.per_domain)
    eos = eos_token_ids(target.model, target.tokenizer)

    def run(head: str, ids: list[int]) -> Any:
        return speculative_generate(t_engine, engines[head], ids, gamma=args.gamma,
                                    max_new_tokens=args.max_new_tokens, eos_token_ids=eos,
                                    vocab_subset=plans[head].vocab)

    for head in HEADS:
        run(head, encoded[0])  # warm-up: every step size met before anything is counted
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for i, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True)):
        order = HEADS[i % 3:] + HEADS[:i % 3]
        for head in order:
            out = run(head, ids)
            cells = rows.setdefault(prompt.domain, {})
            cell = cells.setdefault(head, {"tokens": 0, "steps": 0, "seconds": 0.0})
            cell["tokens"] += len(out.tokens)
            cell["steps"] += out.steps
            cell["seconds"] += out.elapsed_s
    table = {d: {h: {"tokens_per_step": c["tokens"] / c["steps"], "tokens_per_s": c["tokens"] / c["seconds"]}
                 for h, c in cells.items()} for d, cells in rows.items()}
    coverage = {h: p.vocab.coverage for h, p in plans.items() if p.vocab is not None}
    print(f"{'prompts':8s} " + " ".join(f"{h + ' head':>22s}" for h in HEADS))
    for domain, heads in table.items():
        cells = [f"{heads[h]['tokens_per_step']:8.3f} tok/step {heads[h]['tokens_per_s']:5.2f}/s"
                 for h in HEADS]
        print(f"{domain:8s} " + " ".join(cells))
    result = {"drafter": args.drafter, "target": record["target"], "traces": args.traces,
              "head_rows": plan.vocab.size, "coverage": coverage, "gamma": args.gamma,
              "heal_steps": args.heal_steps, "heal_lr": args.heal_lr, "healed": healed,
              "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "threads": torch.get_num_threads(),
              "prompts": [p.id for p in prompts], "left_out": list(left_out), "table": table,
              "host": cpu_identity().label(), "load_average_before": load_before,
              "wall_s": round(time.perf_counter() - started, 1)}
    print(f"host {result['host']}, {result['threads']} threads, load before {load_before}, "
          f"{result['wall_s']} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
