"""Why a bench's tokens per step differ from the estimator's on the same prompts, read from the accepts JSON
`draftnas bench --write-accepts` stores (draftnas's loop, first round, and the estimator's walk over the
target-alone continuation of each prompt). Nothing is run unless --paths is given.

Per prompt: new tokens and steps of the loop and of the walk, the first step where they part, and tokens
per step pooled over every prompt and over the prompts whose runs kept the same length (where greedy
speculative decoding in bf16 left the plain decode's output, the loop walked another text than the one the
estimate walked: an EOS met earlier or later changes a prompt's steps, not the drafter). Also the drafts
spent after the first rejected draft of a step (the confidence stop's waste), loop against walk.

--paths TARGET DRAFTER PROMPT_ID...: runs the drafter three ways over each prompt and the target's plain
continuation (bf16, static engine as the bench runs it): teacher-forced in one pass through transformers
with its own products (the estimate's path), in the static engine one token at a time from its cache (the
loop's), and in the static engine in one pass; prints how often their argmaxes agree and how far their
confidences (the stop's probability) lie apart.

    python benchmarks/loop_vs_estimate.py \
        benchmarks/results/cpu-intel-xeon-f6m167-qwen2.5-coder-1.5b-dense-prompt-accepts.json
    python benchmarks/loop_vs_estimate.py ACCEPTS.json --paths qwen2.5-coder-1.5b drafters/X math-011 code-001
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _parts(loop: list[tuple[int, int]], walk: list[tuple[int, int]]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(loop, walk, strict=False)) if a != b),
                None if len(loop) == len(walk) else min(len(loop), len(walk)))


def compare(path: Path) -> dict[str, Any]:
    traces = json.loads(path.read_text())["traces"]
    label = next(k for k in traces if not k.endswith("-estimate"))
    loop, walk = traces[label]["prompts"], traces[f"{label}-estimate"]["prompts"]
    rows, totals = [], {"all": [0, 0, 0, 0], "same length": [0, 0, 0, 0]}
    waste = [0, 0]
    for lp, wp in zip(loop, walk, strict=True):
        ls = list(zip(lp["accepted"], lp["drafted"], strict=True))
        ws = list(zip(wp["accepted"], wp["drafted"], strict=True))
        rows.append({"prompt": lp["prompt_id"], "loop_tokens": lp["new_tokens"],
                     "walk_tokens": wp["new_tokens"], "loop_steps": len(ls), "walk_steps": len(ws),
                     "first_step_apart": _parts(ls, ws)})
        keys = ["all"] + (["same length"] if lp["new_tokens"] == wp["new_tokens"] else [])
        for key in keys:
            t = totals[key]
            t[0] += lp["new_tokens"]
            t[1] += len(ls)
            t[2] += wp["new_tokens"]
            t[3] += len(ws)
        waste[0] += sum(d - a - 1 for a, d in ls if a < d)
        waste[1] += sum(d - a - 1 for a, d in ws if a < d)
    pooled = {k: {"loop": t[0] / max(t[1], 1), "walk": t[2] / max(t[3], 1)} for k, t in totals.items()}
    return {"prompts": rows, "tokens_per_step": pooled,
            "drafts_after_a_rejected_draft": {"loop": waste[0], "walk": waste[1]}}


def paths(target: str, drafter: str, prompt_ids: list[str]) -> list[dict[str, Any]]:
    import torch

    from draftnas.acceptance.estimate import _hidden_states, head_logits
    from draftnas.bench.arms import Bench
    from draftnas.bench.request_records import BenchOptions
    from draftnas.bench.run import load_for_bench
    from draftnas.core.prompts import load_prompts
    from draftnas.models.speculative import greedy_decode

    options = BenchOptions(dtype="bf16", engine="static", rounds=1, hf_assisted=False, per_domain=100)
    t, drafters, kept, encoded, _ = load_for_bench(target, drafter, [], load_prompts("all"), options)
    d = drafters[0]
    bench = Bench(t, drafters, options)
    bench.build_engines(512)
    bench.prepare(encoded)
    tgt, dr = bench.engines["target"], bench.engines[d.label]
    ids_of = {p.id: ids for p, ids in zip(kept, encoded, strict=True)}
    out = []
    for pid in prompt_ids:
        ids = ids_of[pid]
        cont = greedy_decode(tgt, ids, max_new_tokens=64, eos_token_ids=bench.eos).tokens
        p, c = len(ids), len(cont)
        with torch.inference_mode():
            with d.own_products():
                hidden = _hidden_states(d.loaded.model, torch.tensor([ids + cont]))[0, p - 1:p + c - 1]
                teacher = head_logits(d.loaded.model, hidden)
            stepwise = [dr.forward(ids, 0, 1)[-1]] + [dr.forward([tok], p + j, 1)[-1] for j, tok in
                                                      enumerate(cont[:-1])]
            one_pass = dr.forward(ids + cont, 0, c + 1)[:-1]
        arg, conf = {}, {}
        for name, logits in (("estimate", teacher), ("loop", torch.stack(stepwise)), ("one_pass", one_pass)):
            probs = torch.softmax(logits.float(), -1)
            arg[name], conf[name] = probs.argmax(-1), probs.amax(-1)
        gap = (conf["estimate"] - conf["loop"]).abs()
        out.append({"prompt": pid, "positions": c,
                    "argmax_same_estimate_loop": int((arg["estimate"] == arg["loop"]).sum()),
                    "argmax_same_loop_one_pass": int((arg["loop"] == arg["one_pass"]).sum()),
                    "confidence_mean_abs_diff_estimate_loop": float(gap.mean()),
                    "confidence_max_abs_diff_estimate_loop": float(gap.max())})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("accepts", type=Path, help="an accepts JSON from bench --write-accepts")
    parser.add_argument("--paths", nargs="+", metavar="ARG",
                        help="TARGET DRAFTER PROMPT_ID...: run the drafter's three paths")
    args = parser.parse_args()
    result = compare(args.accepts)
    if args.paths:
        result["paths"] = paths(args.paths[0], args.paths[1], args.paths[2:])
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
