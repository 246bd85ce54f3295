"""A quantized drafter reading its prompt dense against reading it through its quantized kernels, in one
interleaved run of draftnas's loop (static engine, greedy, the bench's held-out prompts): the same drafter,
the same target, only the many-row products of the drafter's quantized weights switched
(`MatmulChooser.many_rows_dense`). Prints per arm the median tokens/s over prompts and the ratio dense ÷
quantized, each prompt's median over its rounds first, with the bench's 95% bootstrap interval over prompts
(`bench.stats`), and the drafter's prefill of each prompt timed alone both ways.

    python benchmarks/dense_prompt_ab.py --draft drafters/L24bi-h14kv2-i4864-v98304-int4 --gamma 9 --p-min 0.7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from draftnas.bench.arms import Bench
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.run import load_for_bench
from draftnas.bench.stats import per_prompt_median
from draftnas.core.intervals import median_interval
from draftnas.core.prompts import load_prompts
from draftnas.models.speculative import speculative_generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", required=True, help="an exported quantized drafter folder")
    parser.add_argument("--gamma", type=int, default=9)
    parser.add_argument("--p-min", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-domain", type=int, default=3)
    parser.add_argument("--out", help="also write the result as JSON here")
    args = parser.parse_args()
    options = BenchOptions(gamma=args.gamma, p_min=args.p_min, dtype="bf16", engine="static",
                           rounds=args.rounds, hf_assisted=False, per_domain=args.per_domain)
    target, drafters, kept, encoded, _ = load_for_bench(args.target, args.draft, [],
                                                        load_prompts("code,chat,math"), options)
    d = drafters[0]
    bench = Bench(target, drafters, options)
    bench.build_engines(512)
    bench.prepare(encoded)
    tgt, dr = bench.engines["target"], bench.engines[d.label]
    chooser = dr.decoder.matmul
    chosen = dict(chooser.many_rows_dense)
    if not any(chosen.values()):
        raise SystemExit(f"nothing to compare: no quantized weight reads a prompt dense here ({chosen})")
    quantized = dict.fromkeys(chosen, False)
    subset = torch.tensor(d.subset.ids) if d.subset is not None else None

    def run(ids: list[int], dense: bool) -> tuple[float, float]:
        chooser.many_rows_dense = chosen if dense else quantized
        with torch.inference_mode():
            started = time.perf_counter()
            dr.forward(ids, 0, 1)
            prefill = time.perf_counter() - started
            out = speculative_generate(tgt, dr, ids, gamma=args.gamma, max_new_tokens=64,
                                       eos_token_ids=bench.eos, vocab_subset=subset, p_min=args.p_min)
        return len(out.tokens) / out.elapsed_s, prefill * 1e3

    for ids in encoded:  # warm both ways at every length, untimed
        run(ids, True), run(ids, False)
    tps: dict[str, dict[str, list[float]]] = {"dense": {}, "quantized": {}}
    prefill: dict[str, list[float]] = {"dense": [], "quantized": []}
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for i, (prompt, ids) in enumerate(zip(kept, encoded, strict=True)):
            order = ("dense", "quantized") if (i + r) % 2 == 0 else ("quantized", "dense")
            got = {name: run(ids, name == "dense") for name in order}
            for name, (t, p) in got.items():
                tps[name].setdefault(prompt.id, []).append(t)
                prefill[name].append(p)
            ratios.setdefault(prompt.id, []).append(got["dense"][0] / got["quantized"][0])
    result = {"drafter": args.draft, "prompts": [p.id for p in kept], "rounds": args.rounds,
              "tokens_per_s": {k: median_interval(per_prompt_median(per)) for k, per in tps.items()},
              "dense_over_quantized": median_interval(per_prompt_median(ratios)),
              "prefill_ms_median": {k: statistics.median(v) for k, v in prefill.items()}}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
