"""`draftnas bench --replay`: the speculative loop at any size the device holds, with acceptance replayed.

The target and the drafter are shapes (a registry name, or a model folder whose config.json, draft head
and draftnas.json are read, never its weights), built with random weights in draftnas's static decoder
(CUDA graphs on a GPU). Each prompt is a run of the accepts file (`acceptance.accepts`): random token ids
of its prompt length, then the loop drafting and verifying as in `draftnas bench`, accepting at each step
the recorded count, for the recorded steps; the target alone decodes the same number of tokens. Same
kernels, cache lengths, captured graphs and host work as the recorded run; only the weights differ, which
at batch 1 with dense kernels leaves a step's latency where it was.

The protocol is the bench's: every step size and every prompt length met once before timing (a prefill
of a length first met inside a timed run would charge a one-time cost to that run), then `rounds`
interleaved rounds over the prompts, the order rotating; medians over rounds, then over prompts, with
bootstrap intervals. With `batch_sizes`, B runs are replayed together (`models.batched`) at each B.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from draftnas.acceptance.accepts import (
    AcceptsPrompt,
    AcceptsTrace,
    parse_rate,
    read_accepts,
    synthetic_accepts,
)
from draftnas.bench.arms import product_rows
from draftnas.bench.batch_records import BatchedBenchResult
from draftnas.bench.batched import (
    PREDICTED_BATCHES,
    first_below_one,
    host_label,
    latency_model,
    paired_point,
    predicted_speedup,
    priced_step_ms,
)
from draftnas.bench.replay_records import ReplayResult, ReplayRun
from draftnas.bench.request_records import BenchRequest
from draftnas.bench.stats import interval_of
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import load_average, require_device
from draftnas.core.options import option_error
from draftnas.core.provenance import package_versions
from draftnas.core.records import Progress
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.drafter.records import VOCAB_FILE, load_vocab_subset
from draftnas.export.folder import exported_record
from draftnas.latency.runtime import RANDOM_POOL
from draftnas.models.batched import BatchedOutput, BatchedStatic, batched_greedy, batched_speculative_generate
from draftnas.models.decoder import StaticDecoder
from draftnas.models.engines import StaticEngine
from draftnas.models.kernel_choices import kept_choices
from draftnas.models.records import TORCH_DTYPES, quantized, weights_problem
from draftnas.models.row_padding import choose_row_padding
from draftnas.models.spec import DecoderSpec
from draftnas.models.speculative import greedy_decode, speculative_generate

#: prompts and prompt length of an `alpha=RATE` replay (no run recorded their lengths)
RATE_PROMPTS, RATE_PROMPT_TOKENS = 8, 128


@dataclass
class Shape:
    """A model to replay: its name, shape, reduced head rows (0: full), weight format, and the γ an
    exported folder records (None elsewhere)."""

    name: str
    arch: Architecture
    head_rows: int = 0
    weights: str = "dense"
    gamma: int | None = None


def resolve_shape(spec: str, field: str) -> Shape:
    """A shape to replay: a registry name or a model folder (its config.json; a folder's draft head and
    draftnas.json read too), optionally followed by `,head=ROWS` (a reduced draft head) and
    `,weights=FORMAT`, e.g. `qwen2.5-coder-0.5b,head=98304`: a searched drafter's shape without its files."""
    name, *extras = spec.split(",")
    try:
        arch = resolve_architecture(name)
    except InvalidInputError as e:
        raise option_error(field, f"{name!r} is neither a registered architecture nor a model folder "
                                  f"({e})") from None
    shape = Shape(name, arch)
    folder = Path(name).expanduser()
    if folder.is_dir():
        record = exported_record(folder) or {}
        gamma = record.get("gamma")
        rows = load_vocab_subset(folder).size if (folder / VOCAB_FILE).is_file() else 0
        shape = Shape(folder.name, arch, rows, str(record.get("weights", "dense")),
                      gamma if isinstance(gamma, int) else None)
    for extra in extras:
        key, _, value = extra.partition("=")
        if key == "head" and value.isdigit() and 0 < int(value) <= arch.vocab_size:
            shape.head_rows = int(value)
        elif key == "weights" and value:
            shape.weights = value
        else:
            raise option_error(field, f"{extra!r} in {spec!r}: a shape takes ,head=ROWS (1 to "
                                      f"{arch.vocab_size}) and ,weights=FORMAT")
    if extras:
        shape.name = spec
    return shape


