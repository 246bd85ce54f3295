"""Reduced-head drafters for the README's issue-7 table (Gemma-3-270M drafting for itself).

Builds, from a trace file of the target's own greedy outputs, drafters that keep the
first k base layers and an LM head over the N most frequent target tokens (plus special
tokens), and exports each as a plain transformers folder with draft_vocab.json:

    draftnas trace -t gemma-3-270m -p chat --per-domain 8 -n 96 -o runs/gemma-chat8.safetensors
    python benchmarks/reduced_head_drafters.py --traces runs/gemma-chat8.safetensors --out runs/i7/drafters
    draftnas bench -t gemma-3-270m -d runs/i7/drafters/gemma-L18-v16k -g 2 \
        -p runs/i7/chat-bench.jsonl --per-domain 6 -n 48 --no-hf

(runs/i7/chat-bench.jsonl = chat-018..chat-035 of the shipped chat set: held out from the traces.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

DRAFTERS = (("L18-v16k", 18, 16384), ("L12-v16k", 12, 16384), ("L12-full", 12, None))


def main() -> None:
    import torch

    from draftnas.acceptance.traces import load_traces
    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from draftnas.drafter.vocab import apply_vocab_subset, subset_from_traces
    from draftnas.export.folder import export_drafter
    from draftnas.export.records import ExportInfo
    from draftnas.models.sources import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gemma-3-270m")
    parser.add_argument("--traces", required=True)
    parser.add_argument("--out", default="runs/i7/drafters")
    parser.add_argument("--gamma", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    loaded = load_model(args.target)
    traces = load_traces(args.traces)
    stem = args.target.split("-")[0]
    for label, layers, vocab in DRAFTERS:
        plan = plan_pruning(loaded.model, PlanOptions(layers=tuple(range(layers)), base=args.target))
        drafter = apply_plan(loaded.model, plan)
        if vocab:
            subset = subset_from_traces(traces, vocab, loaded.tokenizer, source=str(args.traces))
            apply_vocab_subset(drafter, subset)
            print(f"{label}: {subset.size} ids, coverage of the traces {subset.coverage:.3f}")
        out = Path(args.out) / f"{stem}-{label}"
        info = ExportInfo(base=args.target, target=args.target, plan=plan, gamma=args.gamma)
        export_drafter(drafter, loaded.tokenizer, out, info, force=True)
        print(f"exported {out}")


if __name__ == "__main__":
    main()
