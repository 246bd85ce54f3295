"""One-token decode steps with each lone-row F.linear product as it is and padded to two rows.

Each process builds draftnas's static decoder of a registry shape (random weights), lets it choose its
product forms, then alternates `--rounds` times between the step unpadded and padded (median of
`--steps` steps each), and finally asks `draftnas.models.row_padding.choose_row_padding` what it keeps. Fresh
processes, `--processes` of them, because the unpadded step's speed differs between processes.
`--timeline SECONDS`: one process instead, timing blocks of unpadded, padded and 5-token verify steps
one after another for that long, each block's medians recorded with its time, to see the speed move
inside one process.

    python benchmarks/row_padding.py --arch qwen2.5-coder-1.5b --dtype bf16 --json out.json
    python benchmarks/row_padding.py --timeline 240 --json timeline.json
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from benchmarks.fresh_process import decoder_parser, prefilled, random_decoder, run_child, step_inputs


def _median_ms(decoder: Any, inputs: tuple[Any, Any], cache: Any, steps: int) -> float:
    """Median of `steps` timed forwards of `inputs` through `decoder`, in ms."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        decoder(*inputs, cache)
        times.append(1000 * (time.perf_counter() - started))
    return round(statistics.median(times), 1)


def child(arch_name: str, dtype_name: str, steps: int, rounds: int) -> None:
    import torch

    from draftnas.models.row_padding import choose_row_padding

    arch, decoder = random_decoder(arch_name, dtype_name)
    context = 64
    pairs = []
    with torch.inference_mode():
        cache = prefilled(arch, decoder, context, 1)
        one = step_inputs(context, 1)
        decoder(*one, cache)
        for _ in range(rounds):
            pair = []
            for padded in (False, True):
                decoder.matmul.pad_single_rows(padded)
                decoder(*one, cache)  # untimed: the first step after a switch
                pair.append(_median_ms(decoder, one, cache, steps))
            pairs.append(pair)
    kept = choose_row_padding(decoder)
    print(json.dumps({"unpadded_padded_ms": pairs, "choose_row_padding_keeps": kept}))


def timeline(arch_name: str, dtype_name: str, steps: int, seconds: float) -> None:
    import torch

    arch, decoder = random_decoder(arch_name, dtype_name)
    context, verify = 64, 5
    blocks = []
    with torch.inference_mode():
        cache = prefilled(arch, decoder, context, verify)
        one, five = step_inputs(context, 1), step_inputs(context, verify)
        decoder(*one, cache)
        decoder(*five, cache)
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            block = {"t_s": round(time.perf_counter() - started, 1)}
            kinds = (("unpadded", False, one), ("padded", True, one), ("verify", None, five))
            for name, padded, inputs in kinds:
                if padded is not None:
                    decoder.matmul.pad_single_rows(padded)
                block[f"{name}_ms"] = _median_ms(decoder, inputs, cache, steps)
            blocks.append(block)
    print(json.dumps({"blocks": blocks}))


def main() -> None:
    parser = decoder_parser(__doc__.splitlines()[0], steps=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--timeline", type=float, default=0.0, metavar="SECONDS",
                        help="one process, blocks of unpadded, padded and verify steps for this long")
    args = parser.parse_args()
    if args.child:
        if args.timeline:
            timeline(args.arch, args.dtype, args.steps, args.timeline)
        else:
            child(args.arch, args.dtype, args.steps, args.rounds)
        return

    from draftnas.core.machine import host_fields, print_figures

    before = host_fields()
    common = ["--arch", args.arch, "--dtype", args.dtype, "--steps", str(args.steps)]
    if args.timeline:
        blocks = run_child(__file__, [*common, "--timeline", str(args.timeline)])["blocks"]
        print_figures({**before, "arch": args.arch, "dtype": args.dtype, "steps": args.steps,
                       "timeline_s": args.timeline, "blocks": blocks}, args.json)
        return
    runs = [run_child(__file__, [*common, "--rounds", str(args.rounds)]) for _ in range(args.processes)]
    print_figures({**before, "arch": args.arch, "dtype": args.dtype, "steps": args.steps,
                   "processes": runs}, args.json)


if __name__ == "__main__":
    main()