def load_trace(request: BenchRequest, drafter: Shape, target: str = "") -> tuple[AcceptsTrace, str]:
    """The counts to replay and the host they were recorded on: the accepts file's trace, or counts
    drawn at `alpha=RATE` (the drafter's exported γ, else --gamma). Counts recorded with another target
    than `target` (the replay's) are a stand-in for its own: the trace's note says whose they are."""
    spec, options = request.replay or "", request.options
    rate = parse_rate(spec)
    if rate is None:
        accepts = read_accepts(spec)
        trace = accepts.trace(request.replay_drafter)
        cut = tuple(head(p, options.max_new_tokens) for p in trace.prompts)
        if target and accepts.target != target and not trace.note:
            whose = f"{accepts.target}'s with {trace.drafter} ({trace.label})"
            trace = replace(trace, note=f"the counts are {whose}, "
                                        f"a stand-in for {target}'s own acceptance")
        return replace(trace, prompts=cut), accepts.host
    gamma = drafter.gamma or options.gamma
    return synthetic_accepts(rate, gamma, options.max_new_tokens, [RATE_PROMPT_TOKENS] * RATE_PROMPTS,
                             seed=options.seed, drafter=drafter.name), "synthetic"


def head(prompt: AcceptsPrompt, budget: int) -> AcceptsPrompt:
    """`prompt`'s run cut to the steps whose tokens fit `budget` (--max-new-tokens below the recorded
    run's: its first steps, as recorded)."""
    if prompt.new_tokens <= budget:
        return prompt
    steps, emitted = 0, 0
    while steps < prompt.steps and emitted + prompt.accepted[steps] + 1 <= budget:
        emitted += prompt.accepted[steps] + 1
        steps += 1
    return replace(prompt, new_tokens=emitted, accepted=prompt.accepted[:steps],
                   drafted=prompt.drafted[:steps])


def build_decoder(shape: Shape, device: str, dtype: torch.dtype, slots: int, seed: int) -> StaticDecoder:
    """`shape` in draftnas's static decoder with random weights (quantized as it records, on the CPU)."""
    spec = DecoderSpec(arch=shape.arch, head_rows=shape.head_rows)
    decoder = StaticDecoder(spec, dtype=dtype, device=device, max_positions=slots,
                            skip_init=True).init_random(seed, pool=RANDOM_POOL, timing_only=True)
    if quantized(shape.weights):
        decoder.quantize_weights(shape.weights)
    return decoder.eval()


def _ids(length: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=gen).tolist()


def _check(target: Shape, drafter: Shape, trace: AcceptsTrace, device: str, dtype: str) -> None:
    rows = drafter.head_rows or drafter.arch.vocab_size
    if rows > target.arch.vocab_size:
        raise option_error("draft", f"{drafter.name}'s head has {rows} rows, more than the target "
                                    f"{target.name}'s vocabulary ({target.arch.vocab_size})")
    problem = weights_problem(drafter.weights, device, dtype)
    if problem:
        raise option_error("draft", f"{drafter.name}: {problem}")


def _within_drafter_vocabulary(target: Shape, drafter: Shape) -> Shape:
    """`target` with its vocabulary cut to the drafter's where it is larger (Qwen2.5-Coder-7B and -32B pad
    theirs to 152,064 rows over the 0.5B's 151,936). With random weights the target emits padding ids a
    trained one never does, and prompts are drawn from its vocabulary: the drafter cannot read such an id
    (an index past its embedding). 128 rows of 152,064 move the target's head by under 0.1%."""
    if target.arch.vocab_size <= drafter.arch.vocab_size:
        return target
    return replace(target, arch=target.arch.with_shape(vocab_size=drafter.arch.vocab_size))


