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

from benchmarks.fresh_process import decoder_parser, random_decoder, run_child


def child(arch_name: str, dtype_name: str, steps: int, rounds: int) -> None:
    import torch

    from draftnas.models.row_padding import choose_row_padding

    arch, decoder = random_decoder(arch_name, dtype_name)
    context = 64
    pairs = []
    with torch.inference_mode():
        cache = decoder.new_cache(1, context + 1)
        decoder(torch.randint(0, arch.vocab_size, (1, context)), torch.arange(context), cache)
        token, position = torch.full((1, 1), 7), torch.tensor([context])
        decoder(token, position, cache)
        for _ in range(rounds):
            pair = []
            for padded in (False, True):
                decoder.matmul.pad_single_rows(padded)
                times = []
                for _ in range(steps + 1):
                    started = time.perf_counter()
                    decoder(token, position, cache)
                    times.append(1000 * (time.perf_counter() - started))
                pair.append(round(statistics.median(times[1:]), 1))
            pairs.append(pair)
    kept = choose_row_padding(decoder)
    print(json.dumps({"unpadded_padded_ms": pairs, "choose_row_padding_keeps": kept}))


def timeline(arch_name: str, dtype_name: str, steps: int, seconds: float) -> None:
    import torch

    arch, decoder = random_decoder(arch_name, dtype_name)
    context, verify = 64, 5
    blocks = []
    with torch.inference_mode():
        cache = decoder.new_cache(1, context + verify)
        decoder(torch.randint(0, arch.vocab_size, (1, context)), torch.arange(context), cache)
        one = (torch.full((1, 1), 7), torch.tensor([context]))
        five = (torch.full((1, verify), 7), torch.arange(context, context + verify))
        decoder(*one, cache)
        decoder(*five, cache)
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            block = {"t_s": round(time.perf_counter() - started, 1)}
            kinds = (("unpadded", False, one), ("padded", True, one), ("verify", None, five))
            for name, padded, step in kinds:
                if padded is not None:
                    decoder.matmul.pad_single_rows(padded)
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    decoder(*step, cache)
                    times.append(1000 * (time.perf_counter() - t0))
                block[f"{name}_ms"] = round(statistics.median(times), 1)
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
