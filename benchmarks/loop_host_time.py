"""Where the speculative loop's time goes beside the forwards: one step replayed bare against the same
step inside `greedy_decode` and `speculative_generate`, and the host operations a profiler counts.

On the H100 the search's calibration priced SmolLM2-135M's decode at 2.8 ms and a 1-layer drafter's
step at 0.2 ms, while the bench measured 4.5-5.0 ms per token for the target alone and 1.6-1.9 ms
per drafted token: this script separates the forward (a captured step replayed and synchronized)
from the loop around it. Random weights (a registry shape), so it needs no model files.

    python benchmarks/loop_host_time.py --device cuda --dtype fp16
    python benchmarks/loop_host_time.py --device cpu --dtype fp32 --tokens 16     (the same on a CPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from draftnas.core.registry import get_architecture
from draftnas.models.decoder import StaticDecoder
from draftnas.models.engines import StaticEngine
from draftnas.models.spec import DecoderSpec
from draftnas.models.speculative import greedy_decode, speculative_generate

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bare_step_ms(engine: StaticEngine, tokens: int, start: int, repeats: int) -> float:
    """Median wall ms of one engine forward of `tokens` tokens, synchronized (the calibration's view)."""
    feed = list(range(1, tokens + 1))
    engine.forward(feed, start, 1)
    times = []
    for _ in range(repeats):
        sync(engine.device.type)
        t = time.perf_counter()
        engine.forward(feed, start, 1)
        sync(engine.device.type)
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def prefill_ms(engine: StaticEngine, lengths: list[int], vocab: int) -> dict[str, float]:
    """A prompt's prefill at lengths this process has not met (first time: cold), then again (warm),
    synchronized: the cold-warm difference is what every new prompt length pays once."""
    cold, warm = [], []
    for n in lengths:
        feed = [(11 * i) % vocab for i in range(n)]
        for out in (cold, warm):
            sync(engine.device.type)
            t = time.perf_counter()
            engine.forward(feed, 0, 1)
            sync(engine.device.type)
            out.append(1000 * (time.perf_counter() - t))
    return {"cold_ms": statistics.median(cold), "warm_ms": statistics.median(warm)}


def per_token(runs: list[Any]) -> dict[str, float]:
    """Median ms per new token over runs, and per drafted token for speculative ones."""
    out = {"ms_per_token": statistics.median(1000 * r.elapsed_s / len(r.tokens) for r in runs)}
    if hasattr(runs[0], "draft_s"):
        out["draft_ms_per_drafted"] = statistics.median(1000 * r.draft_s / max(1, sum(r.drafted))
                                                        for r in runs)
    return out


def new_prompts(first_length: int, arch: Any) -> list[list[int]]:
    """Three prompts of lengths first_length .. +2 (lengths the process has not met)."""
    return [[(13 * i) % arch.vocab_size for i in range(n)] for n in range(first_length, first_length + 3)]


def top_host_ops(fn: Any, device: str, rows: int) -> list[dict[str, Any]]:
    """The operations taking the most host time while `fn` runs (self CPU time, calls)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        sync(device)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return [{"op": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1000, 2)}
            for e in events]


def through_transformers(decoder: StaticDecoder, slots: int) -> StaticDecoder:
    """`decoder` rebuilt the way `draftnas bench` builds its engines: a transformers model of the same
    shape and weights, converted back by `StaticDecoder.from_hf`."""
    import transformers

    arch = decoder.arch
    config = transformers.LlamaConfig(
        hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim, vocab_size=arch.vocab_size,
        tie_word_embeddings=decoder.lm_head.weight is decoder.embed_tokens.weight,
        rope_theta=decoder.spec.rope_theta, max_position_embeddings=slots)
    model = transformers.LlamaForCausalLM(config).to(device=decoder.device, dtype=decoder.dtype).eval()
    if decoder.lm_head.weight.shape[0] != arch.vocab_size:  # a reduced draft head
        model.lm_head = torch.nn.Linear(arch.hidden_size, decoder.lm_head.weight.shape[0], bias=False,
                                        device=decoder.device, dtype=decoder.dtype)
    return StaticDecoder.from_hf(model, max_positions=slots)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="smollm2-135m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--draft-head", type=int, default=8192, help="drafter's head rows (0: all)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per generation")
    ap.add_argument("--prompt", type=int, default=48, help="prompt tokens")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--from-hf", action="store_true",
                    help="build both decoders through transformers models, as `draftnas bench` does")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    arch = get_architecture(args.arch)
    dtype, device, capture = DTYPES[args.dtype], args.device, args.device == "cuda"
    slots = args.prompt + 32 + args.tokens + 16  # room for the longer prompts of new lengths
    target = StaticDecoder(arch, dtype=dtype, device=device, max_positions=slots).init_random(0).eval()
    small = DecoderSpec(arch=arch.with_shape(num_hidden_layers=args.draft_layers), head_rows=args.draft_head)
    drafter = StaticDecoder(small, dtype=dtype, device=device, max_positions=slots).init_random(1).eval()
    if args.from_hf:
        target, drafter = (through_transformers(m, slots) for m in (target, drafter))
    subset = list(range(args.draft_head)) if args.draft_head else None
    t_engine, d_engine = (StaticEngine(m, slots, capture=capture) for m in (target, drafter))
    prompt = [(7 * i) % arch.vocab_size for i in range(args.prompt)]
    out: dict[str, Any] = {"arch": args.arch, "device": device, "dtype": args.dtype,
                           "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "from_hf": args.from_hf, "draft_layers": args.draft_layers,
                           "draft_head": args.draft_head, "tokens": args.tokens}
    with torch.inference_mode():
        out["bare_ms"] = {"target_1": bare_step_ms(t_engine, 1, args.prompt, args.repeats),
                          "target_2": bare_step_ms(t_engine, 2, args.prompt, args.repeats),
                          "target_4": bare_step_ms(t_engine, 4, args.prompt, args.repeats),
                          "drafter_1": bare_step_ms(d_engine, 1, args.prompt, args.repeats),
                          "drafter_2": bare_step_ms(d_engine, 2, args.prompt, args.repeats)}

        def greedy() -> Any:
            return greedy_decode(t_engine, prompt, max_new_tokens=args.tokens)

        def spec(gamma: int) -> Any:
            return speculative_generate(t_engine, d_engine, prompt, gamma=gamma, max_new_tokens=args.tokens,
                                        vocab_subset=subset)

        for fn in (greedy, lambda: spec(1), lambda: spec(3)):  # warm-up: every step size captured
            fn()
        loops: dict[str, Any] = {}
        g = [greedy() for _ in range(3)]
        loops["greedy"] = per_token(g)
        for gamma in (1, 3):
            loops[f"speculative_g{gamma}"] = per_token([spec(gamma) for _ in range(3)])
        # prompts of lengths never met, as a bench's held-out prompts are: prefill and whole generations
        fresh = list(range(args.prompt + 1, args.prompt + 9))
        out["prefill"] = {"target": prefill_ms(t_engine, fresh[:4], arch.vocab_size),
                          "drafter": prefill_ms(d_engine, fresh[4:], arch.vocab_size)}
        loops["greedy_new_prompt_lengths"] = per_token(
            [greedy_decode(t_engine, p, max_new_tokens=args.tokens)
             for p in new_prompts(args.prompt + 11, arch)])
        loops["speculative_g1_new_prompt_lengths"] = per_token(
            [speculative_generate(t_engine, d_engine, p, gamma=1, max_new_tokens=args.tokens,
                                  vocab_subset=subset) for p in new_prompts(args.prompt + 21, arch)])
        out["loops"] = loops
        out["host_ops_greedy"] = top_host_ops(greedy, device, 12)
        out["host_ops_speculative_g1"] = top_host_ops(lambda: spec(1), device, 12)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
