"""Two versions of the speculative loop, A/B in one process: this checkout's
`draftnas.models.speculative` and another file of it (e.g. from a worktree of an earlier commit).

Both run on the same static engines (one model load, the same product choices), prompt set by
prompt set, the order alternating every repeat; each run's output is compared with the other's
(greedy: they must match). Separate processes differ by more than a loop change does (each picks
its kernels on first meeting), so compare only within one run.

    git worktree add /tmp/old <commit>
    python benchmarks/loop_ab.py --other /tmp/old/draftnas/models/speculative.py \
        --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --dtype bf16 --repeats 6
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _load_other(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("draftnas_other_speculative", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--other {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    from draftnas.core.machine import host_fields, print_figures
    from draftnas.core.prompts import encode_prompt, load_prompts
    from draftnas.models import speculative as this
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine
    from draftnas.models.records import TORCH_DTYPES
    from draftnas.models.sources import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="another draftnas/models/speculative.py")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--prompts", default="code,chat,math", help="one prompt of each set")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    before = host_fields()
    other = _load_other(args.other)
    target = load_model(args.target, dtype=TORCH_DTYPES[args.dtype])
    draft = load_model(args.draft, dtype=TORCH_DTYPES[args.dtype])
    prompts = [list(load_prompts(s))[-1] for s in args.prompts.split(",")]
    ids = [encode_prompt(target.tokenizer, p.text) for p in prompts]
    slots = max(len(i) for i in ids) + args.max_new_tokens + args.gamma + 2
    engines = [StaticEngine(StaticDecoder.from_hf(m.model, max_positions=slots), slots)
               for m in (target, draft)]
    loops = {"this": this, "other": other}

    def run(loop: Any, new_tokens: int) -> tuple[float, list[list[int]]]:
        started, outs = time.perf_counter(), []
        for prompt in ids:
            out = loop.speculative_generate(*engines, prompt, gamma=args.gamma, max_new_tokens=new_tokens)
            outs.append(out.tokens)
        return time.perf_counter() - started, outs

    for loop in loops.values():
        run(loop, 8)  # warm-up: every step size met before anything is counted
    rates: dict[str, list[float]] = {name: [] for name in loops}
    same = True
    for rep in range(args.repeats):
        order = list(loops) if rep % 2 == 0 else list(reversed(loops))
        outputs = {}
        for name in order:
            seconds, outputs[name] = run(loops[name], args.max_new_tokens)
            rates[name].append(sum(len(o) for o in outputs[name]) / seconds)
        same &= outputs["this"] == outputs["other"]
    print_figures({
        **before, "target": args.target, "draft": args.draft, "dtype": args.dtype, "gamma": args.gamma,
        "prompts": [p.id for p in prompts], "max_new_tokens": args.max_new_tokens, "other": str(args.other),
        "tokens_per_s": {name: {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r}
                         for name, r in rates.items()},
        "same_tokens": same}, args.json)


if __name__ == "__main__":
    main()
