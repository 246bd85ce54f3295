"""Run inside vLLM's own virtualenv (it does not import draftnas): one engine, the prompts of a job, timed
request by request (a group submitted together is prefilled in one step, `_together`), and vLLM's
speculative-decoding counters. `python vllm_driver.py JOB.json OUT.json`.
A job with `check` (a list of speculative_config) starts no engine: vLLM reads each into its engine
arguments and says whether it takes it.

The job (JSON): model (a folder), dtype, prompts (lists of token ids), max_tokens, rounds, seed,
speculative_config (or null), max_model_len, kv_cache_gb, enforce_eager, batches (default [1]: each prompt
alone, one request at a time; B > 1: B prompts cycled from the list, submitted together), extend (after
the timed requests, each prompt once more, untimed, with this many more tokens), ignore_eos, time_forwards
(each model forward and head inside vLLM's engine process timed: the target's and the drafter's, with the
rows each read; the engine's own calls, wrapped through `collective_rpc`). The output:
vLLM's version, the load seconds, per round each group's batch, new token ids per sequence, seconds and the
engine's counters it added (drafts, draft tokens, accepted tokens, accepted per draft position) and, with
time_forwards, its forwards ([model or model-logits, rows, seconds], in order), and the
counters over all measured requests, and the extended outputs. Greedy (temperature 0); prefix caching
off, so a repeated prompt is computed again.
"""

from __future__ import annotations

import json
import os
import sys
import time

TOTALS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
FORWARDS = "_draftnas_forwards"  # where the engine process keeps its timed forwards (a builtins entry)


def _install_timers(worker) -> int:
    """In vLLM's engine process: time each forward and each head (`compute_logits`) of the target and, where
    one runs, the drafter (and an eagle3 head's fc over the target's states, `draft-fc`), with the rows it
    read (CPU calls return when done; on CUDA each is synchronized). Returns the models wrapped."""
    import builtins

    import torch

    kept = builtins.__dict__.setdefault(FORWARDS, [])
    runner = worker.model_runner
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def wrap(module, name: str, role: str, first) -> None:
        plain = getattr(module, name)

        def timed(*args, **kwargs):
            synchronize()
            t0 = time.perf_counter()
            out = plain(*args, **kwargs)
            synchronize()
            rows = first(args, kwargs)
            kept.append([role, int(rows.shape[0]) if rows is not None else 0, time.perf_counter() - t0])
            return out

        setattr(module, name, timed)

    def models():
        yield runner.model, "target"
        drafter = getattr(getattr(runner, "drafter", None), "model", None)
        if drafter is not None:
            yield drafter, "draft"

    wrapped = 0
    for model, role in models():  # vLLM's forward stops at the last hidden states; its head is compute_logits
        wrap(model, "forward", role, lambda a, k: k.get("input_ids", a[0] if a else None))
        wrap(model, "compute_logits", f"{role}-logits",
             lambda a, k: k.get("hidden_states", a[0] if a else None))
        if role == "draft" and hasattr(model, "combine_hidden_states"):  # an eagle3 head's fc, once a step
            wrap(model, "combine_hidden_states", "draft-fc",
                 lambda a, k: k.get("hidden_states", a[0] if a else None))
        wrapped += 1
    return wrapped


def _take_forwards(worker) -> list:
    """In vLLM's engine process: the forwards timed since the last call, forgotten there."""
    import builtins

    kept = builtins.__dict__.setdefault(FORWARDS, [])
    out = list(kept)
    kept.clear()
    return out


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


def _check(job: dict) -> dict:
    """Each speculative_config of `job["check"]` read by vLLM's own engine arguments, no weights loaded: None
    where vLLM takes it, else its refusal (its first line); and the max_num_seqs vLLM would serve with."""
    from vllm import __version__
    from vllm.engine.arg_utils import EngineArgs

    said: list = []
    most = None
    for config in job["check"]:
        try:
            engine = EngineArgs(model=job["model"], dtype=job.get("dtype", "float32"),
                                max_model_len=job.get("max_model_len", 2048), enforce_eager=True,
                                speculative_config=config, enable_prefix_caching=False).create_engine_config()
            most = engine.scheduler_config.max_num_seqs
            said.append(None)
        except Exception as e:  # noqa: BLE001 (vLLM's refusal, whatever it raises, is the answer)
            errors = getattr(e, "errors", None)  # pydantic's: the messages, not its heading
            said.append("; ".join(str(x.get("msg", x)) for x in errors()) if callable(errors)
                        else (str(e).strip().splitlines() or [type(e).__name__])[0])
    return {"vllm": __version__, "checks": said, "max_num_seqs": most}


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    if "check" in job:
        with open(out_path, "w") as f:
            json.dump(_check(job), f)
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gb", 2)))
    timing = bool(job.get("time_forwards"))
    if timing:  # the timers are functions sent to the engine process, which vLLM pickles only when told
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams, TokensPrompt, __version__

    started = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job.get("dtype", "float32"), seed=job.get("seed", 0),
              max_model_len=job.get("max_model_len", 2048), enforce_eager=job.get("enforce_eager", True),
              max_num_seqs=max(job.get("batches", [1])), speculative_config=job.get("speculative_config"),
              enable_prefix_caching=False, disable_log_stats=False)
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"],
                            ignore_eos=job.get("ignore_eos", False))
    wrapped = llm.collective_rpc(_install_timers)[0] if timing else 0
    llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])], params, use_tqdm=False)  # warm-up
    if timing:
        llm.collective_rpc(_take_forwards)
    before = _counters(llm)
    rounds = []
    for _ in range(job.get("rounds", 1)):
        runs = []
        for group in _groups(job["prompts"], job.get("batches", [1])):
            was = _counters(llm)
            t0 = time.perf_counter()
            outs = _together(llm, [TokensPrompt(prompt_token_ids=ids) for ids in group], params)
            seconds = time.perf_counter() - t0
            runs.append({"batch": len(group), "seconds": seconds, "counters": _delta(_counters(llm), was),
                         "tokens": [list(o.outputs[0].token_ids) for o in outs]}
                        | ({"forwards": llm.collective_rpc(_take_forwards)[0]} if timing else {}))
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
        json.dump({"vllm": __version__, "load_s": load_s, "timed_models": wrapped, "rounds": rounds,
                   "counters": totals,
                   "extended": extended}, f)


def _together(llm, prompts: list, params) -> list:
    """The outputs of `prompts` submitted together, in order. vLLM's engine runs in its own process and
    steps as soon as a request reaches it, so a group sent one request after another is often prefilled
    over two steps; with more than one, the engine's scheduler is paused (`keep`: it queues what arrives
    and does not step) until every request has been sent, and the group is prefilled in one step."""
    pause = getattr(llm.llm_engine.engine_core, "call_utility", None)  # absent in-process: no race there
    if len(prompts) == 1 or pause is None:
        return llm.generate(prompts, params, use_tqdm=False)
    pause("pause_scheduler", "keep", False)
    try:
        llm.enqueue(prompts, params, use_tqdm=False)
    finally:
        pause("resume_scheduler")
    return llm.wait_for_completion(use_tqdm=False)


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
