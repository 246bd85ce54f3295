"""Where transformers' assisted generation spends a step: the target's forward, the drafter's,
and the rest, with the linear layers plain and routed (draftnas.linears.route_linears).

    python benchmarks/hf_assisted_parts.py --draft drafters/L1bi-h9kv3-i1536-v4096 --gamma 1

Greedy, on prompts of the set the drafter folder was not healed on (as `draftnas bench` picks
them). Per arm: tokens/s of the target alone and of `generate(assistant_model=drafter)`, the
mean time of one target and one drafter forward, the tokens each is fed per call, and the time
per step outside both forwards. The routed arm also times one cached forward of the target over 1
and γ+1 tokens after the first prompt, in transformers and in draftnas's own decoder
(`decoder.StaticDecoder`, as `draftnas bench --engine static` runs it), to tell transformers'
per-forward cost from the products'. A reduced-head drafter answers assisted generation's
candidate calls with its own greedy loop (draftnas/hf_head.py); each arm also runs it with
`fast_assistant = False`, the candidates through transformers' generate, to show what that
loop saves. Prints JSON (also to --out).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from draftnas.export.folder import load_drafter


def main() -> None:
    import torch

    from draftnas.bench.arms import product_rows
    from draftnas.bench.run import unseen_prompts
    from draftnas.bench.terms import cached_forward_ms
    from draftnas.core.machine import host_fields, median_ms, print_figures
    from draftnas.core.prompts import load_prompts
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.linears import route_linears
    from draftnas.models.sources import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", required=True, help="a drafter folder")
    parser.add_argument("--gamma", type=int, default=1)
    parser.add_argument("--prompts", default="chat")
    parser.add_argument("--per-domain", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    target, drafter = load_model(args.target), load_drafter(args.draft)
    prompts, encoded, _ = unseen_prompts(load_prompts(args.prompts), target.tokenizer, [drafter],
                                         args.per_domain)
    config = drafter.model.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = args.gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    pad = target.tokenizer.pad_token_id or 0
    calls: dict[str, list[tuple[float, int]]] = {"target": [], "drafter": []}

    def timed(name: str, model: Any) -> None:
        def pre(module: Any, _args: Any, kwargs: Any) -> None:
            module._draftnas_started = time.perf_counter()

        def post(module: Any, _args: Any, kwargs: Any, _out: Any) -> None:
            fed = kwargs.get("input_ids")
            calls[name].append((time.perf_counter() - module._draftnas_started,
                                int(fed.shape[1]) if fed is not None else 0))

        model.register_forward_pre_hook(pre, with_kwargs=True)
        model.register_forward_hook(post, with_kwargs=True)

    timed("target", target.model)
    timed("drafter", drafter.model)

    def run(assisted: bool) -> dict[str, Any]:
        extra = {"assistant_model": drafter.model} if assisted else {}
        for v in calls.values():
            v.clear()
        tokens, elapsed = 0, 0.0
        steps: dict[str, list[tuple[float, int]]] = {"target": [], "drafter": []}  # prefills left out
        for ids in encoded:
            x = torch.tensor([ids])
            before = {k: len(v) for k, v in calls.items()}
            started = time.perf_counter()
            with torch.inference_mode():
                out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                            pad_token_id=pad, max_new_tokens=args.max_new_tokens, **extra)
            elapsed += time.perf_counter() - started
            tokens += out.shape[1] - len(ids)
            for k, v in calls.items():
                steps[k] += v[before[k] + 1:]
        inside = sum(t for v in calls.values() for t, _ in v)
        n_steps = max(len(steps["target"]), 1)
        return {
            "tokens_per_s": round(tokens / elapsed, 2),
            **{f"{k}_{what}": (round(statistics.mean(1e3 * t if what == "forward_ms" else n for t, n in v), 2)
                               if v else None)
               for k, v in steps.items() for what in ("forward_ms", "tokens_per_call")},
            "outside_forwards_ms_per_step": round(1e3 * (elapsed - inside) / n_steps, 2),
            "tokens_per_step": round(tokens / n_steps, 3),
        }

    def forwards_alone(prompt: list[int], rows: set[int]) -> dict[str, dict[str, float]]:
        """Median ms of one cached forward of the target over n new tokens after `prompt`:
        transformers (as routed now) and draftnas's static decoder over a preallocated cache."""
        decoder = StaticDecoder.from_hf(target.model, max_positions=len(prompt) + 64)
        decoder.matmul.prepare(rows)
        cache = decoder.new_cache(1, len(prompt) + 64)
        with torch.inference_mode():
            decoder(torch.tensor([prompt]), torch.arange(len(prompt)), cache, slots=len(prompt))

            def static(n: int) -> float:
                feed, at = torch.tensor([prompt[-n:]]), torch.arange(len(prompt), len(prompt) + n)
                return median_ms(lambda: decoder(feed, at, cache, keep=n, slots=len(prompt) + n), 15)

            ns = (1, args.gamma + 1)
            return {"transformers": {str(n): round(cached_forward_ms(target.model, prompt, n, 15), 2)
                                     for n in ns},
                    "static_decoder": {str(n): round(static(n), 2) for n in ns}}

    result: dict[str, Any] = {**host_fields(), "target": args.target, "draft": args.draft,
                              "gamma": args.gamma, "prompts": [p.id for p in prompts],
                              "max_new_tokens": args.max_new_tokens}
    rows = product_rows([len(ids) for ids in encoded], args.gamma)  # timed before the runs, as bench does
    for arm in ("plain", "routed"):
        routings = ([route_linears(m).prepare(rows) for m in (target.model, drafter.model)]
                    if arm == "routed" else [])
        prepared = [round(r.chooser.timing_s, 2) for r in routings]
        run(True)  # warm-up
        timing = sum(r.chooser.timing_s for r in routings)
        result[arm] = {"target_alone": run(False), "assisted": run(True)}
        if hasattr(drafter.model, "fast_assistant"):  # a reduced head: candidates through generate too
            drafter.model.fast_assistant = False
            result[arm]["assisted_candidates_through_generate"] = run(True)
            drafter.model.fast_assistant = True
        if routings:  # seconds spent timing the row counts beforehand, target and drafter
            result[arm]["choice_timing_s_before"] = {"rows": sorted(rows), "target": prepared[0],
                                                     "drafter": prepared[1]}
        result[arm]["choice_timing_s_in_runs"] = round(sum(r.chooser.timing_s for r in routings) - timing, 3)
        if arm == "routed":
            result[arm]["forward_alone_ms"] = forwards_alone(encoded[0], rows)
        for routing in routings:
            routing.detach()
        for key, name in (("speedup", "assisted"), ("speedup_candidates_through_generate",
                                                      "assisted_candidates_through_generate")):
            if name in result[arm]:
                result[arm][key] = round(result[arm][name]["tokens_per_s"]
                                         / result[arm]["target_alone"]["tokens_per_s"], 3)
    print_figures(result, args.out)


if __name__ == "__main__":
    main()
