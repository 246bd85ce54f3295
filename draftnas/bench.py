"""`draftnas bench`: real speculative decoding, measured beside the estimator's prediction.

Three ways to decode the same prompts, interleaved prompt by prompt (the order
rotates so drift on a shared machine hits each alike), after one warm-up run each:

1. the target alone (transformers ``generate``, greedy or sampling at T);
2. draftnas's own speculative loop (`draftnas.speculative`);
3. transformers' assisted generation ``generate(assistant_model=drafter)`` with a
   fixed gamma (``num_assistant_tokens=gamma``, schedule "constant", confidence
   threshold 0 on the drafter's generation config).

Greedy runs are checked token for token against the target's own output
(``lossless`` per prompt and overall). The estimator's prediction comes from a
trace of the target's own outputs on these prompts (one teacher-forced target pass
for the top-k probabilities) and one teacher-forced drafter pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from draftnas.errors import InvalidInputError
from draftnas.prompts import Prompt, encode_prompt
from draftnas.record import Record

if TYPE_CHECKING:
    from draftnas.sources import LoadedModel
    from draftnas.traces import Traces

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
METHODS = ("target", "draftnas", "hf_assisted")


@dataclass(frozen=True)
class BenchOptions(Record):
    gamma: int = 4
    temperature: float = 0.0
    max_new_tokens: int = 64
    seed: int = 0
    hf_assisted: bool = True
    estimate: bool = True
    top_k: int = 20

    def validate(self) -> None:
        problems = []
        if not 1 <= self.gamma <= 32:
            problems.append(f"gamma must be in [1, 32], got {self.gamma}")
        if not 0.0 <= self.temperature <= 10.0:
            problems.append(f"temperature must be in [0, 10], got {self.temperature:g}")
        if not 1 <= self.max_new_tokens <= 8192:
            problems.append(f"max_new_tokens must be in [1, 8192], got {self.max_new_tokens}")
        if problems:
            raise InvalidInputError("; ".join(problems))


@dataclass(frozen=True)
class BenchPrompt(Record):
    """One prompt's runs. Times in seconds (prefill included); tokens are new tokens."""

    prompt_id: str
    domain: str
    prompt_tokens: int
    new_tokens: int
    target_s: float
    draftnas_s: float
    draftnas_tokens: int
    steps: int
    accepted: int
    drafted: int
    lossless: bool | None
    hf_assisted_s: float | None = None
    hf_assisted_tokens: int | None = None
    hf_steps: int | None = None
    hf_lossless: bool | None = None
    draft_s: float | None = None  # time inside the drafter in draftnas's loop


@dataclass(frozen=True)
class BenchResult(Record):
    """Measured tokens/s of the three decoders and tokens per step, beside the estimate.

    tokens_per_step = new tokens / target verification passes of draftnas's loop;
    mean_accepted_per_step = accepted drafts / steps; lossless = greedy output equal to
    the target's on every prompt (None when sampling).
    """

    target: str
    draft: str
    gamma: int
    temperature: float
    max_new_tokens: int
    n_prompts: int
    device: str
    dtype: str
    threads: int
    target_tokens_per_s: float
    draftnas_tokens_per_s: float
    draftnas_speedup: float
    tokens_per_step: float
    mean_accepted_per_step: float
    draft_acceptance_rate: float
    lossless: bool | None
    hf_assisted_tokens_per_s: float | None = None
    hf_assisted_speedup: float | None = None
    hf_tokens_per_step: float | None = None
    hf_lossless: bool | None = None
    predicted_tokens_per_step: float | None = None
    predicted_ci_low: float | None = None
    predicted_ci_high: float | None = None
    predicted_acceptance_rate: float | None = None
    estimator_s: float | None = None
    prompts: tuple[BenchPrompt, ...] = ()
    versions: dict[str, str] | None = None
    wall_s: float = 0.0
    draft_ms_per_token: float | None = None  # drafter time per drafted token in draftnas's loop
    draft_vocab_size: int | None = None  # rows of a reduced draft head (draft_vocab.json), None = full


@dataclass
class _Run:
    tokens: list[int]
    elapsed_s: float
    steps: int = 0
    accepted: int = 0
    drafted: int = 0
    draft_s: float = 0.0


