"""`draftnas bench`: real speculative decoding, measured beside the estimator's prediction.

Ways to decode the same prompts, interleaved prompt by prompt (the order rotates so
drift on a shared machine hits each alike), after one warm-up run each:

1. the target alone, in the loop's engine: transformers ``generate`` (engine "hf"), or
   draftnas's static-cache decoder decoding one token per step (engine "static"; on
   CUDA replayed from a CUDA graph);
2. draftnas's own speculative loop (`draftnas.models.speculative`) in that engine;
3. transformers' assisted generation ``generate(assistant_model=drafter)`` with a
   fixed gamma (``num_assistant_tokens=gamma``, schedule "constant", confidence
   threshold 0 on the drafter's generation config), beside transformers' own
   ``generate`` of the target alone (the same as 1. under engine "hf");
4. on CPU, the pair of 3. again with both models' linear layers routed through the
   product that timed fastest on this host (`draftnas.models.linears.route_linears`, what a
   transformers user can apply with one line), checked against that routed target.

Greedy runs are checked token for token against the target's own greedy output in
the same engine (``lossless`` per prompt; ``exact_match_rate`` overall). Where a
speculative run departs from it, the target's top-1 minus top-2 logit margin at
that token is recorded: in bf16/fp16 a verify pass over gamma + 1 tokens and a
one-token decode may round a near-tie differently (a margin near 0), which a bug
would not need. The estimator's prediction comes from a trace of the target's own
outputs on these prompts (one teacher-forced target pass for the top-k
probabilities) and one teacher-forced drafter pass.
"""


from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from draftnas.acceptance.estimate import estimate_acceptance
from draftnas.acceptance.records import TraceOptions
from draftnas.acceptance.traces import Traces, make_metadata, model_vocab_size, tokenizer_fingerprint
from draftnas.acceptance.tracing import record_from_continuation
from draftnas.bench.arms import Bench
from draftnas.bench.records import BenchOptions, BenchPrompt, BenchResult
from draftnas.core.errors import DeviceError, InvalidInputError
from draftnas.core.machine import cpu_model_name, load_average
from draftnas.core.prompts import Prompt, encode_prompt, subsample
from draftnas.core.provenance import package_versions
from draftnas.core.records import Progress
from draftnas.drafter.records import prompt_key
from draftnas.export.folder import exported_record, load_drafter
from draftnas.models.records import TORCH_DTYPES
from draftnas.models.sources import load_model

if TYPE_CHECKING:
    from draftnas.acceptance.traces import Traces
    from draftnas.models.sources import LoadedModel


log = logging.getLogger(__name__)





def _check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:

    t_fp, d_fp = tokenizer_fingerprint(target.tokenizer), tokenizer_fingerprint(draft.tokenizer)
    t_v, d_v = model_vocab_size(target.model), model_vocab_size(draft.model)
    if t_fp != d_fp or t_v != d_v:
        raise InvalidInputError(
            f"draft {draft.source.spec!r} (tokenizer {d_fp}, {d_v} ids) and target {target.source.spec!r} "
            f"(tokenizer {t_fp}, {t_v} ids) must share one tokenizer for speculative decoding"
        )


def _bench_prompt(bench: Bench, prompt: Prompt, ids: list[int], index: int) -> tuple[BenchPrompt, list[int]]:
    """One prompt through every decoder (order rotated by index); also returns the target's tokens."""
    methods = bench.methods()
    order = methods[index % len(methods):] + methods[:index % len(methods)]
    seed = bench.options.seed + index
    runs = {m: bench.run(m, ids, seed, bench.options.max_new_tokens) for m in order}
    ref, own, hf = runs["target"], runs["draftnas"], runs.get("hf_assisted")
    routed, routed_ref = runs.get("hf_routed"), runs.get("hf_routed_target")
    hf_ref = runs.get("hf_target", ref)
    greedy = bench.options.temperature <= 0
    divergence = _first_divergence(own.tokens, ref.tokens) if greedy else None
    margin = (ref.margins[divergence] if divergence is not None and ref.margins
              and divergence < len(ref.margins) else None)
    row = BenchPrompt(
        prompt_id=prompt.id, domain=prompt.domain, prompt_tokens=len(ids), new_tokens=len(ref.tokens),
        target_s=ref.elapsed_s, draftnas_s=own.elapsed_s, draftnas_tokens=len(own.tokens),
        steps=own.steps, accepted=own.accepted, drafted=own.drafted,
        lossless=(own.tokens == ref.tokens) if greedy else None,
        hf_assisted_s=hf.elapsed_s if hf else None, hf_assisted_tokens=len(hf.tokens) if hf else None,
        hf_steps=hf.steps if hf else None,
        hf_lossless=(hf.tokens == hf_ref.tokens) if (hf and greedy) else None,
        draft_s=own.draft_s, hf_target_s=runs["hf_target"].elapsed_s if "hf_target" in runs else None,
        first_divergence=divergence, divergence_margin=margin,
    )
    if routed is not None and routed_ref is not None:
        row = replace(row, hf_routed_target_s=routed_ref.elapsed_s,
                      hf_routed_target_tokens=len(routed_ref.tokens), hf_routed_s=routed.elapsed_s,
                      hf_routed_tokens=len(routed.tokens), hf_routed_steps=routed.steps,
                      hf_routed_lossless=(routed.tokens == routed_ref.tokens) if greedy else None)
    return row, ref.tokens


