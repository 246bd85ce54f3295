"""Step times of draftnas's static decoder (random weights) at 1..N new tokens after a context:
the draft step, and the verify of gamma + 1 tokens, on this machine's kernels.

    python benchmarks/static_steps.py --target gemma-3-270m
    python benchmarks/static_steps.py --target gemma-3-270m --head-rows 8192   # a reduced draft head

Prints the median ms per token count (two rounds over the counts, 5 calls each, the first
dropped) and the matrix-product form the decoder chose per (rows, out, in).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import torch

    from draftnas.core.machine import cpu_model_name, load_average
    from draftnas.core.registry import get_architecture
    from draftnas.models.decoder import StaticDecoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gemma-3-270m")
    parser.add_argument("--head-rows", type=int, default=0, help="LM-head rows (default: the vocabulary)")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--tokens", default="1,2,3,4,5,6,9")
    args = parser.parse_args()
    arch = get_architecture(args.target)
    if args.head_rows:
        arch = arch.with_shape(vocab_size=args.head_rows)
    counts = [int(n) for n in args.tokens.split(",")]
    torch.manual_seed(0)
    dec = StaticDecoder(arch, dtype=torch.float32, device="cpu").init_random(0)
    ctx = args.context
    cache = dec.new_cache(1, ctx + max(counts))
    ms: dict[int, float] = {}
    with torch.inference_mode():
        dec(torch.randint(0, arch.vocab_size, (1, ctx)), torch.arange(ctx), cache, keep=1, slots=ctx)
        for _ in range(2):
            for n in counts:
                ids = torch.randint(0, arch.vocab_size, (1, n))
                positions = torch.arange(ctx, ctx + n)
                times = []
                for _ in range(5):
                    started = time.perf_counter()
                    dec(ids, positions, cache, keep=n, slots=ctx + n)
                    times.append(time.perf_counter() - started)
                ms[n] = round(statistics.median(times[1:]) * 1e3, 1)
    forms = {f"{k[0]}x{k[1]}x{k[2]}": [v, dec.matmul.padded.get(k, k[0])] for k, v in dec.matmul.form.items()}
    print(json.dumps({"host": cpu_model_name(), "threads": torch.get_num_threads(),
                      "load_average": load_average(), "target": args.target,
                      "head_rows": arch.vocab_size, "context": ctx, "step_ms": ms,
                      "form_and_rows_computed": forms}, indent=1))


if __name__ == "__main__":
    main()
