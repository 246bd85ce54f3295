"""What a vLLM bench predicted beside what it measured: each arm's requests priced from this host's vLLM
calibration (`latency.vllm`, stored by `search --engine vllm`) and draftnas's replay of the same requests
(its steps: accepted and drafted, exact for greedy), prompt by prompt; the median over prompts and the
pooled figure set beside the bench's, as for the other engines' predictions.

The prediction is priced on the bench's own prompts (their lengths, the tokens each request generated, the
replay's steps), so its error is the latency model's, with acceptance as replayed; the replay itself is
checked against vLLM's counters per position (`bench.vllm.position_lines`).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftnas.bench.arms import MAIN
from draftnas.bench.records import BenchPrompt, BenchResult, PredictionCheck
from draftnas.bench.stats import relative_error
from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.machine import cpu_identity
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.latency.vllm import VllmCalibration, VllmModel, Walk
from draftnas.models.sources import state_dir
from draftnas.search.vllm import schedule_gamma

log = logging.getLogger(__name__)
SOURCE = "vllm calibration"


def stored_calibration(target_folder: Path, version: str, threads: int, batch: int = 1
                       ) -> tuple[VllmCalibration, Path] | None:
    """The vLLM calibration stored on this host for the target in `target_folder`, this vLLM version and
    thread count: the newest of those timed up to `batch` where one is, else the newest; None where
    `search --engine vllm` made none."""
    here = cpu_identity()
    found = []
    for path in (state_dir() / "calibrations").glob("vllm-*.json"):
        try:
            c = VllmCalibration.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            continue
        if (c.target == str(target_folder) and c.version == version and c.threads == threads
                and c.cpu.label() == here.label()):
            found.append((max(c.batches) >= batch, c.timed_at, str(path), c))
    if not found:
        return None
    *_, newest, calibration = max(found, key=lambda f: f[:3])
    return calibration, Path(newest)


def arm_group_ms(model: VllmModel, kind: str, drafter: Architecture | None, gamma: int | Callable[[int], int],
                 prompt_tokens: Sequence[int], new_tokens: Sequence[int],
                 steps: Sequence[Walk]) -> float:
    """Requests of an arm submitted together, priced by `model` (`VllmModel.group_ms`): the target alone
    decoding each request's `new_tokens`, a model drafter over each request's replayed `steps` (or its
    chain, at a γ that may follow the batch), or lookup drafting what each replayed step drafted."""
    if kind == "target":
        steps = [[(0, 0)] * (n - 1) for n in new_tokens]
    return model.group_ms(kind, drafter, gamma, prompt_tokens, steps)


def arm_request_ms(model: VllmModel, kind: str, drafter: Architecture | None, gamma: int, prompt_tokens: int,
                   new_tokens: int, steps: Sequence[tuple[int, int]]) -> float:
    """One request of an arm alone (a group of one, `arm_group_ms`)."""
    return arm_group_ms(model, kind, drafter, gamma, [prompt_tokens], [new_tokens], [steps])


@dataclass(frozen=True)
class PricedArm:
    """What prices one arm's requests: its kind ("target", "model", "head" or "lookup"), its drafter's shape
    (a model drafter's or a head's), γ, and the batch-size schedule of γ it drafts by, if any."""

    kind: str
    drafter: Architecture | None = None
    gamma: int = 0
    schedule: tuple[tuple[int, int, int], ...] = ()

    def gamma_at(self, batch: int) -> int:
        """The γ it drafts at `batch` running sequences."""
        return schedule_gamma(self.schedule, batch) if self.schedule else self.gamma


def batch_speedups(model: VllmModel, arms: Mapping[str, PricedArm], prompt_tokens: Sequence[int],
                   new_tokens: Sequence[int], steps: Mapping[str, Sequence[Walk]],
                   batches: Sequence[int]) -> dict[int, dict[str, float]]:
    """Per batch B, each drafter arm's predicted speedup over the target alone as the batched bench runs
    them (`bench.vllm_batched`): at B = 1 each prompt alone, one after another; at B > 1 one group of B
    prompts cycled from the list, submitted together. Each request's tokens and steps (or chain) are the
    replay's of its prompt; an arm with a schedule drafts, at each step, the γ of the batch that step ran.
    An arm the calibration cannot price is left out, with a log line."""
    def groups(b: int) -> list[list[int]]:
        n = len(prompt_tokens)
        return [[i] for i in range(n)] if b == 1 else [[i % n for i in range(b)]]

    def ms(arm: PricedArm, walks: Sequence[Walk], b: int) -> float:
        return sum(arm_group_ms(model, arm.kind, arm.drafter, arm.gamma_at, [prompt_tokens[i] for i in g],
                                [new_tokens[i] for i in g], [walks[i] for i in g] if walks else [])
                   for g in groups(b))

    out: dict[int, dict[str, float]] = {b: {} for b in batches}
    plain = {b: ms(PricedArm("target"), [], b) for b in batches}  # the target alone, once per batch
    for name, arm in arms.items():
        if arm.kind == "target":
            continue
        try:
            for b in batches:
                out[b][name] = plain[b] / ms(arm, steps[name], b)
        except InfeasibleCandidateError as e:
            log.info("%s: not priced from the vLLM calibration (%s)", name, e)
            for b in batches:
                out[b].pop(name, None)
    return out


def predicted_checks(result: BenchResult, model: VllmModel, kinds: Mapping[str, str],
                     drafters: Mapping[str, Architecture | None], steps: Mapping[str, Sequence[Sequence]]
                     ) -> tuple[PredictionCheck, ...]:
    """Each arm's predicted median and pooled tokens/s and speedup over the first round's prompts, beside the
    bench's (an arm whose drafter the calibration cannot price is left out, with a log line)."""
    rows = [p for p in result.prompts if p.round == 0]
    target = "target"
    plain_pooled = result.arm(target).pooled_tokens_per_s
    plain = [_ms(model, "target", None, 0, p, [], target) for p in rows]
    out = []
    for arm in result.arms:
        kind = kinds[arm.name]
        try:
            walks = steps.get(arm.name) or [[]] * len(rows)
            ms = [_ms(model, kind, drafters.get(arm.name), arm.gamma or 0, p, walks[i], target)
                  for i, p in enumerate(rows)]
        except InfeasibleCandidateError as e:
            log.info("%s: not priced from the vLLM calibration (%s)", arm.name, e)
            continue
        tokens = [p.run(target).new_tokens for p in rows]
        tps = [1000 * n / m for n, m in zip(tokens, ms, strict=True)]
        speedups = [pm / m for pm, m in zip(plain, ms, strict=True)]
        pooled_tps = 1000 * sum(tokens) / sum(ms)
        pooled_speedup = sum(plain) / sum(ms)
        median_tps, median_speedup = statistics.median(tps), statistics.median(speedups)
        error = relative_error(median_tps, arm.tokens_per_s)
        assert error is not None
        measured_speedup = arm.speedup if arm.name != target else None
        pooled = (arm.pooled_tokens_per_s / plain_pooled
                  if measured_speedup and arm.pooled_tokens_per_s and plain_pooled else None)
        out.append(PredictionCheck(
            arm=arm.name, role="winner" if arm.name == MAIN else kind if kind != "model" else "reference",
            name=arm.drafter or "target alone", predicted_tokens_per_s=pooled_tps,
            measured_tokens_per_s=arm.tokens_per_s, tokens_per_s_error=error,
            predicted_speedup=pooled_speedup if measured_speedup else None,
            measured_speedup=measured_speedup,
            speedup_error=relative_error(median_speedup, measured_speedup) if measured_speedup else None,
            source=SOURCE, pooled_tokens_per_s=arm.pooled_tokens_per_s,
            pooled_tokens_per_s_error=relative_error(pooled_tps, arm.pooled_tokens_per_s),
            pooled_speedup=pooled, pooled_speedup_error=relative_error(pooled_speedup, pooled),
            predicted_bench_median_tokens_per_s=median_tps,
            predicted_bench_median_speedup=median_speedup if measured_speedup else None))
    return tuple(out)


