"""What bounds a CPU decode step: the target's matrix products alone, against the read bandwidth.

One decode (or verify) step multiplies every layer's weight matrices and the LM head by a few
rows. This times exactly those products, streaming every weight once per pass as a step does,
in the three forms the static decoder chooses between (`F.linear(x, W)`, `(W @ x.T).T` and
`x @ Wt` with Wt a contiguous copy of W's transpose), at
1..N rows, beside the host's read bandwidth (`profile.measure_read_bandwidth_gb_s`) and the
bound it gives: weight bytes / bandwidth. A step can be no faster than its fastest products;
the rest of a step (norms, attention, RoPE, Python) comes on top.

Beside them, the same products through numpy's BLAS (`W @ x.T` on the same memory; the draftnas
decoder never multiplies this way): where it is faster than torch's BLAS (MKL in torch's CPU wheels),
the products, not the bandwidth, bound a step on that host. Each form runs all its repeats in turn (the
first two untimed), so the two BLAS libraries' thread pools do not alternate inside a timing.

    python benchmarks/product_floor.py --target smollm2-135m
    python benchmarks/product_floor.py --target gemma-3-270m --rows 1,2,3,4,5 --json out.json

Prints one JSON object: host, threads, load, bandwidth, bound, and ms per form and row count (the median
of the timed passes, and their min and max).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

TORCH_FORMS = ("F.linear(x, W)", "(W @ x.T).T", "x @ Wt")  # the forms the decoder chooses between


def main() -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from draftnas.core.machine import host_fields, print_figures
    from draftnas.core.registry import get_architecture
    from draftnas.latency.measure import measure_read_bandwidth_gb_s
    from draftnas.models.decoder import StaticDecoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--rows", default="1,2,3,4,5")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    arch = get_architecture(args.target)
    dec = StaticDecoder(arch, dtype=torch.float32, device="cpu", matmul="off").init_random(0)
    weights = [w for shape_weights in dec.matmul.by_shape.values() for w in shape_weights]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    bandwidth = measure_read_bandwidth_gb_s()
    transposed = {id(w): w.T.contiguous() for w in weights}
    forms = {"F.linear(x, W)": lambda w, x: F.linear(x, w), "(W @ x.T).T": lambda w, x: torch.mm(w, x.T),
             "x @ Wt": lambda w, x: torch.mm(x, transposed[id(w)]),
             "numpy W @ x.T": lambda w, x: w.numpy() @ x.numpy().T}
    ms: dict[str, dict[int, float]] = {name: {} for name in forms}
    spread: dict[str, dict[int, list[float]]] = {name: {} for name in forms}  # the timed runs' min and max
    with torch.inference_mode():
        for rows in [int(r) for r in args.rows.split(",")]:
            inputs = {n: torch.randn(rows, n) for n in {int(w.shape[1]) for w in weights}}
            for name, fn in forms.items():
                times = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    for w in weights:
                        fn(w, inputs[int(w.shape[1])])
                    times.append(time.perf_counter() - started)
                timed = [t * 1e3 for t in times[2:]]
                ms[name][rows] = round(statistics.median(timed), 2)
                spread[name][rows] = [round(min(timed), 2), round(max(timed), 2)]
    bound_ms = nbytes / (bandwidth * 1e9) * 1e3
    fastest = {rows: min(ms[f][rows] for f in TORCH_FORMS) for rows in ms["F.linear(x, W)"]}  # torch's best
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    result = {**host_fields(), "target": args.target, "weight_mb": round(nbytes / 1e6, 1),
              "torch_blas": blas.group(1) if blas else "unknown",
              "numpy_blas": str(np.__config__.CONFIG["Build Dependencies"]["blas"].get("name", "unknown")),
              "read_bandwidth_gb_s": round(bandwidth, 1), "bound_ms": round(bound_ms, 2), "products_ms": ms,
              "products_ms_min_max": spread,
              "fastest_over_bound": {rows: round(t / bound_ms, 2) for rows, t in fastest.items()},
              "numpy_over_fastest_torch": {rows: round(ms["numpy W @ x.T"][rows] / t, 3)
                                           for rows, t in fastest.items()}}
    print_figures(result, args.json)


if __name__ == "__main__":
    main()