def _context(trace: AcceptsTrace) -> int:
    """The mean cache length a step reads: the prompt and half the new tokens."""
    return round(sum(p.prompt_tokens + p.new_tokens / 2 for p in trace.prompts) / len(trace.prompts))


def run_replay(request: BenchRequest, *, progress: Progress | None = None
               ) -> ReplayResult | BatchedBenchResult:
    """The replay `request` asks for (see the module's text); with `batch_sizes`, one point per B."""
    options = request.validate().options
    require_device(options.device)
    target, drafter = resolve_shape(request.target, "target"), resolve_shape(request.draft, "draft")
    if options.draft_weights is not None:  # as asked, over what a folder records (dense on a GPU)
        drafter.weights = options.draft_weights
    trace, recorded_on = load_trace(request, drafter, target.name)
    _check(target, drafter, trace, options.device, options.dtype)
    target = _within_drafter_vocabulary(target, drafter)
    with kept_choices():
        if options.batch_sizes:
            return _run_batched(request, target, drafter, trace, progress)
        return _run_single(request, target, drafter, trace, recorded_on, progress)


def replay_engine(shape: Shape, device: str, dtype: torch.dtype, slots: int, seed: int,
                  rows: set[int]) -> StaticEngine:
    """`shape` with random weights in a static engine of `slots` positions (CUDA graphs on a GPU), its
    products of `rows` rows timed and single rows padded where faster before any run is timed."""
    engine = StaticEngine(build_decoder(shape, device, dtype, slots, seed), slots, capture=device == "cuda")
    if engine.decoder.matmul.enabled:
        engine.decoder.matmul.prepare(rows)
    choose_row_padding(engine.decoder)
    return engine


def _engines(target: Shape, drafter: Shape, request: BenchRequest, slots: int,
             lengths: Sequence[int], gamma: int) -> tuple[StaticEngine, StaticEngine]:
    options = request.options
    dtype, rows = getattr(torch, TORCH_DTYPES[options.dtype]), product_rows(lengths, gamma)
    return (replay_engine(target, options.device, dtype, slots, options.seed, rows),
            replay_engine(drafter, options.device, dtype, slots, options.seed + 1, rows))


def _run_single(request: BenchRequest, target: Shape, drafter: Shape, trace: AcceptsTrace, recorded_on: str,
                progress: Progress | None) -> ReplayResult:
    options, started, load_before = request.options, time.perf_counter(), load_average()
    prompts = trace.prompts
    slots = max(p.prompt_tokens + p.new_tokens for p in prompts) + trace.gamma + 2
    t_engine, d_engine = _engines(target, drafter, request, slots, [p.prompt_tokens for p in prompts],
                                  trace.gamma)
    encoded = [_ids(p.prompt_tokens, target.arch.vocab_size, options.seed + i) for i, p in enumerate(prompts)]

    def target_alone(i: int, budget: int | None = None) -> tuple[float, int, int, float]:
        n = prompts[i].new_tokens if budget is None else min(prompts[i].new_tokens, budget)
        out = greedy_decode(t_engine, encoded[i], max_new_tokens=n)
        return out.elapsed_s, len(out.tokens), len(out.tokens), 0.0

    def loop(i: int, budget: int | None = None) -> tuple[float, int, int, float]:
        p = prompts[i] if budget is None else head(prompts[i], budget)
        out = speculative_generate(t_engine, d_engine, encoded[i], gamma=trace.gamma,
                                   max_new_tokens=max(p.new_tokens, 1),
                                   replay=list(zip(p.drafted, p.accepted, strict=True)))
        return out.elapsed_s, len(out.tokens), out.steps, out.draft_s

    arms = [target_alone, loop]
    for i in range(len(prompts)):  # in full on the first prompt (every step size), then the first
        for arm in arms:           # steps of each other one: no timed run is the first at its length
            arm(i, None if i == 0 else trace.gamma + 1)
    runs: list[ReplayRun] = []
    total = options.rounds * len(prompts)
    for r in range(options.rounds):
        for i, p in enumerate(prompts):
            order = arms if (i + r) % 2 == 0 else arms[::-1]
            timed = {arm: arm(i) for arm in order}
            (t_s, _, _, _), (l_s, tokens, steps, draft_s) = timed[target_alone], timed[loop]
            runs.append(ReplayRun(prompt_id=p.prompt_id, round=r, prompt_tokens=p.prompt_tokens,
                                  target_seconds=t_s, loop_seconds=l_s, new_tokens=tokens, steps=steps,
                                  draft_seconds=draft_s))
            if progress:
                progress(r * len(prompts) + i + 1, total)
    return _result(request, target, drafter, trace, recorded_on, runs, started, load_before)


