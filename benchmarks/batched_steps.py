"""The target's batched steps as the calibration times them (random weights of the real shapes, this host's
kept kernel choices), each with the operator that took most of its time: what found the 10 s decode at
batch 8 (F.linear broadcasting a one-token batch to a batched product, `models.matmul.linear_2d`).

    python benchmarks/batched_steps.py --target qwen2.5-coder-1.5b --batches 8,16 --tokens 1,2,5

Prints JSON: per B x T the median of 3 calls (ms) and the top operator's share of one profiled call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import torch

    from draftnas.core.machine import cpu_identity, load_average
    from draftnas.core.registry import get_architecture
    from draftnas.latency.records import ProfileOptions
    from draftnas.latency.runtime import Runtime, static_step
    from draftnas.models.kernel_choices import kept_choices

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--batches", default="8,16")
    parser.add_argument("--tokens", default="1,2")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = parser.parse_args()
    arch = get_architecture(args.target)
    options = ProfileOptions(device="cpu", dtype=args.dtype, mode="static", repeats=3, warmup=1)
    rt = Runtime(options.validate())
    steps: dict[str, dict[str, object]] = {}
    with kept_choices(), torch.inference_mode():
        model = rt.build(arch)
        for b in (int(v) for v in args.batches.split(",")):
            for n in (int(v) for v in args.tokens.split(",")):
                step = static_step(rt, model, arch, (b, n, args.context), arch.num_hidden_layers, None)
                times = []
                for _ in range(4):
                    started = time.perf_counter()
                    step()
                    times.append((time.perf_counter() - started) * 1e3)
                with torch.profiler.profile() as prof:
                    step()
                ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
                total = sum(e.self_cpu_time_total for e in ops) or 1
                steps[f"{b}x{n}"] = {"ms": round(statistics.median(times[1:]), 1), "top_op": ops[0].key,
                                     "top_share": round(ops[0].self_cpu_time_total / total, 3)}
    print(json.dumps({"host": cpu_identity().label(), "threads": torch.get_num_threads(),
                      "load_average": load_average(), "target": args.target, "dtype": args.dtype,
                      "context": args.context, "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
