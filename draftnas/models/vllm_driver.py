"""Run inside vLLM's own virtualenv (it does not import draftnas): one engine, the prompts of a job, timed
request by request, and vLLM's speculative-decoding counters. `python vllm_driver.py JOB.json OUT.json`.

The job (JSON): model (a folder), dtype, prompts (lists of token ids), max_tokens, rounds, seed,
speculative_config (or null), max_model_len, kv_cache_gb, enforce_eager, batches (default [1]: each prompt
alone, one request at a time; B > 1: B prompts cycled from the list, submitted together), extend (after
the timed requests, each prompt once more, untimed, with this many more tokens). The output:
vLLM's version, the load seconds, per round each group's batch, new token ids per sequence, seconds and the
engine's counters it added (drafts, draft tokens, accepted tokens, accepted per draft position), and the
counters over all measured requests, and the extended outputs. Greedy (temperature 0); prefix caching
off, so a repeated prompt is computed again.
"""

from __future__ import annotations

import json
import os
import sys
import time

TOTALS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def _counters(llm) -> dict:
    """vLLM's spec-decode counters: totals, and accepted tokens per draft position."""
    out: dict = dict.fromkeys(TOTALS, 0) | {"accepted_per_pos": []}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:")
        if name.removeprefix("spec_decode_") in TOTALS:
            out[name.removeprefix("spec_decode_")] = int(metric.value)
        elif name == "spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = [int(v) for v in metric.values]
    return out


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gb", 2)))
    from vllm import LLM, SamplingParams, TokensPrompt, __version__

    started = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job.get("dtype", "float32"), seed=job.get("seed", 0),
              max_model_len=job.get("max_model_len", 2048), enforce_eager=job.get("enforce_eager", True),
              max_num_seqs=max(job.get("batches", [1])), speculative_config=job.get("speculative_config"),
              enable_prefix_caching=False, disable_log_stats=False)
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"],
                            ignore_eos=job.get("ignore_eos", False))
    llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])], params, use_tqdm=False)  # warm-up
    before = _counters(llm)
    rounds = []
    for _ in range(job.get("rounds", 1)):
        runs = []
        for group in _groups(job["prompts"], job.get("batches", [1])):
            was = _counters(llm)
            t0 = time.perf_counter()
            outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in group], params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            runs.append({"batch": len(group), "seconds": seconds, "counters": _delta(_counters(llm), was),
                         "tokens": [list(o.outputs[0].token_ids) for o in outs]})
        rounds.append(runs)
    totals = _delta(_counters(llm), before)
    extended = []
    if job.get("extend"):  # untimed: each prompt with `extend` more tokens (what drafts past the end meet)
        longer = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"] + job["extend"],
                                ignore_eos=job.get("ignore_eos", False))
        outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]], longer,
                            use_tqdm=False)
        extended = [list(o.outputs[0].token_ids) for o in outs]
    with open(out_path, "w") as f:
        json.dump({"vllm": __version__, "load_s": load_s, "rounds": rounds, "counters": totals,
                   "extended": extended}, f)


def _groups(prompts: list, batches: list) -> list:
    """The requests submitted together: at batch 1 each prompt alone; at batch B > 1 one group of B
    prompts, cycled from the list (vLLM's continuous batching runs them at once)."""
    out = []
    for b in batches:
        out += [[p] for p in prompts] if b == 1 else [[prompts[i % len(prompts)] for i in range(b)]]
    return out


def _delta(after: dict, before: dict) -> dict:
    """The counters' growth from `before` to `after`."""
    out = {k: after[k] - before[k] for k in TOTALS}
    earlier = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], earlier, strict=True)]
    return out


if __name__ == "__main__":  # vLLM spawns its engine in a new process, which re-imports this file
    main(sys.argv[1], sys.argv[2])
