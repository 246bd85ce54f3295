"""Load the embedded SmolLM2 twice into a fresh cache: first from GGUF (converts), then from the cache.

    python benchmarks/bench_load.py [--spec smollm2-135m]

Prints both wall times and their ratio (issue 2 goal: second load >= 3x faster).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", default="smollm2-135m")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftnas-cache-") as cache:
        os.environ["DRAFTNAS_CACHE"] = cache
        from draftnas.models.sources import load_model

        times = []
        for attempt in ("first (GGUF -> safetensors cache)", "second (from cache)"):
            start = time.perf_counter()
            loaded = load_model(args.spec)
            elapsed = time.perf_counter() - start
            times.append(elapsed)
            print(f"{attempt:36s} {elapsed:7.2f} s   from_cache={loaded.from_cache}")
            del loaded
        print(f"speed-up of the cached load: {times[0] / times[1]:.1f}x")


if __name__ == "__main__":
    main()
