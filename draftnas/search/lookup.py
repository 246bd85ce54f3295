"""The lookup search (`draftnas lookup`): lookup drafting priced for one target, workload and engine.

Lookup drafting is deterministic given the text, so its acceptance is not estimated: each setting (match
length n, draft length m) is replayed exactly (`drafter.lookup.replay_lookup`) over the target's own greedy
answers to the workload's search split, as the engine produced them (the target alone in `llama-server`).
Its latency is measured: the engine's decode and its batches of 2..max(m)+1 tokens, timed with the stock
`llama-bench` at the workload's depth (the prompts' median length plus half an answer). A step that drafts
d tokens costs a (d+1)-token batch, one that finds nothing a decode, so a prompt's predicted speedup is its
plain decode time over the sum of its steps' costs; the ranking is by the median over prompts (what the
bench's paired median measures). Every third prompt (`acceptance.records.held_out`) is left out and
written to `heldout-prompts.jsonl` for the bench.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from draftnas.acceptance.records import held_out
from draftnas.core.errors import InvalidInputError
from draftnas.core.intervals import median_interval
from draftnas.core.machine import cpu_count, cpu_identity
from draftnas.core.prompts import Prompt, encode_prompt, load_prompts
from draftnas.core.records import Progress
from draftnas.drafter.lookup import LookupReplay, LookupSettings, replay_lookup
from draftnas.latency.llama_cpp import probe_flags, time_gguf
from draftnas.models.gguf_file import engine_target
from draftnas.models.llama_cpp import LlamaCpp, find_llama_cpp
from draftnas.models.llama_server import Server
from draftnas.search.lookup_records import LookupPrice, LookupRequest, LookupResult

log = logging.getLogger(__name__)
RESULT_FILE = "lookup.json"
HELDOUT_FILE = "heldout-prompts.jsonl"


def step_ms(decode_ms: float, batch_ms: dict[int, float], drafted: int) -> float:
    """What one step costs: a decode when nothing was drafted, else a batch of the drafts and one more."""
    if drafted <= 0:
        return decode_ms
    tokens = drafted + 1
    if tokens in batch_ms:
        return batch_ms[tokens]
    known = sorted(batch_ms)
    low = max((k for k in known if k < tokens), default=known[0])
    high = min((k for k in known if k > tokens), default=known[-1])
    if low == high:
        return batch_ms[low] * tokens / low
    return batch_ms[low] + (batch_ms[high] - batch_ms[low]) * (tokens - low) / (high - low)


def request_times(replay: LookupReplay, decode_ms: float, batch_ms: dict[int, float]) -> tuple[float, float]:
    """(plain time, lookup time) of one answer, ms: the steps after the prefill's first token."""
    plain = (replay.new_tokens - 1) * decode_ms
    return plain, sum(step_ms(decode_ms, batch_ms, d) for d in replay.drafted)


def price_setting(settings: LookupSettings, traces: Sequence[tuple[list[int], list[int]]], decode_ms: float,
                  batch_ms: dict[int, float]) -> LookupPrice:
    """`settings` replayed over every (prompt ids, answer ids) and priced with the step costs."""
    replays = [replay_lookup(p, a, settings.n, settings.m) for p, a in traces if len(a) > 1]
    if not replays:
        raise InvalidInputError("the target answered every prompt with at most one token: nothing to price")
    times = [request_times(r, decode_ms, batch_ms) for r in replays]
    ratios = sorted(plain / spent for plain, spent in times)
    _, ci_low, ci_high = median_interval(ratios)
    steps = sum(r.steps for r in replays)
    drafted = sum(sum(r.drafted) for r in replays)
    return LookupPrice(
        label=settings.label, n=settings.n, m=settings.m,
        tokens_per_step=round(sum(sum(r.accepted) + r.steps for r in replays) / steps, 4),
        acceptance=round(sum(sum(r.accepted) for r in replays) / max(drafted, 1), 4),
        drafted_share=round(sum(sum(d > 0 for d in r.drafted) for r in replays) / steps, 4),
        speedup=round(statistics.median(ratios), 4), speedup_low=round(ratios[0], 4),
        pooled_speedup=round(sum(p for p, _ in times) / sum(s for _, s in times), 4),
        break_even_tokens_per_step=round(step_ms(decode_ms, batch_ms, settings.m) / decode_ms, 3),
        speedup_ci_low=round(ci_low, 4), speedup_ci_high=round(ci_high, 4),
    )


