"""The speculative loop's two engines, side by side on one host: step times against the
memory-bandwidth bound, and whole speculative runs (tokens/s, lossless).

What it measures, in one process, interleaved:

1. the host's read bandwidth (`measure_read_bandwidth_gb_s`: streaming a 1 GiB buffer);
2. the target's decode (1 token) and verify (2..6 tokens) after a 128-token context, in
   transformers' eager forward over a DynamicCache ("hf") and in draftnas's static-cache
   decoder ("static"; CUDA graphs on a GPU), each against the bound = bytes of the
   weights one step reads (every layer's matrices and the LM head) / read bandwidth;
3. greedy decoding of the target alone and speculative decoding with a drafter (the
   target's first k layers, or an exported drafter folder), in both engines, prompt by
   prompt in rotating order; each output is compared with the target's own greedy
   output in the same engine.

    python benchmarks/loop_engines.py --target smollm2-135m --draft-layers 1 --gamma 3
    python benchmarks/loop_engines.py --target gemma-3-270m --draft-layers 6 --gamma 2 --json out.json
    python benchmarks/loop_engines.py --device cuda --dtype bf16 ...   (on a GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from draftnas.export.folder import load_drafter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def step_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: every layer's tensors, the final norm, the LM head
    (the input embedding is read one row per token)."""
    head = model.get_output_embeddings().weight
    inner = model.get_decoder()
    tensors = [p for layer in inner.layers for p in layer.parameters()] + list(inner.norm.parameters())
    return sum(p.numel() * p.element_size() for p in tensors) + head.numel() * head.element_size()


def _time_ms(fn: Any, device: str, repeats: int) -> float:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for i in range(repeats + 2):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        if i >= 2:
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def step_times(model: Any, engine: Any, device: str, repeats: int,
               context: int = 128) -> dict[str, dict[int, float]]:
    """Median ms of a T-token step after `context` tokens, for T = 1..6, in both engines."""
    import torch
    from transformers import DynamicCache

    ids = torch.randint(100, 1000, (context + 6,), generator=torch.Generator().manual_seed(0)).tolist()
    out: dict[str, dict[int, float]] = {"hf": {}, "static": {}}
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=torch.tensor([ids[:context]], device=device), past_key_values=cache)
        engine.forward(ids[:context], 0, 1)
        for t in range(1, 7):
            new = ids[context:context + t]

            def hf(new: list[int] = new) -> None:
                model(input_ids=torch.tensor([new], device=device), past_key_values=cache,
                      logits_to_keep=len(new))
                cache.crop(-len(new))

            out["hf"][t] = _time_ms(hf, device, repeats)
            out["static"][t] = _time_ms(lambda new=new: engine.forward(new, context, len(new)), device,
                                        repeats)
    return out


def _drafter(target: Any, layers: int, folder: str | None, load: dict[str, str]) -> Any:
    from draftnas.drafter.prune.plan import base_architecture
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PruningPlan
    from draftnas.drafter.vocab import maybe_apply_saved_subset

    if folder:
        loaded = load_drafter(folder, **load)
        maybe_apply_saved_subset(loaded.model, folder)
        return loaded.model
    base = base_architecture(target)
    plan = PruningPlan(base=base.name, base_num_layers=base.num_hidden_layers, layers=tuple(range(layers)),
                       layer_selection="first", num_attention_heads=base.num_attention_heads,
                       num_key_value_heads=base.num_key_value_heads, intermediate_size=base.intermediate_size)
    return apply_plan(target, plan)


