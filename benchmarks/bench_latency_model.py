"""Predictions per second of the latency model (issue 3 goal: >= 10,000 per second).

    python benchmarks/bench_latency_model.py [--profile cpu] [--calls 200000]

Asks `LatencyModel.predict_ms` for a stream of varied shapes, batch sizes, gamma and
context lengths, the way a search does, and prints calls per second.
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="cpu",
                        help="shipped profile name (cpu, a100-80gb, h100-sxm, rtx-3090) or a JSON path")
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()

    from draftnas.core.registry import get_architecture
    from draftnas.latency.files import default_profile, load_profile
    from draftnas.latency.model import LatencyModel

    prof = load_profile(args.profile) if args.profile.endswith(".json") else default_profile(args.profile)
    model = LatencyModel.from_profile(prof)
    base = get_architecture("llama-7b")
    rng = random.Random(0)
    queries = []
    for _ in range(1000):  # pre-built so the loop times predict_ms only
        arch = base.with_shape(num_hidden_layers=rng.randint(1, 32),
                               num_attention_heads=rng.choice((8, 16, 32)),
                               intermediate_size=rng.choice((2752, 5504, 11008)))
        queries.append((arch, rng.choice((1, 2, 4, 8, 16, 32, 64)), rng.randint(1, 9),
                        rng.choice((128, 512, 2048)), rng.choice((None, 8192))))
    predict = model.predict_ms
    start = time.perf_counter()
    total = 0.0
    for i in range(args.calls):
        arch, batch, new, context, head = queries[i % len(queries)]
        total += predict(arch, batch_size=batch, new_tokens=new, context_tokens=context,
                         head_vocab_size=head)
    elapsed = time.perf_counter() - start
    rate = args.calls / elapsed
    print(f"profile: {prof.device_name} ({prof.kind}, {prof.dtype})")
    print(f"{args.calls} predictions in {elapsed:.3f} s: {rate:,.0f} predictions/s "
          f"({1e6 / rate:.2f} us each; goal >= 10,000/s: {'met' if rate >= 10_000 else 'NOT met'})")


if __name__ == "__main__":
    main()
