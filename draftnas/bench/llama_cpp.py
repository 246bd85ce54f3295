"""`bench --engine llama.cpp`: the target alone, the winner and the reference drafter in llama.cpp's own
server (`llama-server`, the stock build), every held-out prompt through every arm in interleaved rounds.

Each arm is one server (the target file, and for a drafter arm `-md FILE --spec-type draft-simple`
with the draft length fixed at the arm's gamma: `--spec-draft-n-max G --spec-draft-n-min 0
--spec-draft-p-min 0`, the fixed-length drafting the search priced). Prompts go in as the token ids
draftnas encodes (the target's chat template), greedy (`temperature 0, top_k 1`), with the prompt cache
off. The server's own timings give the generation speed (prompt processing apart) and its drafted and
accepted counts; a drafter arm's output is compared with the target alone's in the same round.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from transformers import AutoTokenizer

from draftnas.bench.arms import MAIN, REFERENCE
from draftnas.bench.predicted import check_predictions
from draftnas.bench.records import ArmResult, ArmRun, BenchOptions, BenchPrompt, BenchResult
from draftnas.bench.run import compare_arms, first_divergence, unseen_prompts
from draftnas.bench.stats import interval_of, tokens_per_s
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_count, cpu_identity, load_average
from draftnas.core.options import option_error
from draftnas.core.prompts import Prompt
from draftnas.core.records import Progress
from draftnas.models.gguf_file import check_drafter_gguf, engine_target, gguf_of
from draftnas.models.llama_cpp import LlamaCpp, LlamaCppError, find_llama_cpp, last_lines, server_flags
from draftnas.models.sources import ensure_local_folder
from draftnas.search.engine import Verdict
from draftnas.search.predictions import read_predictions

log = logging.getLogger(__name__)
ENGINE = "llama.cpp"
TARGET = "target"


def drafter_file(spec: str) -> tuple[Path, Path | None]:
    """(the GGUF a drafter spec runs from, the draftnas folder it came in, if any): a .gguf file, a
    draftnas export folder holding one (`export --format gguf`), or an embedded model's file."""
    path = Path(spec).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            what = (
                "no .gguf file"
                if not found
                else f"{len(found)} .gguf files ({', '.join(f.name for f in found)})"
            )
            raise option_error("draft", f"{spec}: the folder holds {what}; llama.cpp needs one GGUF drafter "
                                        "(`draftnas export --format gguf` writes it), or give the .gguf file")
        return found[0], path
    return gguf_of(spec), None


@dataclass(frozen=True)
class LlamaArm:
    name: str
    model: Path  # the target file
    draft: Path | None = None
    gamma: int = 0
    spec: str = ""


