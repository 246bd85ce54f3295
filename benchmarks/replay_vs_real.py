"""The replay beside the real run it replays, interleaved prompt by prompt on one host.

Real: draftnas's static loop with the real weights, as `draftnas bench` builds it (the target alone, the
drafter, the reference). Replay: the same shapes with random weights (`bench.replay`), each loop step
accepting the count the real run of that prompt recorded. Every prompt is first run in full by each real
arm (which records its counts and warms every step size and prompt length), then by each replay arm; the
timed rounds run all six arms per prompt, the order rotating, so a drift of the host's speed reaches
real and replayed runs alike. Figures: medians over prompts of each prompt's median over rounds, with
95% bootstrap intervals over prompts; per arm the replay's time over the real one's per prompt.

What it checks is the premise of replaying on a GPU: that recorded acceptance over random weights times
what the real models time. Default: the Qwen pair (Qwen2.5-Coder-1.5B with the main job's winner and
the stock 0.5B), bf16, 2 prompts per domain, 64 tokens, 3 rounds.

    python benchmarks/replay_vs_real.py --draft drafters/L24bi-h14kv2-i4864-v98304-int4 --json out.json \
        --accepts accepts.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main() -> None:
    import torch

    from draftnas.acceptance.accepts import SCHEMA, AcceptsFile, AcceptsPrompt, AcceptsTrace, write_accepts
    from draftnas.bench.arms import Bench, LoopArm, product_rows
    from draftnas.bench.replay import replay_engine, resolve_shape
    from draftnas.bench.request_records import BenchOptions
    from draftnas.bench.run import load_for_bench
    from draftnas.bench.stats import per_prompt_median
    from draftnas.core.intervals import median_interval
    from draftnas.core.machine import cpu_identity, host_fields, load_average, print_figures
    from draftnas.core.prompts import load_prompts
    from draftnas.models.kernel_choices import kept_choices
    from draftnas.models.records import TORCH_DTYPES
    from draftnas.models.speculative import greedy_decode, speculative_generate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", required=True, help="the drafter (an exported folder)")
    parser.add_argument("--reference", default="qwen2.5-coder-0.5b")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--reference-gamma", type=int, default=3)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--prompts", default="code,chat,math")
    parser.add_argument("--per-domain", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--accepts", type=Path, default=None, help="write the real runs' counts here")
    args = parser.parse_args()

    started, load_before = time.perf_counter(), load_average()
    options = BenchOptions(gamma=args.gamma, reference_gamma=args.reference_gamma, dtype=args.dtype,
                           engine="static", hf_assisted=False, per_domain=args.per_domain,
                           max_new_tokens=args.tokens, rounds=args.rounds)
    with kept_choices():
        t_model, drafters, prompts, encoded, _ = load_for_bench(args.target, args.draft, [args.reference],
                                                                load_prompts(args.prompts), options)
        bench = Bench(t_model, drafters, options)
        bench.build_engines(max(map(len, encoded)) + args.tokens + bench.max_gamma + 1)
        bench.prepare(encoded)
        real = {a.name: a for a in bench.arms()}  # target, draftnas, reference
        recorded = {name: [arm.run(ids, 0, args.tokens) for ids in encoded]
                    for name, arm in real.items() if isinstance(arm, LoopArm)}
        plain = [real["target"].run(ids, 0, args.tokens) for ids in encoded]  # what the replay target decodes
        dtype = getattr(torch, TORCH_DTYPES[args.dtype])
        slots = max(map(len, encoded)) + args.tokens + bench.max_gamma + 2
        rows = product_rows([len(ids) for ids in encoded], bench.max_gamma)
        shapes = {"target": resolve_shape(args.target, "target"),
                  "draftnas": resolve_shape(args.draft, "draft"),
                  "reference": resolve_shape(args.reference, "reference")}
        fake = {k: replay_engine(s, "cpu", dtype, slots, i, rows) for i, (k, s) in enumerate(shapes.items())}
        gammas = {d.label: d.gamma for d in drafters}

        def replayed(label: str) -> Callable[[int], Any]:
            def run(i: int) -> Any:
                r = recorded[label][i]
                return speculative_generate(fake["target"], fake[label], encoded[i], gamma=gammas[label],
                                            max_new_tokens=len(r.tokens),
                                            replay=list(zip(r.drafted_steps, r.accepted_steps, strict=True)))
            return run

        runs: dict[str, Callable[[int], Any]] = {
            "real target": lambda i: real["target"].run(encoded[i], 0, args.tokens),
            "real draftnas": lambda i: real["draftnas"].run(encoded[i], 0, args.tokens),
            "real reference": lambda i: real["reference"].run(encoded[i], 0, args.tokens),
            "replay target": lambda i: greedy_decode(fake["target"], encoded[i],
                                                     max_new_tokens=len(plain[i].tokens)),
            "replay draftnas": replayed("draftnas"), "replay reference": replayed("reference")}
        for i in range(len(encoded)):  # the replay arms meet every length and step size before timing
            for name in runs:
                if name.startswith("replay"):
                    runs[name](i)
        times: dict[str, dict[str, list[float]]] = {k: {p.id: [] for p in prompts} for k in runs}
        tokens: dict[str, dict[str, int]] = {k: {} for k in runs}
        steps: dict[str, dict[str, int]] = {k: {} for k in runs}
        names = list(runs)
        for r in range(args.rounds):
            for i, p in enumerate(prompts):
                shift = (i + r) % len(names)
                for name in names[shift:] + names[:shift]:
                    out = runs[name](i)
                    times[name][p.id].append(out.elapsed_s)
                    tokens[name][p.id] = len(out.tokens)
                    steps[name][p.id] = getattr(out, "steps", 0)

    def figure(values: dict[str, float]) -> list[float]:
        mid, low, high = median_interval(list(values.values()))
        return [round(mid, 4), round(low, 4), round(high, 4)]

    def median_of(name: str) -> dict[str, float]:
        return dict(zip(times[name], per_prompt_median(times[name]), strict=True))

    med = {name: median_of(name) for name in runs}
    rows_out = []
    for label in ("draftnas", "reference"):
        rec = recorded[label]
        row: dict[str, Any] = {
            "label": label, "drafter": args.draft if label == "draftnas" else args.reference,
            "gamma": gammas[label], "weights": shapes[label].weights,
            "exact": all(steps[f"replay {label}"][p] == len(rec[i].accepted_steps)
                         and tokens[f"replay {label}"][p] == len(rec[i].tokens)
                         for i, p in enumerate(times["real target"]))}
        for kind in ("real", "replay"):
            loop, base = med[f"{kind} {label}"], med[f"{kind} target"]
            row[kind] = {
                "target_tokens_per_s": figure({p: tokens[f"{kind} target"][p] / s for p, s in base.items()}),
                "tokens_per_s": figure({p: tokens[f"{kind} {label}"][p] / s for p, s in loop.items()}),
                "speedup": figure({p: base[p] / s * tokens[f"{kind} {label}"][p] / tokens[f"{kind} target"][p]
                                   for p, s in loop.items()})}
        ids = list(med["real target"])
        row["replay_over_real_time"] = {
            "loop": figure({p: med[f"replay {label}"][p] / med[f"real {label}"][p] for p in ids}),
            "target": figure({p: med["replay target"][p] / med["real target"][p] for p in ids})}
        rows_out.append(row)
    if args.accepts:
        traces = {}
        for label, row in zip(("draftnas", "reference"), rows_out, strict=True):
            runs_of = zip(prompts, encoded, recorded[label], strict=True)
            traces[label] = AcceptsTrace(
                label=label, drafter=row["drafter"], source="bench", gamma=gammas[label],
                prompts=tuple(AcceptsPrompt(prompt_id=p.id, prompt_tokens=len(ids), new_tokens=len(r.tokens),
                                            accepted=r.accepted_steps, drafted=r.drafted_steps)
                              for p, ids, r in runs_of))
        write_accepts(args.accepts, AcceptsFile(schema=SCHEMA, target=args.target,
                                                host=cpu_identity().label(), max_new_tokens=args.tokens,
                                                traces=traces))
    print_figures({**host_fields(), "load_average_before": load_before, "target": args.target,
                   "dtype": args.dtype, "prompts": [p.id for p in prompts], "tokens": args.tokens,
                   "rounds": args.rounds, "rows": rows_out, "wall_s": round(time.perf_counter() - started, 1),
                   "per_prompt": {name: {p: {"seconds": [round(x, 4) for x in times[name][p]],
                                             "tokens": tokens[name][p], "steps": steps[name][p]}
                                         for p in times[name]} for name in runs},
                   "note": "real and replayed runs interleaved prompt by prompt; medians over prompts "
                           "[95% interval]; replay_over_real_time: per prompt, the replay's median time over "
                           "the real run's"}, args.json)


if __name__ == "__main__":
    main()
