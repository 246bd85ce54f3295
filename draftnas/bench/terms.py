"""Each latency the analytical model uses, timed alone on live models, and the aggregation of
repeated bench runs that e2e compares with the prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from draftnas.bench.fidelity_records import Measured, MeasuredTerms
from draftnas.bench.records import BenchResult
from draftnas.core.machine import median_ms
from draftnas.models.engines import crop_cache
from draftnas.models.hf_head import CACHE_ARG


def _device_and_sync(model: Any) -> tuple[Any, Any]:
    """The model's device, and what makes a clock read count its queued work (None on a CPU)."""
    device = next(model.parameters()).device
    return device, (torch.cuda.synchronize if device.type == "cuda" else None)


def cached_forward_ms(model: Any, prompt: list[int], new_tokens: int, repeats: int) -> float:
    """One cached forward over `new_tokens` tokens after `prompt` (cache cropped back each call), on
    the model's device."""

    device, sync = _device_and_sync(model)
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt], device=device), **{CACHE_ARG: cache}, use_cache=True,
              logits_to_keep=1)
        feed = torch.tensor([prompt[-new_tokens:] if len(prompt) >= new_tokens else [0] * new_tokens],
                            device=device)

        def step() -> None:
            model(input_ids=feed, **{CACHE_ARG: cache}, use_cache=True, logits_to_keep=new_tokens)
            crop_cache(cache, len(prompt))

        return median_ms(step, repeats, sync=sync)


def _prefill_ms(model: Any, prompt: list[int], repeats: int) -> float:
    device, sync = _device_and_sync(model)
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        return median_ms(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1), max(3, repeats // 3),
                         sync=sync)


def measure_terms(target: Any, drafter: Any, prompt_ids: Sequence[int], context_tokens: int,
                  gammas: Sequence[int], repeats: int, prompt_tokens: int) -> MeasuredTerms:
    """Each latency the analytical model uses, timed alone at `context_tokens` of KV cache."""
    ids = list(prompt_ids)
    context = (ids * (context_tokens // max(len(ids), 1) + 1))[:context_tokens]
    prompt = (ids * (prompt_tokens // max(len(ids), 1) + 1))[:prompt_tokens]
    return MeasuredTerms(
        context_tokens=context_tokens, draft_ms=cached_forward_ms(drafter, context, 1, repeats),
        target_ms=cached_forward_ms(target, context, 1, repeats),
        verify_ms={str(g): cached_forward_ms(target, context, g + 1, repeats) for g in sorted(set(gammas))},
        prefill_target_ms=_prefill_ms(target, prompt, repeats),
        prefill_draft_ms=_prefill_ms(drafter, prompt, repeats),
        prompt_tokens=prompt_tokens, repeats=repeats)


def summarize_bench(runs: Sequence[BenchResult], terms: MeasuredTerms) -> Measured:
    """Medians over repeats of the "draftnas" arm against the target alone; per-step and per-token
    times with the measured prefill taken out."""
    own = [p.run("draftnas") for r in runs for p in r.prompts]
    alone = [p.run("target") for r in runs for p in r.prompts]
    steps = max(sum(p.steps for p in own), 1)
    prefill_spec = (terms.prefill_target_ms + terms.prefill_draft_ms) * len(own)
    step_ms = (sum(p.seconds for p in own) * 1000.0 - prefill_spec) / steps
    target_token_ms = ((sum(p.seconds for p in alone) * 1000.0 - terms.prefill_target_ms * len(alone))
                       / max(sum(p.new_tokens for p in alone), 1))
    arms = [r.arm("draftnas") for r in runs]
    speedups = [a.speedup or 0.0 for a in arms]
    estimate = next((a.predicted_tokens_per_step for a in arms if a.predicted_tokens_per_step is not None),
                    None)
    return Measured(
        gamma=runs[0].gamma,
        target_tokens_per_s=statistics.median(r.arm("target").tokens_per_s for r in runs),
        tokens_per_s=statistics.median(a.tokens_per_s for a in arms),
        speedup=statistics.median(speedups), speedup_spread=(min(speedups), max(speedups)),
        tokens_per_step=statistics.median(a.tokens_per_step or 0.0 for a in arms),
        mean_accepted_per_step=statistics.median(a.mean_accepted_per_step or 0.0 for a in arms),
        bench_estimate_tokens_per_step=estimate,
        lossless=None if arms[0].lossless is None else all(bool(a.lossless) for a in arms),
        repeats=len(runs), step_ms=step_ms, target_token_ms=target_token_ms,
        drafted_per_step=sum(p.drafted for p in own) / steps)


def per_domain_measured(runs: Sequence[BenchResult], arm: str = "draftnas") -> dict[str, dict[str, float]]:
    """Tokens per step and acceptance of one arm per domain, over the runs' prompts."""
    by: dict[str, list[Any]] = {}
    ids: dict[str, set[str]] = {}
    for p in (p for r in runs for p in r.prompts):
        by.setdefault(p.domain, []).append(p.run(arm))
        ids.setdefault(p.domain, set()).add(p.prompt_id)
    return {d: {"tokens_per_step": sum(r.new_tokens for r in rs) / max(sum(r.steps for r in rs), 1),
                "acceptance_rate": sum(r.accepted for r in rs) / max(sum(r.drafted for r in rs), 1),
                "prompts": float(len(ids[d]))} for d, rs in sorted(by.items())}