def main() -> None:
    import torch

    from draftnas.acceptance.traces import eos_token_ids
    from draftnas.core.prompts import encode_prompt, load_prompts
    from draftnas.latency.measure import measure_read_bandwidth_gb_s
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine
    from draftnas.models.sources import load_model
    from draftnas.models.speculative import greedy_decode, speculative_generate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft-layers", type=int, default=1, help="drafter = the target's first k layers")
    ap.add_argument("--draft", default=None, help="or an exported drafter folder")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--per-domain", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=9, help="timed repeats per step size")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = {"dtype": DTYPES[args.dtype], "device": args.device}
    host = _host(args.device)
    bandwidth = measure_read_bandwidth_gb_s(args.device)
    target = load_model(args.target, **load)
    drafter = _drafter(target.model, args.draft_layers, args.draft, load)
    prompts = load_prompts("all", per_domain=args.per_domain)
    encoded = [encode_prompt(target.tokenizer, p.text) for p in prompts]
    slots = max(len(e) for e in encoded) + args.max_new_tokens + args.gamma + 8
    capture = args.device == "cuda"
    t_slots = max(slots, 256)  # the step timings need 128 + 6
    t_static = StaticEngine(StaticDecoder.from_hf(target.model, max_positions=t_slots), t_slots,
                            capture=capture)
    d_static = StaticEngine(StaticDecoder.from_hf(drafter, max_positions=slots), slots, capture=capture)
    bound_ms = step_bytes(target.model) / (bandwidth * 1e9) * 1e3
    steps = step_times(target.model, t_static, args.device, args.repeats)
    eos = eos_token_ids(target.model, target.tokenizer)
    runs = _runs(target.model, drafter, t_static, d_static, encoded, args, eos, greedy_decode,
                 speculative_generate)
    result = {"host": host, "device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads(),
              "target": args.target, "drafter": args.draft or f"first {args.draft_layers} layers",
              "gamma": args.gamma, "read_bandwidth_gb_s": bandwidth,
              "step_weight_bytes": step_bytes(target.model), "bound_ms": bound_ms, "step_ms": steps,
              "prompts": len(encoded), "max_new_tokens": args.max_new_tokens, **runs}
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def _runs(target: Any, drafter: Any, t_static: Any, d_static: Any, encoded: list[list[int]], args: Any,
          eos: tuple[int, ...], greedy_decode: Any, speculative_generate: Any) -> dict[str, Any]:
    """Target alone and speculative, in both engines, interleaved with a rotating order."""
    def alone(model: Any) -> Any:
        return lambda ids: greedy_decode(model, ids, max_new_tokens=args.max_new_tokens, eos_token_ids=eos)

    def spec(t: Any, d: Any) -> Any:
        return lambda ids: speculative_generate(t, d, ids, gamma=args.gamma,
                                                max_new_tokens=args.max_new_tokens, eos_token_ids=eos)

    methods = {"hf_target": alone(target), "hf_loop": spec(target, drafter),
               "static_target": alone(t_static), "static_loop": spec(t_static, d_static)}
    for run in methods.values():  # warm-up (captures the graphs on CUDA)
        run(encoded[0])
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    lossless = {"hf_loop": 0, "static_loop": 0}
    steps = dict.fromkeys(lossless, 0)
    names = list(methods)
    for i, ids in enumerate(encoded):
        out = {}
        for name in names[i % 4:] + names[:i % 4]:
            started = time.perf_counter()
            out[name] = methods[name](ids)
            seconds[name] += time.perf_counter() - started
            tokens[name] += len(out[name].tokens)
        for loop, ref in (("hf_loop", "hf_target"), ("static_loop", "static_target")):
            lossless[loop] += out[loop].tokens == out[ref].tokens
            steps[loop] += out[loop].steps
    tps = {k: tokens[k] / seconds[k] for k in methods}
    return {"tokens_per_s": tps, "speedup_hf": tps["hf_loop"] / tps["hf_target"],
            "speedup_static": tps["static_loop"] / tps["static_target"],
            "static_loop_vs_hf_loop": tps["static_loop"] / tps["hf_loop"],
            "tokens_per_step": {k: tokens[k] / max(steps[k], 1) for k in steps},
            "lossless_prompts": {k: f"{v}/{len(encoded)}" for k, v in lossless.items()}}


def _host(device: str) -> str:
    import torch

    if device == "cuda":
        return str(torch.cuda.get_device_name())
    from draftnas.core.machine import cpu_model_name

    return f"{cpu_model_name()}, load average {os.getloadavg()[0]:.2f}"


def _print(r: dict[str, Any]) -> None:
    print(f"host: {r['host']} | {r['device']} {r['dtype']}, {r['threads']} threads | target {r['target']}, "
          f"drafter {r['drafter']}, gamma {r['gamma']}")
    print(f"read bandwidth {r['read_bandwidth_gb_s']:.1f} GB/s; one step reads "
          f"{r['step_weight_bytes'] / 1e6:.0f} MB "
          f"of weights -> bound {r['bound_ms']:.2f} ms")
    print("tokens  hf ms  static ms  static/bound  static/decode")
    dec = r["step_ms"]["static"][1]
    for t in range(1, 7):
        hf, st = r["step_ms"]["hf"][t], r["step_ms"]["static"][t]
        print(f"{t:>6}  {hf:>5.1f}  {st:>9.2f}  {st / r['bound_ms']:>12.2f}  {st / dec:>13.2f}")
    tps = r["tokens_per_s"]
    print(f"{r['prompts']} prompts x {r['max_new_tokens']} tokens: target alone hf {tps['hf_target']:.1f} "
          f"/ static "
          f"{tps['static_target']:.1f} tok/s; speculative hf {tps['hf_loop']:.1f} ({r['speedup_hf']:.3f}x) / "
          f"static {tps['static_loop']:.1f} ({r['speedup_static']:.3f}x); static loop / hf loop "
          f"{r['static_loop_vs_hf_loop']:.2f}x; tokens/step {r['tokens_per_step']}; lossless "
          f"{r['lossless_prompts']}")


if __name__ == "__main__":
    main()