def _ms(model: VllmModel, kind: str, drafter: Architecture | None, gamma: int, prompt: BenchPrompt,
        steps: Sequence, target: str) -> float:
    new_tokens = prompt.run(target).new_tokens
    return arm_request_ms(model, kind, drafter, gamma, prompt.prompt_tokens, new_tokens, steps)


def priced_arms(calibration: VllmCalibration, target: Architecture, arms: Mapping[str, tuple[str, str]]
                ) -> tuple[VllmModel, dict[str, Architecture | None]]:
    """The model pricing `arms` (name -> its kind and the folder vLLM loads) from `calibration`, and each
    arm's drafter shape: a model drafter's from its config, a head's as the search prices its shape
    (`search.vllm.head_arch`), the head the calibration timed priced from its own steps."""
    from draftnas.drafter.head.folder import read_shape
    from draftnas.search.vllm import head_arch

    drafters: dict[str, Architecture | None] = {}
    timed = None
    for name, (kind, folder) in arms.items():
        if kind == "head":
            shape = read_shape(folder)
            drafters[name] = head_arch(target, shape)
            if shape.label() == calibration.head_label:
                timed = drafters[name]
        else:
            drafters[name] = drafter_arch(folder) if kind == "model" else None
    return VllmModel(calibration, target, resolve_architecture(calibration.base), head=timed), drafters


def drafter_arch(folder: str) -> Architecture | None:
    """The drafter's shape from its folder's config (None where it has none)."""
    return resolve_architecture(folder) if folder and (Path(folder) / "config.json").is_file() else None
