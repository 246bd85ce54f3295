"""The calibration's work outside the forward, read several times on this host: how long each reading
takes and how far its three terms move between readings.

`draftnas.latency.calibrate.decoding_overheads` times short real decodes of the target's first layer
(as target and as drafter); the steps it subtracts are timed first, as the calibration times them.
Random weights (a registry shape), so it needs no model files.

    python benchmarks/outside_forward.py --target qwen2.5-coder-1.5b --readings 3
    python benchmarks/outside_forward.py --target smollm2-135m --dtype fp32 --readings 5 --out o.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from draftnas.core.machine import cpu_identity
from draftnas.core.registry import get_architecture
from draftnas.latency.calibrate import CalibrationPlan, calibrate_host, decoding_overheads
from draftnas.latency.records import ProfileOptions
from draftnas.latency.runtime import Runtime

TERMS = ("generate_ms_per_token", "loop_ms_per_drafted_token", "loop_ms_per_verify_step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="a registry name (random weights)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--mode", default="static", choices=("static", "eager"),
                    help="the engine's mode: draftnas's decoder (static) or transformers (eager)")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens, as the calibration's")
    ap.add_argument("--readings", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args()

    target = get_architecture(args.target)
    options = ProfileOptions(device="cpu", dtype=args.dtype, mode=args.mode).validate()
    started = time.perf_counter()
    plan = CalibrationPlan((1, 2, 3, 4), prefix_layers=(), overheads=False, context_tokens=args.context)
    step_ms = calibrate_host(options, target.with_shape(num_hidden_layers=1), plan).target_ms
    steps_s = time.perf_counter() - started
    print(f"first layer's steps (ms by new tokens): {step_ms}, timed in {steps_s:.1f} s")
    rt = Runtime(options)
    readings = []
    for i in range(args.readings):
        started = time.perf_counter()
        terms = decoding_overheads(rt, target, args.context, step_ms)
        wall = time.perf_counter() - started
        named = dict(zip(TERMS, terms, strict=True))
        readings.append({"wall_s": round(wall, 1), **{k: round(v, 2) for k, v in named.items()}})
        print(f"reading {i + 1}: {wall:.1f} s; " + ", ".join(f"{k} {v:.2f}" for k, v in named.items()))
    summary = {k: {"median": statistics.median(r[k] for r in readings), "min": min(r[k] for r in readings),
                   "max": max(r[k] for r in readings)} for k in ("wall_s", *TERMS)}
    print("median [min, max] over readings: " + "; ".join(
        f"{k} {v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for k, v in summary.items()))
    if args.out:
        args.out.write_text(json.dumps({
            "command": "python benchmarks/outside_forward.py " + " ".join(
                f"--{k} {v}" for k, v in vars(args).items() if v is not None and k != "out"),
            "cpu": cpu_identity().label(), "threads": rt.torch.get_num_threads(), "target": args.target,
            "dtype": args.dtype, "mode": args.mode, "first_layer_step_ms": step_ms,
            "first_layer_steps_timed_s": round(steps_s, 1), "readings": readings, "summary": summary,
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
