"""`bench --engine llama.cpp`: the target alone, the winner and the reference drafter in llama.cpp's own
server (`llama-server`, the stock build), every held-out prompt through every arm in interleaved rounds.

Each arm is one server (the target file, and for a drafter arm `-md FILE --spec-type draft-simple`
with the draft length fixed at the arm's gamma: `--spec-draft-n-max G --spec-draft-n-min 0
--spec-draft-p-min 0`, the fixed-length drafting the search priced). Prompts go in as the token ids
draftnas encodes (the target's chat template), greedy (`temperature 0, top_k 1`), with the prompt cache
off. The server's own timings give the generation speed (prompt processing apart) and its drafted and
accepted counts; a drafter arm's output is compared with the target alone's in the same round.

A lookup arm (`lookup:n=4,m=16`, `drafter.lookup`) runs llama.cpp's own lookup type with those sizes; a
hybrid (`lookup:n=4,m=16+FILE.gguf`) runs the lookup first and the drafter where it finds nothing. Each
server is warmed up on a prompt that is never measured; a lookup type that keeps state across requests
gets a fresh server per request, so no measured request is drafted from an identical earlier one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from draftnas.bench.arms import MAIN, REFERENCE, reference_label
from draftnas.bench.predicted import check_predictions
from draftnas.bench.records import ArmResult, ArmRun, BenchPrompt, BenchResult
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.run import unseen_prompts
from draftnas.bench.stats import compare_arms, first_divergence, interval_of, other_definition, tokens_per_s
from draftnas.core.engine_kinds import LLAMA_CPP
from draftnas.core.errors import InvalidInputError
from draftnas.core.intervals import with_interval
from draftnas.core.machine import cpu_count, cpu_identity, load_average
from draftnas.core.options import option_error
from draftnas.core.prompts import Prompt, check_context, encode_prompt
from draftnas.core.records import Progress
from draftnas.drafter.families import family, parse_drafter
from draftnas.drafter.lookup import LookupSettings
from draftnas.export.head_gguf import head_gguf_problems
from draftnas.models.gguf_file import check_drafter_gguf, engine_target, gguf_of, read_info
from draftnas.models.llama_cpp import QWEN2_PATCH, LlamaCpp, LlamaCppError, find_llama_cpp
from draftnas.models.llama_server import Server
from draftnas.models.sources import ensure_local_folder
from draftnas.search.llama_cpp import Verdict
from draftnas.search.predictions import read_predictions

log = logging.getLogger(__name__)
ENGINE = LLAMA_CPP
TARGET = "target"
WARM_UP = "Say hello in one short sentence."  # each server's first request, never measured


def drafter_file(spec: str, kind: str = "model") -> tuple[Path, Path | None]:
    """(the GGUF a drafter spec runs from, the draftnas folder it came in, if any): a .gguf file, a
    draftnas export folder holding one (`export --format gguf`), a head folder holding its eagle3 GGUF
    (`distill export RUN OUT --gguf TYPE`), or an embedded model's file."""
    path = Path(spec).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            what = (
                "no .gguf file"
                if not found
                else f"{len(found)} .gguf files ({', '.join(f.name for f in found)})"
            )
            how = ("`draftnas distill export RUN OUT --gguf F16` writes a head's" if kind == "head"
                   else "`draftnas export --format gguf` writes it")
            raise option_error("draft", f"{spec}: the folder holds {what}; llama.cpp needs one GGUF drafter "
                                        f"({how}), or give the .gguf file")
        return found[0], path
    return gguf_of(spec), None


@dataclass(frozen=True)
class LlamaArm:
    name: str
    model: Path  # the target file
    draft: Path | None = None  # the GGUF its model part runs from (a model drafter's, a head's)
    gamma: int = 0
    spec: str = ""
    lookup: LookupSettings | None = None

    @property
    def speculates(self) -> bool:
        return self.draft is not None or self.lookup is not None

    def spec_flags(self, threads: int) -> list[str]:
        """The speculative flags of this arm, as its family writes them for llama-server (a drafter file at
        its fixed gamma, lookup settings, both, or a head's file); none for the target alone."""
        if not self.speculates:
            return []
        flags = parse_drafter(self.spec).settings(ENGINE, self.gamma, threads=threads,
                                                  draft_file="" if self.draft is None else str(self.draft))
        return list(flags)


def arm_of(name: str, target_file: Path, spec: str, gamma: int) -> LlamaArm:
    """The arm that runs drafter `spec` (a GGUF drafter, lookup settings, `lookup:...+FILE`, or a head
    folder holding its eagle3 GGUF)."""
    drafter = parse_drafter(spec)
    if LLAMA_CPP not in family(drafter.family).engines:
        raise InvalidInputError(f"{spec}: a {drafter.family} drafter does not run in llama.cpp")
    draft = drafter_file(drafter.model, drafter.family)[0] if drafter.model else None
    lookup = drafter.lookup
    return LlamaArm(name, target_file, draft, gamma if draft is not None else lookup.m if lookup else 0, spec,
                    lookup)


