"""A first look at speculative decoding in vLLM on this host: the target alone, the stock drafter as vLLM's
`draft_model` and lookup as its `ngram`, each arm's settings written by its drafter family
(`drafter.families`), on held-out prompts of the chosen sets, greedy, one request at a time.

    python benchmarks/vllm_first_look.py --out benchmarks/results/vllm-first-look.json

Each arm is one vLLM process (its load left out of the figures); the arms run one after another, not
interleaved, so a drift of the host between arms is in their ratios. Prints and writes JSON: per arm the
median tokens/s over requests [95% interval], its speedup over the target alone paired per prompt and round
[95% interval], the share of outputs equal to the target alone's, and vLLM's accepted drafts per position.
Needs `draftnas engines --install vllm`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    from transformers import AutoTokenizer

    from draftnas.acceptance.records import held_out
    from draftnas.core.intervals import median_interval
    from draftnas.core.machine import cpu_count, cpu_identity, load_average
    from draftnas.core.prompts import encode_prompt, load_prompts
    from draftnas.drafter.families import parse_drafter
    from draftnas.models.sources import ensure_local_folder
    from draftnas.models.vllm_engine import find_vllm, run_vllm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="qwen2.5-coder-0.5b")
    parser.add_argument("--lookup", default="lookup:n=3,m=4")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--sets", default="edit,code")
    parser.add_argument("--per-set", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    vllm = find_vllm()
    target = str(ensure_local_folder(args.target)[1])
    draft = str(ensure_local_folder(args.drafter)[1])
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = []
    for name in args.sets.split(","):
        kept = [p for i, p in enumerate(load_prompts(name)) if held_out(i)][:args.per_set]
        prompts += [(p.id, encode_prompt(tokenizer, p.text)) for p in kept]
    arms = {"target": None,
            args.drafter: parse_drafter(args.drafter).settings("vllm", args.gamma, draft_folder=draft),
            args.lookup: parse_drafter(args.lookup).settings("vllm", args.gamma)}
    job = {"model": target, "dtype": "float32", "prompts": [ids for _, ids in prompts],
           "max_tokens": args.max_tokens, "rounds": args.rounds, "max_model_len": 4096, "kv_cache_gb": 2}
    load_before = load_average()
    runs = {}
    for name, config in arms.items():
        print(f"[vllm] {name}: {json.dumps(config)}", file=sys.stderr, flush=True)
        runs[name] = run_vllm(vllm, job | {"speculative_config": config})
    alone = runs["target"]["rounds"]
    result: dict = {"host": cpu_identity().label(), "threads": cpu_count(), "load_before": load_before,
                    "load_after": load_average(), "vllm": vllm.version, "dtype": "float32",
                    "prompts": [pid for pid, _ in prompts], "max_tokens": args.max_tokens,
                    "rounds": args.rounds, "gamma": args.gamma, "order": "arms one after another",
                    "arms": {}}
    for name, run in runs.items():
        speeds = [len(r["tokens"]) / r["seconds"] for rnd in run["rounds"] for r in rnd]
        pairs = [(r, a) for rnd, ard in zip(run["rounds"], alone, strict=True)
                 for r, a in zip(rnd, ard, strict=True)]  # the same prompt and round
        ratios = [(len(r["tokens"]) / r["seconds"]) / (len(a["tokens"]) / a["seconds"]) for r, a in pairs]
        same = [r["tokens"] == a["tokens"] for r, a in pairs]
        mid, low, high = median_interval(speeds)
        ratio = median_interval(ratios)
        c = run["counters"]
        result["arms"][name] = {
            "speculative_config": arms[name], "load_s": run["load_s"], "tokens_per_s": mid,
            "tokens_per_s_interval": [low, high], "speedup": ratio[0], "speedup_interval": list(ratio[1:]),
            "exact_match_rate": statistics.mean(same), "counters": c,
            "acceptance_per_position": [a / c["num_drafts"] for a in c["accepted_per_pos"]] if c["num_drafts"]
            else [], "raw": run["rounds"]}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    summary = {k: {f: v[f] for f in ("tokens_per_s", "tokens_per_s_interval", "speedup", "speedup_interval",
                                     "exact_match_rate", "acceptance_per_position")}
               for k, v in result["arms"].items()}
    print(json.dumps({k: result[k] for k in ("host", "threads", "load_before", "vllm")} | {"arms": summary},
                     indent=1))


if __name__ == "__main__":
    main()
