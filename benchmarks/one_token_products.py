"""The batched loop's one-token steps (the target alone's decode, the drafter's draft step) with each product
taken as F.linear takes it ("before") and as one product of a [rows, in] view ("after",
`models.matmul.linear_2d`), interleaved, at each batch: F.linear on a [B, 1, in] input with an odd stride
on its size-1 dimension broadcasts to a batched product that copies the weight once per sequence.

    python benchmarks/one_token_products.py --batches 8,16,32 --rounds 5

Random weights of the real shapes (bf16 where the CPU has bf16 instructions, else fp32), B prompts of 8
tokens, 16 new tokens. Prints JSON: per model and batch, decode tokens/s before and after (medians with
95% intervals over rounds) and after / before paired per round.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> None:
    import torch
    import torch.nn.functional as F

    from draftnas.core.intervals import median_interval
    from draftnas.core.machine import cpu_has_native_bf16, cpu_identity, load_average
    from draftnas.core.registry import get_architecture
    from draftnas.models import matmul
    from draftnas.models.batched import BatchedStatic, batched_greedy
    from draftnas.models.decoder import StaticDecoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b")
    parser.add_argument("--batches", default="8,16,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    dtype = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    after = matmul.linear_2d
    arms = {"before": lambda x, w: F.linear(x, w), "after": after}
    load = load_average()
    out: dict[str, dict[str, object]] = {}
    for name in args.models.split(","):
        decoder = StaticDecoder(get_architecture(name), dtype=dtype, device="cpu").init_random(0)
        for b in (int(v) for v in args.batches.split(",")):
            engine = BatchedStatic(decoder, b, 8 + args.new_tokens + 2)
            prompts = [[1 + i, 2, 3, 4, 5, 6, 7, 8] for i in range(b)]
            tps: dict[str, list[float]] = {k: [] for k in arms}
            for r in range(args.rounds + 1):  # the first round warms up every step width
                for arm in (list(arms) if r % 2 else list(arms)[::-1]):
                    matmul.linear_2d = arms[arm]  # type: ignore[assignment]
                    run = batched_greedy(engine, prompts, max_new_tokens=args.new_tokens)
                    if r:
                        tps[arm].append(run.decode_tokens_per_s)
            matmul.linear_2d = after
            ratio = [a / b_ for a, b_ in zip(tps["after"], tps["before"], strict=True)]
            out[f"{name} B={b}"] = {k: [round(v, 2) for v in median_interval(t)] for k, t in tps.items()} | {
                "after / before": [round(v, 3) for v in median_interval(ratio)]}
            print(f"{name} B={b}: {out[f'{name} B={b}']}", file=sys.stderr, flush=True)
    print(json.dumps({"host": cpu_identity().label(), "threads": torch.get_num_threads(), "dtype": str(dtype),
                      "load_average_before": load, "rounds": args.rounds, "new_tokens": args.new_tokens,
                      "decode_tokens_per_s": out}, indent=1))


if __name__ == "__main__":
    main()
