"""Routed transformers forwards over weights as `from_pretrained` leaves them (views of the
safetensors file, mapped privately) and over copies in the process's own memory
(`draftnas.linears.route_linears(..., own_weights=True)`, the default).

    python benchmarks/weight_memory.py --target gemma-3-270m

Each arm runs in its own fresh process, the two alternating `--rounds` times, so neither
inherits the other's memory. In each: load the target, route its linear layers (timing the
row counts first), then the median ms of a cached forward of 1 and of γ+1 new tokens after a
64-token context (`bench.cached_forward_ms`, `--repeats` each after a warm-up). Prints JSON
(also to --out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CONTEXT_TOKENS = 64


def arm(target: str, own: bool, gamma: int, repeats: int) -> dict[str, float]:
    from draftnas.bench.terms import cached_forward_ms
    from draftnas.models.linears import route_linears
    from draftnas.models.sources import load_model

    model = load_model(target).model
    route_linears(model, own_weights=own).prepare(range(1, gamma + 2))
    context = list(range(100, 100 + CONTEXT_TOKENS))
    return {str(n): round(cached_forward_ms(model, context, n, repeats), 2) for n in (1, gamma + 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gemma-3-270m")
    parser.add_argument("--gamma", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--arm", choices=("file", "own"), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.target, args.arm == "own", args.gamma, args.repeats)))
        return

    from draftnas.core.machine import host_fields, print_figures

    result: dict[str, Any] = {**host_fields(), "target": args.target, "gamma": args.gamma,
                              "context_tokens": CONTEXT_TOKENS, "repeats": args.repeats,
                              "file": [], "own": []}
    for _ in range(args.rounds):
        for name in ("file", "own"):
            child = subprocess.run(
                [sys.executable, __file__, "--arm", name, "--target", args.target, "--gamma", str(args.gamma),
                 "--repeats", str(args.repeats)], check=True, capture_output=True, text=True)
            result[name].append(json.loads(child.stdout.strip().splitlines()[-1]))
    print_figures(result, args.out)


if __name__ == "__main__":
    main()
