"""Validate the acceptance estimator against real speculative decoding on the embedded SmolLM2 target.

For each drafter (the target cut to k layers: first k, or k evenly spaced; re-indexed
layer_idx, config.num_hidden_layers updated), on the same prompts:

- estimator: one teacher-forced drafter pass over the target's traces -> expected
  tokens per step at each gamma, and the time it took (the target's trace is built
  once and shared by every drafter, as in a search);
- real: draftnas's speculative loop at each gamma, measured tokens per step (new
  tokens / target verification passes), wall time, and whether every output equals
  the target's greedy output (lossless).

Goals (issue 4): greedy estimate within 1% relative of measured (it should be exact
up to float noise), estimator >= 20x faster than real decoding. With --temperature T
the traces and decoding are sampled: the estimate (sum of min(p, q) over the stored
top-k, upper bound with the leftover mass) is compared with one stochastic run.

    python benchmarks/validate_acceptance.py                       # ~5-10 min on 2 CPU cores
    python benchmarks/validate_acceptance.py --per-domain 4 --max-new-tokens 96 --gammas 1,2,4,8
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def truncate(model, layers: list[int]):
    """A copy of `model` keeping only `layers` (re-indexed 0..k-1; config updated)."""
    import torch

    small = copy.deepcopy(model)
    small.model.layers = torch.nn.ModuleList([small.model.layers[i] for i in layers])
    for i, layer in enumerate(small.model.layers):
        layer.self_attn.layer_idx = i
    small.config.num_hidden_layers = len(layers)
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = [small.config.layer_types[i] for i in layers]
    return small.eval()


def drafter_layers(spec: str, num_layers: int) -> list[int]:
    """'first4' -> [0..3]; 'even8' -> 8 evenly spaced layers including the first and last."""
    kind, k = spec.rstrip("0123456789"), int(spec[len(spec.rstrip("0123456789")):])
    if kind == "first":
        return list(range(k))
    if kind == "even":
        return sorted({round(i * (num_layers - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]
    raise SystemExit(f"drafter spec {spec!r}: expected firstK or evenK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="all")
    ap.add_argument("--per-domain", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--drafters", default="first4,first8,first16,first24,even24")
    ap.add_argument("--gammas", default="4", help="gammas decoded for real (the estimate covers 1..8)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy (exact); T > 0 = speculative sampling")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()

    import torch

    from draftnas.acceptance.estimate import estimate_acceptance
    from draftnas.acceptance.records import TraceOptions
    from draftnas.acceptance.traces import load_traces
    from draftnas.acceptance.tracing import build_traces
    from draftnas.core.prompts import load_prompts
    from draftnas.models.sources import load_model
    from draftnas.models.speculative import speculative_generate

    if args.threads:
        torch.set_num_threads(args.threads)
    gammas = [int(g) for g in args.gammas.split(",")]
    loaded = load_model(args.target)
    target = loaded.model
    prompts = load_prompts(args.prompts, per_domain=args.per_domain)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        path = build_traces(loaded, prompts, TraceOptions(max_new_tokens=args.max_new_tokens, batch_size=8,
                                                          temperatures=(args.temperature,)),
                            Path(tmp) / "traces.safetensors", prompt_set=args.prompts)
        trace_s = time.perf_counter() - started
        traces = load_traces(path)
    eos = traces.metadata.eos_token_ids
    print(f"target {args.target}: {len(prompts)} prompts x <= {args.max_new_tokens} new tokens "
          f"({traces.n_tokens} tokens) traced once in {trace_s:.1f} s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    rows = []
    for spec in args.drafters.split(","):
        layers = drafter_layers(spec, target.config.num_hidden_layers)
        drafter = truncate(target, layers)
        kw = {"max_gamma": 8, "temperature": args.temperature}
        estimate_acceptance(drafter, traces, **kw)  # warm-up (allocator, kernels)
        est = estimate_acceptance(drafter, traces, **kw)
        for gamma in gammas:
            tokens = steps = 0
            lossless = True
            started = time.perf_counter()
            for i, rec in enumerate(traces.records):
                out = speculative_generate(target, drafter, rec.prompt_ids.tolist(), gamma=gamma,
                                           max_new_tokens=args.max_new_tokens, eos_token_ids=eos,
                                           temperature=args.temperature,
                                           generator=torch.Generator().manual_seed(i))
                lossless &= out.tokens == rec.continuation_ids.tolist()
                tokens += len(out.tokens)
                steps += out.steps
            real_s = time.perf_counter() - started
            measured = tokens / steps
            predicted = est.tokens_per_step[str(gamma)]
            rows.append({
                "drafter": spec, "layers": len(layers), "gamma": gamma, "top1": est.top1_agreement,
                "predicted": predicted, "ci": [est.ci_low[str(gamma)], est.ci_high[str(gamma)]],
                "predicted_upper": est.tokens_per_step_upper[str(gamma)],
                "measured": measured, "rel_err": abs(predicted - measured) / measured,
                "estimator_s": est.elapsed_s, "real_s": real_s, "speed_ratio": real_s / est.elapsed_s,
                "lossless": lossless if args.temperature <= 0 else "n/a (sampling)",
                "all_gammas": est.tokens_per_step,
            })
            r = rows[-1]
            print(f"{spec:>8} ({r['layers']:2d} layers) gamma={gamma}: top-1 {r['top1']:.3f}  "
                  f"estimated {predicted:.4f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] (truncation upper bound "
                  f"{r['predicted_upper']:.4f})  measured {measured:.4f}  "
                  f"rel.err {100 * r['rel_err']:.2f}%  estimator {r['estimator_s']:.2f} s vs decoding "
                  f"{real_s:.1f} s ({r['speed_ratio']:.0f}x)  lossless {r['lossless']}", flush=True)
    print("\n| drafter | layers | gamma | top-1 | estimated tok/step [95% CI] | measured tok/step "
          "| rel. error | estimator s | real decoding s | ratio | lossless |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['drafter']} | {r['layers']} | {r['gamma']} | {r['top1']:.3f} | {r['predicted']:.4f} "
              f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {r['measured']:.4f} | {100 * r['rel_err']:.2f}% | "
              f"{r['estimator_s']:.2f} | {r['real_s']:.1f} | {r['speed_ratio']:.0f}x | {r['lossless']} |")
    worst = max(r["rel_err"] for r in rows)
    slowest = min(r["speed_ratio"] for r in rows)
    print(f"\nworst relative error {100 * worst:.3f}% (goal <= 1% for greedy; a sampled run is one noisy "
          f"sample); smallest speed ratio {slowest:.0f}x (goal >= 20x); target trace (shared by all "
          f"drafters) {trace_s:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"trace_s": trace_s, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
