"""Dense against int8 weights for a drafter-sized stack: the linear layers' products, and a decode step.

For a registry shape (default Qwen2.5-Coder-0.5B, the drafter of the Qwen pair), random weights:
- the products of every layer's seven linear layers at 1..4 rows, F.linear in the dtype against
  `torch._weight_int8pack_mm` (weight-only int8, one scale per output row), interleaved, fastest pass;
- draftnas's static decoder decoding one token after a 128-token context, dense against
  `StaticDecoder.quantize_weights()`, interleaved, median of the repeats.

The kernels differ between hosts (FIELD-NOTES): compare only figures of one run on one host.

    python benchmarks/int8_weights.py --arch qwen2.5-coder-0.5b --dtype bf16 --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    import torch
    import torch.nn.functional as F

    from draftnas.core.machine import host_fields, print_figures
    from draftnas.core.registry import get_architecture
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.matmul import quantize_int8
    from draftnas.models.records import TORCH_DTYPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    before = host_fields()
    arch = get_architecture(args.arch)
    dtype = getattr(torch, TORCH_DTYPES[args.dtype])
    h, q, kv, inter = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
    gen = torch.Generator().manual_seed(0)
    dense = [[torch.randn(o, i, generator=gen).mul_(0.02).to(dtype) for o, i in shapes]
             for _ in range(arch.num_hidden_layers)]
    packed = [[quantize_int8(w) for w in layer] for layer in dense]

    def linear(x: torch.Tensor) -> None:
        for layer in dense:
            for w in layer:
                F.linear(x[:, :w.shape[1]], w)

    def int8(x: torch.Tensor) -> None:
        for layer in packed:
            for values, scales in layer:
                torch._weight_int8pack_mm(x[:, :values.shape[1]].contiguous(), values, scales)

    products: dict[str, dict[str, float]] = {}
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, max(h, q, inter), generator=gen).to(dtype)
        times: dict[str, list[float]] = {"dense": [], "int8": []}
        for i in range(args.repeats + 2):
            for name, fn in (("dense", linear), ("int8", int8)):
                started = time.perf_counter()
                fn(x)
                if i >= 2:
                    times[name].append(1000 * (time.perf_counter() - started))
        products[str(rows)] = {name: round(min(t), 2) for name, t in times.items()}

    def fresh() -> StaticDecoder:
        return StaticDecoder(arch, dtype=dtype, device="cpu", max_positions=256).init_random(0).eval()

    decoders = {"dense": fresh(), "int8": fresh()}
    decoders["int8"].quantize_weights()
    context = 128
    step: dict[str, list[float]] = {name: [] for name in decoders}
    with torch.inference_mode():
        caches = {name: d.new_cache(1, context + 1) for name, d in decoders.items()}
        for name, d in decoders.items():
            d(torch.randint(0, arch.vocab_size, (1, context), generator=gen), torch.arange(context),
              caches[name])
            d.matmul.prepare([1])
        token, position = torch.tensor([[7]]), torch.tensor([context])
        for i in range(args.repeats + 2):
            for name, d in decoders.items():
                started = time.perf_counter()
                d(token, position, caches[name])
                if i >= 2:
                    step[name].append(1000 * (time.perf_counter() - started))
    print_figures({
        **before, "arch": arch.name, "dtype": args.dtype, "repeats": args.repeats,
        "layer_products_ms_by_rows": products,
        "decode_step_ms": {name: round(statistics.median(t), 2) for name, t in step.items()},
        "int8_over_dense_decode": round(
            statistics.median(step["int8"]) / statistics.median(step["dense"]), 3),
    }, args.json)


if __name__ == "__main__":
    main()