class _Bench:
    """Live models and settings shared by the three decoders."""

    def __init__(self, target: LoadedModel, draft: LoadedModel, options: BenchOptions) -> None:
        from draftnas.traces import eos_token_ids

        self.target, self.draft, self.options = target, draft, options
        self.eos = eos_token_ids(target.model, target.tokenizer)
        tok = target.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else (self.eos[0] if self.eos else 0)
        sampling = options.temperature > 0
        self.gen_kwargs: dict[str, Any] = {
            "max_new_tokens": options.max_new_tokens, "do_sample": sampling, "pad_token_id": pad,
            "eos_token_id": list(self.eos) or None,
        }
        if sampling:  # the plain temperature-T softmax: no top-k/top-p warping
            self.gen_kwargs.update(temperature=options.temperature, top_k=0, top_p=1.0)
        self.full_head = self.reduced_head = None
        self.subset = self._reduced_head(draft)
        cfg = draft.model.generation_config
        cfg.num_assistant_tokens = options.gamma
        cfg.num_assistant_tokens_schedule = "constant"
        cfg.assistant_confidence_threshold = 0.0

    def _reduced_head(self, draft: LoadedModel) -> Any:
        """A drafter folder with draft_vocab.json: draftnas's loop slices the head to the kept rows;
        HF assisted generation gets the stored full-vocabulary head back for its runs."""
        from draftnas.vocab import maybe_apply_saved_subset, model_subset

        subset = model_subset(draft.model)
        if subset is None and draft.folder is not None:
            full = draft.model.get_output_embeddings()
            subset = maybe_apply_saved_subset(draft.model, draft.folder)
            if subset is not None:
                self.full_head, self.reduced_head = full, draft.model.get_output_embeddings()
        return subset

    def _generate(self, ids: list[int], seed: int, max_new_tokens: int, **extra: Any) -> _Run:
        import torch

        inputs = torch.tensor([ids])
        kwargs = {**self.gen_kwargs, "max_new_tokens": max_new_tokens, **extra}
        torch.manual_seed(seed)
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
        return _Run(tokens=out[0, len(ids):].tolist(), elapsed_s=time.perf_counter() - started)

    def run_target(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        return self._generate(ids, seed, max_new_tokens)

    def run_hf(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        calls = [0]
        hook = self.target.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        if self.full_head is not None:  # transformers needs the full-vocabulary head
            self.draft.model.set_output_embeddings(self.full_head)
        try:
            run = self._generate(ids, seed, max_new_tokens, assistant_model=self.draft.model)
        finally:
            hook.remove()
            if self.reduced_head is not None:
                self.draft.model.set_output_embeddings(self.reduced_head)
        run.steps = calls[0]
        return run

    def run_draftnas(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        import torch

        from draftnas.speculative import speculative_generate

        out = speculative_generate(
            self.target.model, self.draft.model, ids, gamma=self.options.gamma,
            max_new_tokens=max_new_tokens, temperature=self.options.temperature,
            eos_token_ids=self.eos, generator=torch.Generator().manual_seed(seed),
        )
        return _Run(tokens=out.tokens, elapsed_s=out.elapsed_s, steps=out.steps,
                    accepted=sum(out.accepted), drafted=sum(out.drafted), draft_s=out.draft_s)

    def run(self, method: str, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        runner = {"target": self.run_target, "draftnas": self.run_draftnas, "hf_assisted": self.run_hf}
        return runner[method](ids, seed, max_new_tokens)


def _check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    from draftnas.traces import model_vocab_size, tokenizer_fingerprint

    t_fp, d_fp = tokenizer_fingerprint(target.tokenizer), tokenizer_fingerprint(draft.tokenizer)
    t_v, d_v = model_vocab_size(target.model), model_vocab_size(draft.model)
    if t_fp != d_fp or t_v != d_v:
        raise InvalidInputError(
            f"draft {draft.source.spec!r} (tokenizer {d_fp}, {d_v} ids) and target {target.source.spec!r} "
            f"(tokenizer {t_fp}, {t_v} ids) must share one tokenizer for speculative decoding"
        )


def _bench_prompt(bench: _Bench, prompt: Prompt, ids: list[int], index: int) -> tuple[BenchPrompt, list[int]]:
    """One prompt through every decoder (order rotated by index); also returns the target's tokens."""
    methods = [m for m in METHODS if m != "hf_assisted" or bench.options.hf_assisted]
    order = methods[index % len(methods):] + methods[:index % len(methods)]
    seed = bench.options.seed + index
    runs = {m: bench.run(m, ids, seed, bench.options.max_new_tokens) for m in order}
    ref, own, hf = runs["target"], runs["draftnas"], runs.get("hf_assisted")
    greedy = bench.options.temperature <= 0
    row = BenchPrompt(
        prompt_id=prompt.id, domain=prompt.domain, prompt_tokens=len(ids), new_tokens=len(ref.tokens),
        target_s=ref.elapsed_s, draftnas_s=own.elapsed_s, draftnas_tokens=len(own.tokens),
        steps=own.steps, accepted=own.accepted, drafted=own.drafted,
        lossless=(own.tokens == ref.tokens) if greedy else None,
        hf_assisted_s=hf.elapsed_s if hf else None, hf_assisted_tokens=len(hf.tokens) if hf else None,
        hf_steps=hf.steps if hf else None,
        hf_lossless=(hf.tokens == ref.tokens) if (hf and greedy) else None,
        draft_s=own.draft_s,
    )
    return row, ref.tokens


def bench_traces(target: LoadedModel, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
                 continuations: Sequence[list[int]], options: BenchOptions) -> Traces:
    """In-memory traces of the target's own outputs (one teacher-forced pass each for top-k)."""
    from draftnas.traces import TraceOptions, Traces, make_metadata, record_from_continuation

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
        "draft_ms_per_token": 1000 * sum(r.draft_s or 0.0 for r in rows)
        / max(sum(r.drafted for r in rows), 1),
    }
    if rows[0].hf_assisted_s is not None:
        hf_tokens = sum(r.hf_assisted_tokens or 0 for r in rows)
        hf_tps = hf_tokens / sum(r.hf_assisted_s or 0.0 for r in rows)
        out.update(hf_assisted_tokens_per_s=hf_tps, hf_assisted_speedup=hf_tps / target_tps,
                   hf_tokens_per_step=hf_tokens / max(sum(r.hf_steps or 0 for r in rows), 1),
                   hf_lossless=None if rows[0].hf_lossless is None
                   else all(bool(r.hf_lossless) for r in rows))
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
    import torch

    from draftnas.provenance import package_versions
    from draftnas.sources import load_model

    options.validate()
    if not prompts:
        raise InvalidInputError("no prompts to bench")
    started = time.perf_counter()
    t_model = load_model(target) if isinstance(target, str) else target
    d_model = load_model(draft) if isinstance(draft, str) else draft
    _check_same_tokenizer(t_model, d_model)
    bench = _Bench(t_model, d_model, options)
    encoded = [encode_prompt(t_model.tokenizer, p.text) for p in prompts]
    for method in METHODS if options.hf_assisted else METHODS[:2]:  # warm-up
        bench.run(method, encoded[0], options.seed, min(8, options.max_new_tokens))
    rows, references = [], []
    total = len(prompts) + (1 if options.estimate else 0)
    for i, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True)):
        row, reference = _bench_prompt(bench, prompt, ids, i)
        rows.append(row)
        references.append(reference)
        if progress:
            progress(i + 1, total)
    summary = _summary(rows)
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
        wall_s=round(time.perf_counter() - started, 2), **summary,
    )


def _predict(bench: _Bench, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
             references: Sequence[list[int]], options: BenchOptions) -> dict[str, Any]:
    """The estimator's prediction on these prompts, from traces of the target's own runs.

    Greedy: the reference outputs are the target's continuations. Sampling: the target's
    sampled outputs are samples of p, which is what a sampled trace holds.
    """
    from draftnas.acceptance import estimate_acceptance

    traces = bench_traces(bench.target, prompts, encoded, references, options)
    est = estimate_acceptance(bench.draft, traces, max_gamma=options.gamma, temperature=options.temperature)
    g = str(options.gamma)
    return {"predicted_tokens_per_step": est.tokens_per_step[g], "predicted_ci_low": est.ci_low[g],
            "predicted_ci_high": est.ci_high[g], "predicted_acceptance_rate": est.acceptance_rate,
            "estimator_s": est.elapsed_s}