def _first_divergence(tokens: list[int], reference: list[int]) -> int | None:
    """Index of the first position where `tokens` departs from `reference` (None: identical)."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def bench_traces(target: LoadedModel, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
                 continuations: Sequence[list[int]], options: BenchOptions) -> Traces:
    """In-memory traces of the target's own outputs (one teacher-forced pass each for top-k)."""

    topts = TraceOptions(max_new_tokens=options.max_new_tokens, temperatures=(options.temperature,),
                         top_k=options.top_k, seed=options.seed)
    meta = make_metadata(target, prompts, topts, "bench")
    records = [record_from_continuation(target.model, p, ids, cont, temperature=options.temperature,
                                        top_k=options.top_k, eos_ids=meta.eos_token_ids)
               for p, ids, cont in zip(prompts, encoded, continuations, strict=True) if cont]
    return Traces(replace(meta, n_records=len(records)), records)


def _summary(rows: Sequence[BenchPrompt]) -> dict[str, Any]:
    tokens = sum(r.new_tokens for r in rows)
    own_tokens = sum(r.draftnas_tokens for r in rows)
    steps = sum(r.steps for r in rows)
    target_tps = tokens / sum(r.target_s for r in rows)
    own_tps = own_tokens / sum(r.draftnas_s for r in rows)
    out: dict[str, Any] = {
        "target_tokens_per_s": target_tps, "draftnas_tokens_per_s": own_tps,
        "draftnas_speedup": own_tps / target_tps, "tokens_per_step": own_tokens / max(steps, 1),
        "mean_accepted_per_step": sum(r.accepted for r in rows) / max(steps, 1),
        "draft_acceptance_rate": sum(r.accepted for r in rows) / max(sum(r.drafted for r in rows), 1),
        "lossless": None if rows[0].lossless is None else all(bool(r.lossless) for r in rows),
        "exact_match_rate": None if rows[0].lossless is None
        else sum(bool(r.lossless) for r in rows) / len(rows),
        "divergence_margins": tuple(r.divergence_margin for r in rows if r.divergence_margin is not None),
        "draft_ms_per_token": 1000 * sum(r.draft_s or 0.0 for r in rows)
        / max(sum(r.drafted for r in rows), 1),
    }
    if rows[0].hf_assisted_s is not None:
        hf_tokens = sum(r.hf_assisted_tokens or 0 for r in rows)
        hf_tps = hf_tokens / sum(r.hf_assisted_s or 0.0 for r in rows)
        hf_target_tps = target_tps
        if rows[0].hf_target_s is not None:
            hf_target_tps = tokens / sum(r.hf_target_s or 0.0 for r in rows)
            out["hf_target_tokens_per_s"] = hf_target_tps
        out.update(hf_assisted_tokens_per_s=hf_tps, hf_assisted_speedup=hf_tps / hf_target_tps,
                   hf_tokens_per_step=hf_tokens / max(sum(r.hf_steps or 0 for r in rows), 1),
                   hf_lossless=None if rows[0].hf_lossless is None
                   else all(bool(r.hf_lossless) for r in rows))
    if rows[0].hf_routed_s is not None:
        routed_tokens = sum(r.hf_routed_tokens or 0 for r in rows)
        routed_tps = routed_tokens / sum(r.hf_routed_s or 0.0 for r in rows)
        routed_target_tps = (sum(r.hf_routed_target_tokens or 0 for r in rows)
                             / sum(r.hf_routed_target_s or 0.0 for r in rows))
        out.update(hf_routed_target_tokens_per_s=routed_target_tps, hf_routed_tokens_per_s=routed_tps,
                   hf_routed_speedup=routed_tps / routed_target_tps,
                   hf_routed_tokens_per_step=routed_tokens
                   / max(sum(r.hf_routed_steps or 0 for r in rows), 1),
                   hf_routed_lossless=None if rows[0].hf_routed_lossless is None
                   else all(bool(r.hf_routed_lossless) for r in rows))
    return out


