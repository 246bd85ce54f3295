"""`draftnas bench`: real speculative decoding, measured beside the estimator's prediction.

Ways to decode the same prompts, interleaved prompt by prompt (the order rotates so
drift on a shared machine hits each alike), after one warm-up run each:

1. the target alone, in the loop's engine: transformers ``generate`` (engine "hf"), or
   draftnas's static-cache decoder decoding one token per step (engine "static"; on
   CUDA replayed from a CUDA graph);
2. draftnas's own speculative loop (`draftnas.speculative`) in that engine;
3. transformers' assisted generation ``generate(assistant_model=drafter)`` with a
   fixed gamma (``num_assistant_tokens=gamma``, schedule "constant", confidence
   threshold 0 on the drafter's generation config), beside transformers' own
   ``generate`` of the target alone (the same as 1. under engine "hf");
4. on CPU, the pair of 3. again with both models' linear layers routed through the
   product that timed fastest on this host (`draftnas.linears.route_linears`, what a
   transformers user can apply with one line), checked against that routed target.

Greedy runs are checked token for token against the target's own greedy output in
the same engine (``lossless`` per prompt; ``exact_match_rate`` overall). Where a
speculative run departs from it, the target's top-1 minus top-2 logit margin at
that token is recorded: in bf16/fp16 a verify pass over gamma + 1 tokens and a
one-token decode may round a near-tie differently (a margin near 0), which a bug
would not need. The estimator's prediction comes from a trace of the target's own
outputs on these prompts (one teacher-forced target pass for the top-k
probabilities) and one teacher-forced drafter pass.

Size: the bench loop, its per-prompt records and the e2e aggregation of bench runs and of each
latency term timed alone belong to one measurement; splitting them would pass the same private state
between modules.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from draftnas.errors import InvalidInputError
from draftnas.fidelity import Measured, MeasuredTerms
from draftnas.machine import cpu_model_name, load_average, median_ms
from draftnas.prompts import Prompt, encode_prompt
from draftnas.record import Record

if TYPE_CHECKING:
    from draftnas.sources import LoadedModel
    from draftnas.traces import Traces

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
ENGINES = ("hf", "static")
DEVICES = ("cpu", "cuda")
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class BenchOptions(Record):
    """`engine` None: "static" on CUDA (captured steps), "hf" on CPU."""

    gamma: int = 4
    temperature: float = 0.0
    max_new_tokens: int = 64
    seed: int = 0
    hf_assisted: bool = True
    # also run transformers with both models' linear layers routed (draftnas.linears; CPU only)
    hf_routed: bool = True
    estimate: bool = True
    top_k: int = 20
    device: str = "cpu"
    dtype: str = "fp32"
    engine: str | None = None
    # at most this many prompts per domain (evenly spaced), chosen after leaving out the prompts
    # the drafter was healed on (None: every prompt given that it was not healed on)
    per_domain: int | None = None

    def resolved_engine(self) -> str:
        return self.engine or ("static" if self.device == "cuda" else "hf")

    def validate(self) -> None:
        problems = []
        if self.device not in DEVICES:
            problems.append(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in TORCH_DTYPES:
            problems.append(f"dtype must be one of {', '.join(TORCH_DTYPES)}, got {self.dtype!r}")
        if self.engine is not None and self.engine not in ENGINES:
            problems.append(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 1 <= self.gamma <= 32:
            problems.append(f"gamma must be in [1, 32], got {self.gamma}")
        if not 0.0 <= self.temperature <= 10.0:
            problems.append(f"temperature must be in [0, 10], got {self.temperature:g}")
        if not 1 <= self.max_new_tokens <= 8192:
            problems.append(f"max_new_tokens must be in [1, 8192], got {self.max_new_tokens}")
        if self.per_domain is not None and self.per_domain < 1:
            problems.append(f"per_domain must be >= 1, got {self.per_domain}")
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
    hf_target_s: float | None = None  # transformers generate of the target alone (engine "static")
    first_divergence: int | None = None  # index of the first token the loop's output departs at
    divergence_margin: float | None = None  # target's top-1 minus top-2 logit there (own greedy run)
    # transformers with route_linears on both models: the target alone, then assisted generation
    hf_routed_target_s: float | None = None
    hf_routed_target_tokens: int | None = None
    hf_routed_s: float | None = None
    hf_routed_tokens: int | None = None
    hf_routed_steps: int | None = None
    hf_routed_lossless: bool | None = None  # equal to the routed target's own greedy output


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
    engine: str = "hf"
    exact_match_rate: float | None = None  # greedy: share of prompts whose output equals the target's
    divergence_margins: tuple[float, ...] = ()  # target's top-1 minus top-2 logit at each divergence
    hf_target_tokens_per_s: float | None = None  # transformers generate of the target alone
    left_out: tuple[str, ...] = ()  # ids of prompts not benched: the drafter was healed on them
    # transformers with route_linears on both models (draftnas.linears)
    hf_routed_target_tokens_per_s: float | None = None
    hf_routed_tokens_per_s: float | None = None
    hf_routed_speedup: float | None = None  # against the routed target alone
    hf_routed_tokens_per_step: float | None = None
    hf_routed_lossless: bool | None = None
    # seconds the CPU product choosers spent timing inside the timed runs (0 unless a shape was
    # met there first: the bench times every step size and short prompt length beforehand)
    choice_timing_s: float = 0.0
    host: str = ""  # CPU model (machine.cpu_model_name), and load averages before the run
    load_average_before: str = ""


@dataclass
class _Run:
    tokens: list[int]
    elapsed_s: float
    steps: int = 0
    accepted: int = 0
    drafted: int = 0
    draft_s: float = 0.0
    margins: list[float] | None = None  # greedy target runs in draftnas's engines


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def product_rows(encoded: Sequence[list[int]], gamma: int) -> set[int]:
    """The row counts speculative decoding of these prompts multiplies by: steps of 1 to γ+1
    tokens; each prompt's prefill (n), a drafter's in the loop (n - 1, its last token left to the
    first step) and transformers' first verify of the prompt and γ drafts at once (n + γ)."""
    return set(range(1, gamma + 2)) | {len(ids) + k for ids in encoded for k in (-1, 0, gamma)}


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
        self.engines: tuple[Any, Any] | None = None
        self.routed = options.hf_assisted and options.hf_routed and options.device == "cpu"
        self.routings: dict[str, Any] = {}  # "target" / "draft" -> LinearRouting, made on first use
        self.routed_models: dict[str, Any] = {}  # "target" / "draft" -> the copy the routed pair runs

    def _routed_model(self, which: str) -> Any:
        """The target or drafter the routed pair runs: a copy of the model, so its weights lie in
        this process's memory, as `route_linears` leaves a user's model by default, while the
        plain pair keeps them as loaded (a view of the safetensors file)."""
        if which not in self.routed_models:
            model = self.target.model if which == "target" else self.draft.model
            full = which == "draft" and self.full_head is not None  # transformers needs the full head
            if full:
                model.set_output_embeddings(self.full_head)
            try:
                self.routed_models[which] = copy.deepcopy(model)
            finally:
                if full:
                    model.set_output_embeddings(self.reduced_head)
        return self.routed_models[which]

    def _routing(self, which: str) -> Any:
        """The (detached) routing of the routed pair's target's or drafter's linear layers."""
        from draftnas.linears import route_linears

        if which not in self.routings:  # the copy is this process's memory already
            self.routings[which] = route_linears(self._routed_model(which), attach=False, own_weights=False)
        return self.routings[which]

    def build_engines(self, max_tokens: int) -> None:
        """Static engines (one KV cache each, `max_tokens` slots) for engine "static"."""
        from draftnas.decoder import StaticDecoder
        from draftnas.speculative import StaticEngine

        capture = self.options.device == "cuda"
        target, draft = (StaticEngine(StaticDecoder.from_hf(m.model, max_positions=max_tokens), max_tokens,
                                      capture=capture) for m in (self.target, self.draft))
        self.engines = (target, draft)

    def choosers(self) -> list[Any]:
        """The CPU product choosers in play: the static engines' and, routed, transformers' models'."""
        out = [engine.decoder.matmul for engine in self.engines or ()]
        if self.routed:
            out += [self._routing(which).chooser for which in ("target", "draft")]
        return [c for c in out if c.enabled]

    def prepare(self, encoded: Sequence[list[int]]) -> None:
        """Time every product the runs will meet (`product_rows`) before any run is timed. One
        timing costs many passes over the weights; met first inside a timed run, it would be
        charged to that run."""
        rows = product_rows(encoded, self.options.gamma)
        for chooser in self.choosers():
            chooser.prepare(rows)

    def choice_timing_s(self) -> float:
        return sum(c.timing_s for c in self.choosers())

    def _target_loop_model(self) -> Any:
        return self.engines[0] if self.engines else self.target.model

    def _draft_loop_model(self) -> Any:
        return self.engines[1] if self.engines else self.draft.model

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

    def _generate(self, ids: list[int], seed: int, max_new_tokens: int, target: Any = None,
                  **extra: Any) -> _Run:
        """transformers' `generate` of `target` (default: the target as loaded)."""
        import torch

        inputs = torch.tensor([ids])
        kwargs = {**self.gen_kwargs, "max_new_tokens": max_new_tokens, **extra}
        inputs = inputs.to(self.options.device)
        torch.manual_seed(seed)
        _synchronize(self.options.device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = (target or self.target.model).generate(inputs, attention_mask=torch.ones_like(inputs),
                                                         **kwargs)
        return _Run(tokens=out[0, len(ids):].tolist(), elapsed_s=time.perf_counter() - started)

    def run_target(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        """The target alone in the loop's engine (greedy: with its top-1/top-2 margins)."""
        if self.engines is None:
            return self._generate(ids, seed, max_new_tokens)
        import torch

        from draftnas.speculative import greedy_decode, speculative_generate

        if self.options.temperature <= 0:
            out = greedy_decode(self.engines[0], ids, max_new_tokens=max_new_tokens, eos_token_ids=self.eos)
            return _Run(tokens=out.tokens, elapsed_s=out.elapsed_s, margins=out.margins)
        run = speculative_generate(self.engines[0], self.engines[1], ids, gamma=0,
                                   max_new_tokens=max_new_tokens, temperature=self.options.temperature,
                                   eos_token_ids=self.eos, generator=torch.Generator().manual_seed(seed))
        return _Run(tokens=run.tokens, elapsed_s=run.elapsed_s)

    def run_hf_target(self, ids: list[int], seed: int, max_new_tokens: int, routed: bool = False) -> _Run:
        if not routed:
            return self._generate(ids, seed, max_new_tokens)
        with self._routing("target"):
            return self._generate(ids, seed, max_new_tokens, target=self._routed_model("target"))

    def run_hf(self, ids: list[int], seed: int, max_new_tokens: int, routed: bool = False) -> _Run:
        target = self._routed_model("target") if routed else self.target.model
        draft = self._routed_model("draft") if routed else self.draft.model
        calls = [0]
        hook = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        swap = not routed and self.full_head is not None  # transformers needs the full-vocabulary head
        if swap:
            draft.set_output_embeddings(self.full_head)
        try:
            with contextlib.ExitStack() as routings:
                if routed:
                    routings.enter_context(self._routing("target"))
                    routings.enter_context(self._routing("draft"))
                run = self._generate(ids, seed, max_new_tokens, target=target, assistant_model=draft)
        finally:
            hook.remove()
            if swap:
                draft.set_output_embeddings(self.reduced_head)
        run.steps = calls[0]
        return run

    def run_draftnas(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        import torch

        from draftnas.speculative import speculative_generate

        out = speculative_generate(
            self._target_loop_model(), self._draft_loop_model(), ids, gamma=self.options.gamma,
            max_new_tokens=max_new_tokens, temperature=self.options.temperature,
            eos_token_ids=self.eos, generator=torch.Generator().manual_seed(seed),
            vocab_subset=self.subset,
        )
        return _Run(tokens=out.tokens, elapsed_s=out.elapsed_s, steps=out.steps,
                    accepted=sum(out.accepted), drafted=sum(out.drafted), draft_s=out.draft_s)

    def run(self, method: str, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        runner: dict[str, Callable[[list[int], int, int], _Run]] = {
            "target": self.run_target, "draftnas": self.run_draftnas, "hf_target": self.run_hf_target,
            "hf_assisted": self.run_hf,
            "hf_routed_target": functools.partial(self.run_hf_target, routed=True),
            "hf_routed": functools.partial(self.run_hf, routed=True)}
        return runner[method](ids, seed, max_new_tokens)

    def methods(self) -> list[str]:
        """The decoders this bench runs: hf_target only beside the static engine (else it is target);
        the routed pair on CPU unless turned off."""
        out = ["target", "draftnas"]
        if self.options.hf_assisted:
            out += (["hf_target"] if self.engines is not None else []) + ["hf_assisted"]
        if self.routed:
            out += ["hf_routed_target", "hf_routed"]
        return out


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
    import torch

    from draftnas.provenance import package_versions
    from draftnas.sources import load_model

    options.validate()
    if not prompts:
        raise InvalidInputError("no prompts to bench")
    if options.device == "cuda" and not torch.cuda.is_available():
        from draftnas.errors import DeviceError

        raise DeviceError("--device cuda asked for, but torch sees no CUDA device here; use --device cpu")
    started, load_before = time.perf_counter(), load_average()
    load = {"dtype": TORCH_DTYPES[options.dtype], "device": options.device}
    t_model = load_model(target, **load) if isinstance(target, str) else target
    d_model = load_model(draft, **load) if isinstance(draft, str) else draft
    _check_same_tokenizer(t_model, d_model)
    prompts, encoded, left_out = unseen_prompts(prompts, t_model.tokenizer, d_model, options.per_domain)
    bench = _Bench(t_model, d_model, options)
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
    from draftnas.distill import prompt_key
    from draftnas.export import exported_record
    from draftnas.prompts import subsample

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


def cached_forward_ms(model: Any, prompt: list[int], new_tokens: int, repeats: int) -> float:
    """One cached forward over `new_tokens` tokens after `prompt` (cache cropped back each call)."""
    import torch
    from transformers import DynamicCache

    from draftnas.speculative import crop_cache

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        feed = torch.tensor([prompt[-new_tokens:] if len(prompt) >= new_tokens else [0] * new_tokens])

        def step() -> None:
            model(input_ids=feed, past_key_values=cache, use_cache=True, logits_to_keep=new_tokens)
            crop_cache(cache, len(prompt))

        return median_ms(step, repeats)


def _prefill_ms(model: Any, prompt: list[int], repeats: int) -> float:
    import torch

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        return median_ms(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1), max(3, repeats // 3))


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
    """Medians over repeats; per-step and per-token times with the measured prefill taken out."""
    rows = [p for r in runs for p in r.prompts]
    steps = max(sum(p.steps for p in rows), 1)
    prefill_spec = (terms.prefill_target_ms + terms.prefill_draft_ms) * len(rows)
    step_ms = (sum(p.draftnas_s for p in rows) * 1000.0 - prefill_spec) / steps
    target_token_ms = ((sum(p.target_s for p in rows) * 1000.0 - terms.prefill_target_ms * len(rows))
                       / max(sum(p.new_tokens for p in rows), 1))
    speedups = [r.draftnas_speedup for r in runs]
    estimate = next((r.predicted_tokens_per_step for r in runs if r.predicted_tokens_per_step is not None),
                    None)
    return Measured(
        gamma=runs[0].gamma, target_tokens_per_s=statistics.median(r.target_tokens_per_s for r in runs),
        tokens_per_s=statistics.median(r.draftnas_tokens_per_s for r in runs),
        speedup=statistics.median(speedups), speedup_spread=(min(speedups), max(speedups)),
        tokens_per_step=statistics.median(r.tokens_per_step for r in runs),
        mean_accepted_per_step=statistics.median(r.mean_accepted_per_step for r in runs),
        bench_estimate_tokens_per_step=estimate,
        lossless=None if runs[0].lossless is None else all(bool(r.lossless) for r in runs),
        repeats=len(runs), step_ms=step_ms, target_token_ms=target_token_ms,
        drafted_per_step=sum(p.drafted for p in rows) / steps)


def per_domain_measured(runs: Sequence[BenchResult]) -> dict[str, dict[str, float]]:
    by: dict[str, list[Any]] = {}
    for p in (p for r in runs for p in r.prompts):
        by.setdefault(p.domain, []).append(p)
    return {d: {"tokens_per_step": sum(p.draftnas_tokens for p in ps) / max(sum(p.steps for p in ps), 1),
                "acceptance_rate": sum(p.accepted for p in ps) / max(sum(p.drafted for p in ps), 1),
                "prompts": float(len({p.prompt_id for p in ps}))} for d, ps in sorted(by.items())}