def _result(request: BenchRequest, target: Shape, drafter: Shape, trace: AcceptsTrace, recorded_on: str,
            runs: Sequence[ReplayRun], started: float, load_before: str) -> ReplayResult:
    options = request.options
    first = [r for r in runs if r.round == 0]
    recorded = {p.prompt_id: p for p in trace.prompts}
    exact = all(r.steps == recorded[r.prompt_id].steps and r.new_tokens == recorded[r.prompt_id].new_tokens
                for r in runs)
    t_tps, t_int = interval_of(runs, lambda r: r.new_tokens / r.target_seconds)
    tps, tps_int = interval_of(runs, lambda r: r.new_tokens / r.loop_seconds)
    speed, speed_int = interval_of(runs, lambda r: r.target_seconds / r.loop_seconds)
    tokens = sum(r.new_tokens for r in runs)
    predicted, label = None, ""
    if not quantized(drafter.weights):
        label, model = latency_model(options.profile, options.device, options.dtype, target.arch)
        if model is not None:
            predicted = predicted_speedup(model, target.arch, drafter.arch, drafter.head_rows or None, 1,
                                          trace.gamma, trace.tokens_per_step, _context(trace))
    return ReplayResult(
        target=target.name, drafter=drafter.name, label=trace.label, source=trace.source, gamma=trace.gamma,
        device=options.device, dtype=options.dtype, threads=torch.get_num_threads(),
        host=host_label(options.device), rounds=options.rounds, n_prompts=len(trace.prompts),
        recorded_steps=sum(p.steps for p in trace.prompts),
        recorded_tokens=sum(p.new_tokens for p in trace.prompts),
        replayed_steps=sum(r.steps for r in first), replayed_tokens=sum(r.new_tokens for r in first),
        exact=exact, tokens_per_step=trace.tokens_per_step, acceptance_rate=trace.acceptance_rate,
        target_tokens_per_s=t_tps, target_tokens_per_s_interval=t_int, tokens_per_s=tps,
        tokens_per_s_interval=tps_int, speedup=speed, speedup_interval=speed_int,
        pooled_target_tokens_per_s=tokens / sum(r.target_seconds for r in runs),
        pooled_tokens_per_s=tokens / sum(r.loop_seconds for r in runs),
        draft_weights=drafter.weights, head_rows=drafter.head_rows or None, predicted_speedup=predicted,
        profile=label, note=trace.note, recorded_on=recorded_on, accepts=request.replay or "",
        load_average_before=load_before, runs=tuple(runs), versions=package_versions(),
        wall_s=round(time.perf_counter() - started, 2))