def check_arm_files(target_file: Path, arm: LlamaArm) -> None:
    """One line, before llama.cpp is looked for, where it would not run `arm`'s drafter file beside the
    target's: a model drafter's vocabulary; a head's layers, width and tokenizer."""
    assert arm.draft is not None
    if parse_drafter(arm.spec).family != "head":
        check_drafter_gguf(target_file, arm.draft)
        return
    problems = head_gguf_problems(target_file, arm.draft)
    if problems:
        raise option_error("draft", f"{arm.spec}: llama.cpp cannot run this head beside {target_file.name}: "
                                    + "; ".join(problems))


def check_head_build(target_file: Path, arms: Sequence[LlamaArm], llama: LlamaCpp) -> None:
    """One line where a head drafts for a Qwen2 target and draftnas's own build lacks the layer-input patch
    it needs (`models.llama_cpp.PATCHES`; another build is taken as it is)."""
    heads = [a for a in arms if a.draft is not None and parse_drafter(a.spec).family == "head"]
    if not heads or read_info(target_file).architecture != "qwen2":
        return
    if llama.version.endswith("(built here)") and QWEN2_PATCH not in llama.patches:
        raise LlamaCppError(f"the llama.cpp build in {llama.bin_dir} lacks the {QWEN2_PATCH} patch a head "
                            "on a Qwen2 target needs: run `draftnas engines --build` (it rebuilds with it)")


def arm_server(llama: LlamaCpp, arm: LlamaArm, threads: int, context: int) -> Server:
    """The server of one arm: the target file with the arm's speculative flags."""
    return Server(llama, arm.name, arm.model, arm.spec_flags(threads), threads, context)


def _run(server: Server, arm: LlamaArm, ids: Sequence[int], options: BenchOptions
         ) -> tuple[ArmRun, list[int]]:
    out = server.complete(ids, options.max_new_tokens, options.seed)
    t = out["timings"]
    n, drafted, accepted = int(t["predicted_n"]), int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
    steps = max(n - accepted, 1) if arm.speculates else n
    run = ArmRun(
        arm=arm.name,
        seconds=float(t["predicted_ms"]) / 1000,
        prompt_seconds=float(t.get("prompt_ms", 0.0)) / 1000,
        new_tokens=n,
        steps=steps,
        accepted=accepted,
        drafted=drafted,
    )
    return run, [int(x) for x in out.get("tokens", [])]


def _request(llama: LlamaCpp, arm: LlamaArm, server: Server | None, ids: Sequence[int], options: BenchOptions,
             threads: int, context: int) -> tuple[ArmRun, list[int]]:
    """One measured request; an arm whose lookup keeps state across requests gets a fresh server for it
    (so no request is drafted from an earlier one), warmed up on a prompt not measured."""
    if server is not None:
        return _run(server, arm, ids, options)
    with arm_server(llama, arm, threads, context) as fresh:
        return _run(fresh, arm, ids, options)


def _arm_result(arm: LlamaArm, rows: Sequence[BenchPrompt]) -> ArmResult:
    runs = [p.run(arm.name) for p in rows]
    tps, (low, high) = interval_of(rows, lambda p: tokens_per_s(p.run(arm.name)))
    tokens = sum(r.new_tokens for r in runs)
    result = other_definition(ArmResult(
        name=arm.name,
        engine=ENGINE,
        tokens_per_s=tps,
        tokens_per_s_interval=(low, high),
        pooled_tokens_per_s=tokens / sum(r.seconds for r in runs),
    ), rows)
    if not arm.speculates:
        return result
    speedup = compare_arms(rows, arm.name, TARGET)
    drafted = max(sum(r.drafted for r in runs), 1)
    steps = max(sum(r.steps for r in runs), 1)
    return replace(
        result,
        drafter=arm.spec,
        baseline=TARGET,
        speedup=speedup.ratio,
        speedup_interval=speedup.interval,
        tokens_per_step=tokens / steps,
        mean_accepted_per_step=sum(r.accepted for r in runs) / steps,
        draft_acceptance_rate=sum(r.accepted for r in runs) / drafted,
        gamma=arm.gamma,
        lossless=all(bool(r.lossless) for r in runs),
        exact_match_rate=sum(bool(r.lossless) for r in runs) / len(runs),
    )