def run_bench(
    target: str | LoadedModel,
    draft: str | LoadedModel,
    prompts: Sequence[Prompt],
    options: BenchOptions,
    *,
    progress: Progress | None = None,
) -> BenchResult:
    """Decode `prompts` with the target alone, draftnas's loop and HF assisted generation; compare.

    progress(done, total) is called after each prompt (total = prompts + 1 for the estimate).
    """


    options.validate()
    if not prompts:
        raise InvalidInputError("no prompts to bench")
    if options.device == "cuda" and not torch.cuda.is_available():

        raise DeviceError("--device cuda asked for, but torch sees no CUDA device here; use --device cpu")
    started, load_before = time.perf_counter(), load_average()
    load = {"dtype": TORCH_DTYPES[options.dtype], "device": options.device}
    t_model = load_model(target, **load) if isinstance(target, str) else target
    d_model = load_drafter(draft, **load) if isinstance(draft, str) else draft
    _check_same_tokenizer(t_model, d_model)
    prompts, encoded, left_out = unseen_prompts(prompts, t_model.tokenizer, d_model, options.per_domain)
    bench = Bench(t_model, d_model, options)
    if options.resolved_engine() == "static":
        bench.build_engines(max(len(ids) for ids in encoded) + options.max_new_tokens + options.gamma + 1)
    bench.prepare(encoded)
    # warm-up; a static engine's full-length run also meets (and on CUDA captures) every step size
    warm_tokens = options.max_new_tokens if bench.engines is not None else min(8, options.max_new_tokens)
    for method in bench.methods():
        bench.run(method, encoded[0], options.seed, warm_tokens)
    rows, references = [], []
    timing_before = bench.choice_timing_s()
    total = len(prompts) + (1 if options.estimate else 0)
    for i, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True)):
        row, reference = _bench_prompt(bench, prompt, ids, i)
        rows.append(row)
        references.append(reference)
        if progress:
            progress(i + 1, total)
    summary = _summary(rows)
    choice_timing = bench.choice_timing_s() - timing_before
    if choice_timing > 0:
        log.warning("%.2f s of the timed runs went to timing the products of shapes met there first",
                    choice_timing)
    if options.estimate:
        summary.update(_predict(bench, prompts, encoded, references, options))
        if progress:
            progress(total, total)
    param = next(t_model.model.parameters())
    return BenchResult(
        target=t_model.source.spec, draft=d_model.source.spec, gamma=options.gamma,
        temperature=options.temperature, max_new_tokens=options.max_new_tokens, n_prompts=len(prompts),
        device=str(param.device), dtype=str(param.dtype).removeprefix("torch."),
        threads=torch.get_num_threads(), prompts=tuple(rows), versions=package_versions(),
        draft_vocab_size=bench.subset.size if bench.subset is not None else None,
        engine=options.resolved_engine(), left_out=left_out, choice_timing_s=round(choice_timing, 3),
        host=cpu_model_name(), load_average_before=load_before,
        wall_s=round(time.perf_counter() - started, 2), **summary,
    )


def unseen_prompts(prompts: Sequence[Prompt], tokenizer: Any, drafter: LoadedModel, per_domain: int | None
                   ) -> tuple[list[Prompt], list[list[int]], tuple[str, ...]]:
    """The prompts a drafter folder's healing never trained on (by token ids, as `draftnas.json`
    records them), then at most `per_domain` of each domain -> (prompts, their ids, ids left out).
    A bench on the drafter's own training text would overstate its acceptance."""

    record = exported_record(drafter.folder) if drafter.folder is not None else None
    heal = (record or {}).get("heal") or {}
    trained = set(heal.get("trained_prompts") or ()) if heal.get("kept", True) else set()
    pairs = [(p, encode_prompt(tokenizer, p.text)) for p in prompts]
    seen = [prompt_key(ids) in trained for _, ids in pairs]
    kept = [pair for pair, was in zip(pairs, seen, strict=True) if not was]
    left_out = tuple(p.id for (p, _), was in zip(pairs, seen, strict=True) if was)
    if not kept:
        raise InvalidInputError(f"the drafter was healed on every one of the {len(pairs)} prompts given; "
                                "bench it on other prompts (--prompts)")
    if left_out:
        log.warning("left out %d prompt(s) the drafter was healed on: %s", len(left_out), ", ".join(left_out))
    if per_domain is not None:
        chosen = {p.id for p in subsample([p for p, _ in kept], per_domain)}
        kept = [(p, ids) for p, ids in kept if p.id in chosen]
    return [p for p, _ in kept], [ids for _, ids in kept], left_out


def _predict(bench: Bench, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
             references: Sequence[list[int]], options: BenchOptions) -> dict[str, Any]:
    """The estimator's prediction on these prompts, from traces of the target's own runs.

    Greedy: the reference outputs are the target's continuations. Sampling: the target's
    sampled outputs are samples of p, which is what a sampled trace holds.
    """

    traces = bench_traces(bench.target, prompts, encoded, references, options)
    est = estimate_acceptance(bench.draft, traces, max_gamma=options.gamma, temperature=options.temperature)
    g = str(options.gamma)
    return {"predicted_tokens_per_step": est.tokens_per_step[g], "predicted_ci_low": est.ci_low[g],
            "predicted_ci_high": est.ci_high[g], "predicted_acceptance_rate": est.acceptance_rate,
            "estimator_s": est.elapsed_s}