def _run_batched(request: BenchRequest, target: Shape, drafter: Shape, trace: AcceptsTrace,
                 progress: Progress | None) -> BatchedBenchResult:
    """At each B: B recorded runs (the prompts cycled) replayed together, and the target alone decoding
    the same tokens, each timed `rounds` times (the run of median time kept); `exact_match_rate` is here
    the share of sequences whose replayed counts equal the record (a batch drafts as its longest sequence
    needs, so a count near a budget's end may be cut)."""
    options, started, load_before = request.options, time.perf_counter(), load_average()
    dtype, capture, gamma = getattr(torch, TORCH_DTYPES[options.dtype]), options.device == "cuda", trace.gamma
    prompts = trace.prompts
    slots = max(p.prompt_tokens + p.new_tokens for p in prompts) + gamma + 2
    decoders = [build_decoder(s, options.device, dtype, slots, options.seed + i)
                for i, s in enumerate((target, drafter))]
    label, model = latency_model(options.profile, options.device, options.dtype, target.arch)
    context = _context(trace)
    new_tokens = round(sum(p.new_tokens for p in prompts) / len(prompts))  # priced in lockstep, after prefill
    prompt_tokens = round(sum(p.prompt_tokens for p in prompts) / len(prompts))
    heads = {trace.label: drafter.head_rows or None}
    points, sizes = [], sorted(options.batch_sizes)
    for index, size in enumerate(sizes):
        chosen = [prompts[i % len(prompts)] for i in range(size)]
        t_eng, d_eng = (BatchedStatic(d, size, slots, capture=capture) for d in decoders)
        runs = _batched_pair(t_eng, d_eng, chosen, target.arch.vocab_size, gamma, options.seed, index,
                             options.rounds)
        out = runs[0]["loop"]
        same = sum(list(a) == list(p.accepted) for a, p in zip(out.accepted, chosen, strict=True))
        priced = model if model is not None and not quantized(drafter.weights) else None
        predicted = {} if priced is None else {
            trace.label: predicted_speedup(priced, target.arch, drafter.arch, drafter.head_rows or None, size,
                                           gamma, out.tokens_per_step, context, new_tokens, prompt_tokens)}
        steps = None if priced is None else priced_step_ms(priced, target.arch, {trace.label: drafter.arch},
                                                           heads, size, gamma, context)
        point = paired_point(size, [{"target": r["target"], trace.label: r["loop"]} for r in runs], predicted,
                             steps)
        points.append(replace(point, exact_match_rate={trace.label: same / size}))
        if progress:
            progress(index + 1, len(sizes))
    predicted_cross = None
    if model is not None and not quantized(drafter.weights):
        mean_step = sum(p.tokens_per_step[trace.label] for p in points) / len(points)
        predicted_cross = first_below_one([
            (b, predicted_speedup(model, target.arch, drafter.arch, drafter.head_rows or None, b, gamma,
                                  mean_step, context, new_tokens, prompt_tokens)) for b in PREDICTED_BATCHES])
    return BatchedBenchResult(
        target=target.name, drafters={trace.label: drafter.name}, gamma=gamma,
        max_new_tokens=max(p.new_tokens for p in prompts), device=options.device, dtype=options.dtype,
        threads=torch.get_num_threads(), profile=label, points=tuple(points),
        measured_crossover={trace.label: first_below_one([(p.batch_size, p.speedup[trace.label])
                                                          for p in points])},
        predicted_crossover={trace.label: predicted_cross}, prompts=tuple(p.prompt_id for p in prompts),
        host=host_label(options.device), load_average_before=load_before, versions=package_versions(),
        wall_s=round(time.perf_counter() - started, 2), replay=f"{request.replay} ({trace.source})")


def _batched_pair(t_eng: BatchedStatic, d_eng: BatchedStatic, chosen: Sequence[AcceptsPrompt], vocab: int,
                  gamma: int, seed: int, index: int, rounds: int) -> list[dict[str, BatchedOutput]]:
    """One batch size: the target alone and the replayed loop, each warmed once (every step width met,
    on CUDA captured), then timed `rounds` times each, alternating, the order rotating with the batch size
    -> each round's pair ("target", "loop")."""
    batch = [_ids(p.prompt_tokens, vocab, seed + i) for i, p in enumerate(chosen)]
    budgets = [p.new_tokens for p in chosen]
    runs = {
        "target": lambda: batched_greedy(t_eng, batch, max_new_tokens=max(budgets), budgets=budgets),
        "loop": lambda: batched_speculative_generate(t_eng, d_eng, batch, gamma=gamma,
                                                     max_new_tokens=max(budgets),
                                                     replay=[p.accepted for p in chosen], budgets=budgets),
    }
    order = ["target", "loop"] if index % 2 == 0 else ["loop", "target"]
    for name in order:
        runs[name]()
    return [{name: runs[name]() for name in (order if r % 2 == 0 else order[::-1])} for r in range(rounds)]