def split_prompts(prompts: Sequence[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(searched, held out): every third prompt, counting from the first, is held out."""
    return ([p for i, p in enumerate(prompts) if not held_out(i)], [p for i,
                                                                    p in enumerate(prompts) if held_out(i)])


def engine_answers(llama: LlamaCpp, target_file: Path, encoded: Sequence[list[int]], max_new_tokens: int,
                   threads: int, progress: Progress | None = None, flags: Sequence[str] = (),
                   ) -> tuple[list[list[int]], list[float]]:
    """The target's greedy answers in llama.cpp, token ids, and the server's decode time of each (ms after
    the first token: its `predicted_ms`); the target alone, or with `flags` (lookup settings)."""
    context = max(len(ids) for ids in encoded) + max_new_tokens + 64
    answers, times = [], []
    with Server(llama, "target", target_file, flags, threads, context) as server:
        for i, ids in enumerate(encoded):
            reply = server.complete(ids, max_new_tokens, 0)
            answers.append([int(t) for t in reply.get("tokens", [])])
            times.append(float(reply.get("timings", {}).get("predicted_ms", 0.0)))
            if progress:
                progress(i + 1, len(encoded))
    return answers, times


def server_step_scale(settings: LookupSettings, traces: Sequence[tuple[list[int], list[int]]],
                      plain_ms: Sequence[float], lookup_ms: Sequence[float], decode_ms: float,
                      batch_ms: dict[int, float]) -> tuple[float, float]:
    """(the server's decode ms, the scale of its drafting steps over `llama-bench`'s batches): the server's
    decode from its plain answers (time over tokens after the first), and the scale that makes the replayed
    steps of `settings` cost what the server spent answering with them, pooled over prompts. llama-bench
    times a batch alone; the server's speculative step also drafts, samples each position and keeps its
    cache, which `llama-bench` prices too cheaply."""
    answered = [(len(a) - 1, ms) for (_, a), ms in zip(traces, plain_ms, strict=True)
                if len(a) > 1 and ms > 0]
    if not answered:
        return decode_ms, 1.0
    server_decode = sum(ms for _, ms in answered) / sum(n for n, _ in answered)
    decodes, batches, spent = 0, 0.0, 0.0
    for (prompt, answer), ms in zip(traces, lookup_ms, strict=True):
        if len(answer) <= 1 or ms <= 0:
            continue
        replay = replay_lookup(prompt, answer, settings.n, settings.m)
        decodes += sum(d == 0 for d in replay.drafted)
        batches += sum(step_ms(decode_ms, batch_ms, d) for d in replay.drafted if d > 0)
        spent += ms
    if batches <= 0:
        return server_decode, 1.0
    return server_decode, max(spent - decodes * server_decode, 0.0) / batches


def search_lookup(request: LookupRequest, *, progress: Progress | None = None,
                  steps_progress: Progress | None = None) -> LookupResult:
    """Price every (n, m) of the request on its workload's search split in its engine; write the result and
    the held-out prompts into `request.out`. `progress`: the target's answers; `steps_progress`: the
    answers again with lookup, timing the server's steps."""
    from transformers import AutoTokenizer

    from draftnas.models.sources import ensure_local_folder

    request = request.validate()
    started = time.perf_counter()
    prompts = load_prompts(request.prompts)
    searched, kept_back = split_prompts(prompts) if request.held_out else (list(prompts), [])
    if not searched or (request.held_out and not kept_back):
        raise InvalidInputError(f"prompt set {request.prompts!r} has {len(prompts)} prompt(s); the lookup "
                                "search needs at least 2 (every third is held out for the bench)")
    target_file = engine_target(request.target, request.target_gguf)
    threads = cpu_count()
    llama = probe_flags(find_llama_cpp(request.llama_cpp), target_file, threads)
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_local_folder(request.target)[1]))
    encoded = [encode_prompt(tokenizer, p.text) for p in searched]
    answers, plain_ms = engine_answers(llama, target_file, encoded, request.max_new_tokens, threads, progress)
    depth = int(statistics.median(len(ids) for ids in encoded)) + request.max_new_tokens // 2
    timing = time_gguf(llama, target_file, tuple(range(1, max(request.m) + 2)), depth, threads, repeats=2)
    traces = list(zip(encoded, answers, strict=True))
    settings = [LookupSettings(n=n, m=m) for n in request.n for m in request.m if m >= n]
    bench_prices = sorted((price_setting(s, traces, timing.decode_ms, timing.batch_ms) for s in settings),
                          key=lambda p: -p.speedup)
    decode_ms, batch_ms, scale = timing.decode_ms, dict(timing.batch_ms), 1.0
    if request.server_steps:  # the server answers again with llama-bench's pick: its steps priced as run
        first = LookupSettings(n=bench_prices[0].n, m=bench_prices[0].m)
        _, lookup_ms = engine_answers(llama, target_file, encoded, request.max_new_tokens, threads,
                                      steps_progress, flags=first.llama_cpp_flags())
        decode_ms, scale = server_step_scale(first, traces, plain_ms, lookup_ms, timing.decode_ms,
                                             timing.batch_ms)
        batch_ms = {k: v * scale for k, v in timing.batch_ms.items()}
        log.info("llama-server's steps: decode %.1f ms (llama-bench %.1f), drafting steps %.2fx "
                 "llama-bench's batches", decode_ms, timing.decode_ms, scale)
    prices = sorted((price_setting(s, traces, decode_ms, batch_ms) for s in settings),
                    key=lambda p: -p.speedup)
    best = LookupSettings(n=prices[0].n, m=prices[0].m)
    out = Path(request.out)
    out.mkdir(parents=True, exist_ok=True)
    heldout_file = out / HELDOUT_FILE if kept_back else None
    if heldout_file is not None:
        rows = "".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in kept_back)
        heldout_file.write_text(rows, "utf-8")
    result = LookupResult(
        target=request.target, engine=request.engine, workload=request.prompts,
        searched_prompts=tuple(p.id for p in searched), heldout_prompts=tuple(p.id for p in kept_back),
        heldout_file=str(heldout_file or ""), context_tokens=depth, decode_ms=decode_ms,
        batch_ms=batch_ms, prices=tuple(prices), bench_decode_ms=timing.decode_ms,
        bench_batch_ms=dict(timing.batch_ms), server_step_scale=scale,
        bench_best=bench_prices[0] if request.server_steps else None, flags=tuple(best.llama_cpp_flags()),
        transformers=best.transformers_kwargs(), host=cpu_identity().label(), threads=threads,
        versions={"llama.cpp": llama.version}, answer_tokens=sum(len(a) for a in answers),
    )
    result = replace(result, wall_s=round(time.perf_counter() - started, 1))
    (out / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n", "utf-8")
    return result
