"""Dense, int8, int4 and per-layer weight formats for a drafter-sized stack: the linear layers' products,
the LM head's, and a decode step.

For a registry shape (default Qwen2.5-Coder-0.5B, the drafter of the Qwen pair), random weights:
- the products of every layer's seven linear layers at 1..4 rows, and of the LM head at one row: F.linear in
  the dtype against `torch._weight_int8pack_mm` (weight-only int8, one scale per output row) and
  `torch._weight_int4pack_mm_for_cpu` (int4, a scale and zero point per 32 inputs), interleaved, fastest
  pass;
- draftnas's static decoder decoding one token after a 128-token context, dense against
  `StaticDecoder.quantize_weights(F)` for each format F (int8, int4, and int8 layers under an int4 head),
  interleaved, median of the repeats.

`--device cuda` (bf16): dense against int4 only (`torch._weight_int4pack_mm`; int8 is CPU-only here), the
products also at 11 rows (a γ-10 verify), and the decode step replayed from a captured CUDA graph as the
static engine runs it, with an int4 head alone under dense layers as a third format; each timing the median
of `--repeats` timed runs of `--inner` calls, the device synchronized around each.

The kernels differ between hosts (FIELD-NOTES): compare only figures of one run on one host.

    python benchmarks/weight_formats.py --arch qwen2.5-coder-0.5b --dtype bf16 --json out.json
    python benchmarks/weight_formats.py --device cuda --dtype bf16 --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import torch
    import torch.nn.functional as F

    from draftnas.core.machine import host_fields, print_figures
    from draftnas.core.registry import get_architecture
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.matmul import pack_int4, quantize_int8
    from draftnas.models.records import INT4_GROUP, TORCH_DTYPES
    from draftnas.models.static_step import StaticStep

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--inner", type=int, default=20, help="calls per timed run on CUDA")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and args.dtype != "bf16":
        parser.error("int4 on CUDA multiplies bf16 activations only: --dtype bf16")

    before = host_fields()
    arch = get_architecture(args.arch)
    dtype = getattr(torch, TORCH_DTYPES[args.dtype])
    h, q, kv, inter = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
    gen = torch.Generator().manual_seed(0)
    dense = [[torch.randn(o, i, generator=gen).mul_(0.02).to(args.device, dtype) for o, i in shapes]
             for _ in range(arch.num_hidden_layers)]
    head = torch.randn(arch.vocab_size, h, generator=gen).mul_(0.02).to(args.device, dtype)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def formats(weights: list[torch.Tensor]) -> dict[str, Any]:
        """Each format's product over `weights` (a list of [out, in] matrices) for an input x."""
        int8 = [] if cuda else [quantize_int8(w) for w in weights]
        int4 = [pack_int4(w) for w in weights]
        int4_mm = torch._weight_int4pack_mm if cuda else torch._weight_int4pack_mm_for_cpu

        def dense_fn(x: torch.Tensor) -> None:
            for w in weights:
                F.linear(x[:, :w.shape[1]], w)

        def int8_fn(x: torch.Tensor) -> None:
            for values, scales in int8:
                torch._weight_int8pack_mm(x[:, :values.shape[1]].contiguous(), values, scales)

        def int4_fn(x: torch.Tensor) -> None:
            for w, (values, scales) in zip(weights, int4, strict=True):
                int4_mm(x[:, :w.shape[1]].contiguous(), values, INT4_GROUP, scales)

        return {"dense": dense_fn, "int4": int4_fn} if cuda else {"dense": dense_fn, "int8": int8_fn,
                                                                  "int4": int4_fn}

    inner = args.inner if cuda else 1

    def timed_ms(fn: Any) -> float:
        """One timed run: `inner` calls, the device synchronized before and after; ms a call."""
        sync()
        started = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        return 1000 * (time.perf_counter() - started) / inner

    def fastest(fns: dict[str, Any], x: torch.Tensor) -> dict[str, float]:
        times: dict[str, list[float]] = {name: [] for name in fns}
        for i in range(args.repeats + 2):
            for name, fn in fns.items():
                took = timed_ms(lambda fn=fn: fn(x))
                if i >= 2:
                    times[name].append(took)
        return {name: round(min(t), 4 if cuda else 2) for name, t in times.items()}

    layers = formats([w for layer in dense for w in layer])
    row_counts = (1, 2, 3, 4, 11) if cuda else (1, 2, 3, 4)
    products = {str(rows): fastest(layers, torch.randn(rows, max(h, q, inter), generator=gen)
                                   .to(args.device, dtype)) for rows in row_counts}
    head_product = fastest(formats([head]), torch.randn(1, h, generator=gen).to(args.device, dtype))
    del dense, head, layers

    def fresh() -> StaticDecoder:
        return StaticDecoder(arch, dtype=dtype, device=args.device, max_positions=256).init_random(0).eval()

    names = ("dense", "int4", "attn=dense,mlp=dense,head=int4") if cuda else (
        "dense", "int8", "int4", "attn=int8,mlp=int8,head=int4")
    decoders = {name: fresh() for name in names}
    for name, d in decoders.items():
        if name != "dense":
            d.quantize_weights(name)
    context = 128
    step: dict[str, list[float]] = {name: [] for name in decoders}
    with torch.inference_mode():
        caches = {name: d.new_cache(1, context + 1) for name, d in decoders.items()}
        for name, d in decoders.items():
            d(torch.randint(0, arch.vocab_size, (1, context), generator=gen).to(args.device),
              torch.arange(context, device=args.device), caches[name])
            d.matmul.prepare([1])
        token = torch.tensor([[7]], device=args.device)
        position = torch.tensor([context], device=args.device)
        steps = {name: StaticStep(d, caches[name], token, position, capture=cuda)
                 for name, d in decoders.items()}
        for i in range(args.repeats + 2):
            for name, fn in steps.items():
                took = timed_ms(fn)
                if i >= 2:
                    step[name].append(took)
    print_figures({
        **before, "arch": arch.name, "device": args.device, "dtype": args.dtype, "repeats": args.repeats,
        "inner": inner, **({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__} if cuda else {}),
        "layer_products_ms_by_rows": products, "head_product_ms": head_product,
        "decode_step_ms": {name: round(statistics.median(t), 4 if cuda else 2) for name, t in step.items()},
        "over_dense_decode": {name: round(statistics.median(t) / statistics.median(step["dense"]), 3)
                              for name, t in step.items() if name != "dense"},
    }, args.json)


if __name__ == "__main__":
    main()
