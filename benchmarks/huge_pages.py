"""A decode step with and without transparent huge pages for torch's CPU allocations.

torch madvises its large CPU allocations as huge pages when THP_MEM_ALLOC_ENABLE=1 is set before its
first allocation; on a kernel whose THP mode is "madvise" nothing else gives them. Whether they make
the weight-streaming decode faster is what this measures (draftnas does not set it). Each setting
runs in its own process, alternating, `--rounds` times: draftnas's static decoder of a registry shape
(random weights) decoding 1 and `--rows` tokens after a 128-token context, median of the steps.

    python benchmarks/huge_pages.py --arch qwen2.5-coder-1.5b --dtype bf16 --json out.json
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from benchmarks.fresh_process import decoder_parser, prefilled, random_decoder, run_child, step_inputs


def child(arch_name: str, dtype_name: str, rows: int, steps: int) -> None:
    import torch

    arch, decoder = random_decoder(arch_name, dtype_name)
    context, times = 128, {1: [], rows: []}
    with torch.inference_mode():
        cache = prefilled(arch, decoder, context, rows)
        decoder.matmul.prepare(sorted(times))
        for i in range(steps + 2):
            for n in times:
                started = time.perf_counter()
                decoder(*step_inputs(context, n), cache)
                if i >= 2:
                    times[n].append(1000 * (time.perf_counter() - started))
    print(json.dumps({str(n): statistics.median(t) for n, t in times.items()}))


def main() -> None:
    parser = decoder_parser(__doc__.splitlines()[0], steps=10)
    parser.add_argument("--rows", type=int, default=5, help="tokens of the verify step timed beside a decode")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.child:
        child(args.arch, args.dtype, args.rows, args.steps)
        return

    from draftnas.core.machine import host_fields, print_figures

    before = host_fields()
    runs: dict[str, list[dict[str, float]]] = {"huge_pages": [], "default_pages": []}
    for _ in range(args.rounds):
        for name, value in (("huge_pages", "1"), ("default_pages", "0")):
            runs[name].append(run_child(__file__, ["--arch", args.arch, "--dtype", args.dtype, "--rows",
                                                   str(args.rows), "--steps", str(args.steps)],
                                        env={"THP_MEM_ALLOC_ENABLE": value}))
    thp_mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print_figures({
        **before, "arch": args.arch, "dtype": args.dtype, "steps": args.steps,
        "kernel_thp_mode": thp_mode.read_text().strip() if thp_mode.exists() else None,
        "step_ms_by_process": {name: [{k: round(v, 1) for k, v in r.items()} for r in rs]
                               for name, rs in runs.items()},
    }, args.json)


if __name__ == "__main__":
    main()