class Server:
    """One `llama-server` process for one arm, on a free local port, stopped on exit."""

    def __init__(self, llama: LlamaCpp, arm: LlamaArm, threads: int, context: int) -> None:
        self.arm, self.port = arm, _free_port()
        args = [
            "-m",
            str(arm.model),
            "-t",
            str(threads),
            "-c",
            str(context),
            "-np",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *server_flags(llama.flags),
        ]
        if arm.draft is not None:
            args += [
                "-md",
                str(arm.draft),
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                str(arm.gamma),
                "--spec-draft-n-min",
                "0",
                "--spec-draft-p-min",
                "0",
                "-td",
                str(threads),
            ]
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix=f"draftnas-llama-server-{arm.name}-", suffix=".log", delete=False
        )
        self.command = [str(llama.tool("llama-server")), *args]
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> Server:
        try:
            return self._ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _ready(self) -> Server:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LlamaCppError(
                    f"llama-server for {self.arm.name} exited {self.process.returncode}: "
                    f"{self.log_tail()} (command: {' '.join(self.command)})"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if json.load(r).get("status") == "ok":
                        return self
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.5)
        raise LlamaCppError(
            f"llama-server for {self.arm.name} was not ready in 300 s: {self.log_tail()}"
        )

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
        os.unlink(self.log.name)

    def log_tail(self) -> str:
        return last_lines(Path(self.log.name).read_text(errors="replace"), 3)

    def complete(self, ids: Sequence[int], n_predict: int, seed: int) -> dict[str, Any]:
        body = {
            "prompt": list(ids),
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "seed": seed,
            "return_tokens": True,
            "stream": False,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as r:
            return dict(json.load(r))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(server: Server, ids: Sequence[int], options: BenchOptions) -> tuple[ArmRun, list[int]]:
    out = server.complete(ids, options.max_new_tokens, options.seed)
    t = out["timings"]
    n, drafted, accepted = int(t["predicted_n"]), int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
    steps = max(n - accepted, 1) if server.arm.draft is not None else n
    run = ArmRun(
        arm=server.arm.name,
        seconds=float(t["predicted_ms"]) / 1000,
        new_tokens=n,
        steps=steps,
        accepted=accepted,
        drafted=drafted,
    )
    return run, [int(x) for x in out.get("tokens", [])]


def _arm_result(arm: LlamaArm, rows: Sequence[BenchPrompt]) -> ArmResult:
    runs = [p.run(arm.name) for p in rows]
    tps, (low, high) = interval_of(rows, lambda p: tokens_per_s(p.run(arm.name)))
    tokens = sum(r.new_tokens for r in runs)
    result = ArmResult(
        name=arm.name,
        engine=ENGINE,
        tokens_per_s=tps,
        tokens_per_s_interval=(low, high),
        pooled_tokens_per_s=tokens / sum(r.seconds for r in runs),
    )
    if arm.draft is None:
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
    reference: str | None = None,
    progress: Progress | None = None,
) -> BenchResult:
    """Bench `draft` (and `reference`) against `target` alone in llama.cpp: every prompt no drafter was
    healed or searched on, every arm, `options.rounds` interleaved rounds (the arms' order rotating)."""
    started, load_before = time.perf_counter(), load_average()
    options = replace(options, engine=ENGINE).validate()  # greedy, CPU, one sequence: its checks
    if not prompts:
        raise InvalidInputError("no prompts to bench")
    target_file = engine_target(target, options.target_gguf)
    draft_file, folder = drafter_file(draft)
    check_drafter_gguf(target_file, draft_file)
    ref = None
    if reference is not None:
        ref = drafter_file(reference)[0]
        check_drafter_gguf(target_file, ref)
    predictions = read_predictions(options.predictions) if options.predictions else None
    llama = find_llama_cpp(options.llama_cpp)
    threads = cpu_count()
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_local_folder(target)[1]))
    kept, encoded, left_out = unseen_prompts(prompts, tokenizer, [folder], options.per_domain)
    arms = [LlamaArm(TARGET, target_file), LlamaArm(MAIN, target_file, draft_file, options.gamma, draft)]
    if ref is not None:
        arms.append(
            LlamaArm(REFERENCE, target_file, ref, options.reference_gamma or options.gamma, str(reference))
        )
    context = max(len(ids) for ids in encoded) + options.max_new_tokens + 64
    rows: list[BenchPrompt] = []
    total = options.rounds * len(kept)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(Server(llama, arm, threads, context)) for arm in arms]
        for s in servers:  # warm-up: each server's first request pays its allocations
            _run(s, encoded[0], replace(options, max_new_tokens=min(8, options.max_new_tokens)))
        for r in range(options.rounds):
            for i, (prompt, ids) in enumerate(zip(kept, encoded, strict=True)):
                shift = (i + r) % len(servers)
                done = {s.arm.name: _run(s, ids, options) for s in servers[shift:] + servers[:shift]}
                plain = done[TARGET][1]
                runs = tuple(
                    replace(run, lossless=tokens == plain, first_divergence=first_divergence(tokens, plain))
                    if s.arm.draft is not None
                    else run
                    for s in servers
                    for run, tokens in [done[s.arm.name]]
                )
                rows.append(
                    BenchPrompt(
                        prompt_id=prompt.id, domain=prompt.domain, prompt_tokens=len(ids), runs=runs, round=r
                    )
                )
                if progress:
                    progress(r * len(kept) + i + 1, total)
    names = {a.name for a in arms}
    comparisons = (compare_arms(rows, MAIN, REFERENCE),) if REFERENCE in names else ()
    result = BenchResult(
        target=target,
        drafters={MAIN: draft} | ({REFERENCE: str(reference)} if ref is not None else {}),
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
        low, high = best.speedup_interval
        text = f"{best.name} {best.speedup:.3f}x [{low:.3f}, {high:.3f}]"
    return Verdict.from_dict(said).to_dict() | {
        "pays": pays, "source": "measured", "best": text,
        "median_pays": not pays and best is not None and (best.speedup or 0.0) > 1.0,
        "reference_speedup": ref.speedup if ref is not None else None}