def run_llama_cpp_bench(
    target: str,
    draft: str,
    prompts: Sequence[Prompt],
    options: BenchOptions,
    *,
    references: Sequence[str] = (),
    progress: Progress | None = None,
) -> BenchResult:
    """Bench `draft` (and each of `references`) against `target` alone in llama.cpp: every prompt no drafter
    was healed or searched on, every arm, `options.rounds` interleaved rounds (the arms' order rotating)."""
    started, load_before = time.perf_counter(), load_average()
    options = replace(options, engine=ENGINE).validate()  # greedy, CPU, one sequence: its checks
    if not prompts:
        raise InvalidInputError("no prompts to bench")
    target_file = engine_target(target, options.target_gguf)
    arms = [LlamaArm(TARGET, target_file), arm_of(MAIN, target_file, draft, options.gamma)]
    arms += [arm_of(reference_label(i), target_file, ref, options.reference_gamma or options.gamma)
             for i, ref in enumerate(references)]
    for arm in arms:
        if arm.draft is not None:
            check_arm_files(target_file, arm)
    main = parse_drafter(draft)
    folder = drafter_file(main.model, main.family)[1] if main.family in ("model", "head") else None
    predictions = read_predictions(options.predictions) if options.predictions else None
    llama = find_llama_cpp(options.llama_cpp)
    check_head_build(target_file, arms, llama)
    threads = cpu_count()
    model_folder = ensure_local_folder(target)[1]
    tokenizer = AutoTokenizer.from_pretrained(str(model_folder))
    kept, encoded, left_out = unseen_prompts(prompts, tokenizer, [folder], options.per_domain)
    limit = int(json.loads((model_folder / "config.json").read_text())["max_position_embeddings"])
    check_context(kept, encoded, options.max_new_tokens + max(a.gamma for a in arms) + 1, limit, ENGINE)
    context = min(max(len(ids) for ids in encoded) + options.max_new_tokens + 64, limit)
    warm_up = encode_prompt(tokenizer, WARM_UP)
    rows: list[BenchPrompt] = []
    total = options.rounds * len(kept)
    with contextlib.ExitStack() as stack:
        servers = {a.name: None if a.lookup is not None and a.lookup.stateful
                   else stack.enter_context(arm_server(llama, a, threads, context)) for a in arms}
        for a in arms:  # each server's first request pays its allocations: a prompt never measured
            server = servers[a.name]
            if server is not None:
                _run(server, a, warm_up, replace(options, max_new_tokens=min(8, options.max_new_tokens)))
        for r in range(options.rounds):
            for i, (prompt, ids) in enumerate(zip(kept, encoded, strict=True)):
                shift = (i + r) % len(arms)
                done = {a.name: _request(llama, a, servers[a.name], ids, options, threads, context)
                        for a in arms[shift:] + arms[:shift]}
                plain = done[TARGET][1]
                runs = tuple(
                    replace(run, lossless=tokens == plain, first_divergence=first_divergence(tokens, plain))
                    if a.speculates
                    else run
                    for a in arms
                    for run, tokens in [done[a.name]]
                )
                rows.append(
                    BenchPrompt(
                        prompt_id=prompt.id, domain=prompt.domain, prompt_tokens=len(ids), runs=runs, round=r
                    )
                )
                if progress:
                    progress(r * len(kept) + i + 1, total)
    names = {a.name for a in arms}
    comparisons = tuple(compare_arms(rows, MAIN, a.name) for a in arms[2:] if a.name in names)
    result = BenchResult(
        target=target,
        drafters={MAIN: draft} | {reference_label(i): str(ref) for i, ref in enumerate(references)},
        gamma=options.gamma,
        temperature=0.0,
        max_new_tokens=options.max_new_tokens,
        n_prompts=len(kept),
        device="cpu",
        dtype=f"{target_file.name} (llama.cpp)",
        threads=threads,
        engine=ENGINE,
        arms=tuple(_arm_result(a, rows) for a in arms),
        prompts=tuple(rows),
        versions={"llama.cpp": llama.version},
        left_out=left_out,
        host=cpu_identity().label(),
        load_average_before=load_before,
        rounds=options.rounds,
        comparisons=comparisons,
        wall_s=round(time.perf_counter() - started, 2),
    )
    if predictions is None:
        return result
    result = replace(result, predictions=check_predictions(result, predictions))
    return replace(result, verdict=measured_verdict(result, predictions.verdict))


def measured_verdict(result: BenchResult, said: dict[str, Any] | None) -> dict[str, Any] | None:
    """The search's verdict (its step costs, break-even acceptance) with what this bench measured: a drafter
    pays only where its speedup's whole interval lies above 1."""
    if said is None:
        return None
    drafters = [a for a in result.arms if a.speedup is not None]
    best = max(drafters, key=lambda a: a.speedup or 0.0, default=None)
    ref = next((a for a in drafters if a.name == REFERENCE), None)
    pays = any(len(a.speedup_interval) == 2 and a.speedup_interval[0] > 1.0 for a in drafters)
    text = ""
    if best is not None and best.speedup is not None and len(best.speedup_interval) == 2:
        text = f"{best.name} {with_interval(best.speedup, best.speedup_interval, unit='x')}"
    return Verdict.from_dict(said).to_dict() | {
        "pays": pays, "source": "measured", "best": text,
        "median_pays": not pays and best is not None and (best.speedup or 0.0) > 1.0,
        "reference_speedup": ref.speedup if ref is not None else None}
