"""A search for vLLM (`search --engine vllm`): its constraints checked against the space, its latency model
timed inside vLLM on this host (`latency.vllm`), and the settings it prints: the `--speculative-config`
JSON for the pick and, at a batch, a `num_speculative_tokens_per_batch_size` schedule.

vLLM's `draft_model` loads a folder of an architecture it knows, dense; draftnas exports a pruned drafter
with a plain full-head copy beside its reduced head (`export --full-head`), so a reduced head is priced
as vLLM runs it, at the full vocabulary. A drafter of pruned width would load, but the calibration times
the base's full width only, so the space may not prune widths.

Where the search prices training curves with a head among them, the calibration also times an untrained
head of the first head curve's shape as vLLM's `eagle3` drafter, so that shape is priced from its own steps
there (any other head shape is left out, with a line).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.core.engine_kinds import VLLM
from draftnas.core.machine import cpu_count, cpu_identity
from draftnas.core.options import option_error
from draftnas.core.registry import Architecture
from draftnas.latency.vllm import VllmCalibration, VllmModel, store_path, stored_or_calibrated
from draftnas.latency.vllm_timing import TimedHead, calibrate_vllm
from draftnas.search.space import SearchSpace

if TYPE_CHECKING:
    from draftnas.drafter.families import DrafterSpec
    from draftnas.drafter.head.shape import HeadShape
    from draftnas.drafter.training.distill_records import CurveSet

CALIBRATION_PROMPT_TOKENS = 64  # prompt tokens a timing request reads (its prefill is timed too)
ANY_BATCH = 65536  # the end of a schedule's closing range: vLLM reads it up to the batch it serves at most


def space_problems(space: SearchSpace) -> list[str]:
    """Why `space` offers drafters vLLM cannot run or draftnas cannot price there."""
    out = []
    other = [w for w in space.weights if w != "dense"]
    if other:
        out.append(f"weights {', '.join(other)}: vLLM runs draft models dense (allowed: dense)")
    w = space.width
    if any(r != 1.0 for r in (*w.kv_head_ratios, *w.query_head_ratios, *w.mlp_ratios, *w.hidden_ratios)):
        out.append("the space prunes widths; the vLLM calibration times drafters of the base's full width")
    if any(p > 0 for p in space.gamma.p_min):
        out.append("the space offers confidence stops (p_min); vLLM's draft_model drafts γ tokens a step")
    return out


def calibration_batches(largest: int) -> tuple[int, ...]:
    """The batches timed: 1, 2, 4, ... up to `largest`, and `largest` itself."""
    out, b = {1, largest}, 2
    while b < largest:
        out.add(b)
        b *= 2
    return tuple(sorted(out))


def vllm_model(target: str, target_arch: Architecture, base: str, base_arch: Architecture, space: SearchSpace,
               threads: int | None, progress: Callable[[int, int], None] | None = None,
               curves: CurveSet | None = None) -> tuple[VllmModel, str]:
    """The vLLM latency model of this host for `space` (stored per host, vLLM version, files and settings),
    and the line saying what was measured; with the first head curve's shape in `curves` timed too."""
    from draftnas.models.sources import ensure_local_folder
    from draftnas.models.vllm_engine import find_vllm

    problems = space_problems(space)
    if problems:
        raise option_error("engine", f"vllm with search space {space.name!r}: " + "; ".join(problems))
    vllm = find_vllm()
    target_folder, base_folder = ensure_local_folder(target)[1], ensure_local_folder(base)[1]
    n = threads or cpu_count()
    batches = calibration_batches(max(space.workload.batch_sizes))
    gamma = space.gamma.max
    prompts = calibration_prompts(target_folder, space.workload.prompt_set)
    request = {"engine": VLLM, "version": vllm.version, "python": str(vllm.python),
               "cpu": cpu_identity().label(), "threads": n, "target": _folder_key(target_folder),
               "base": _folder_key(base_folder), "batches": list(batches), "gamma": gamma, "prompts": prompts}
    shape = _head_shape(target, target_folder, curves)
    if shape is not None:
        request["head"] = shape.label()

    def calibrate() -> VllmCalibration:
        if shape is None:
            return calibrate_vllm(vllm, target_folder, base_folder, base_arch, prompts, batches, gamma, n,
                                  progress=progress)
        from draftnas.drafter.head.build import untrained_head
        from draftnas.models.sources import state_dir

        folder = untrained_head(shape, state_dir() / "vllm-cuts" / f"{target_arch.name}-timing-head")
        try:
            return calibrate_vllm(vllm, target_folder, base_folder, base_arch, prompts, batches, gamma, n,
                                  progress=progress, head=TimedHead(folder, shape.label(), shape.draft_vocab))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    calibration, where = stored_or_calibrated(store_path(request), calibrate)
    model = VllmModel(calibration, target_arch, base_arch, head=head_arch(target_arch, shape))
    return model, f"{model.summary()}; {where}"


def _head_shape(target: str, target_folder: Path, curves: CurveSet | None) -> HeadShape | None:
    """The shape of the first head curve in `curves` (its target's attention heads), None where none is."""
    from draftnas.drafter.head.shape import head_shape

    head = next((c for c in (curves.curves if curves else ()) if c.family == "head"), None)
    if head is None:
        return None
    config = json.loads((target_folder / "config.json").read_text())
    return head_shape(config, target, layers=head.layers, draft_vocab=head.head_rows, ffn=head.ffn)


def head_arch(target_arch: Architecture, shape: HeadShape | None) -> Architecture | None:
    """What the search prices a head of `shape` as (`drafter.head.shape.priced_arch`; None for none)."""
    from draftnas.drafter.head.shape import priced_arch

    return None if shape is None else priced_arch(target_arch, len(shape.layers), shape.ffn, shape.label())


def calibration_prompts(target_folder: Path, prompt_set: str) -> list[list[int]]:
    """Two prompts of the workload's set, encoded as the bench encodes them (the target's chat template),
    each cut to its first `CALIBRATION_PROMPT_TOKENS` tokens."""
    from transformers import AutoTokenizer

    from draftnas.core.prompts import encode_prompt, load_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(target_folder))
    prompts = load_prompts(prompt_set or "all", per_domain=1)[:2]
    return [encode_prompt(tokenizer, p.text)[:CALIBRATION_PROMPT_TOKENS] for p in prompts]


def _folder_key(folder: Path) -> list[object]:
    weights = sorted(folder.glob("*.safetensors"))
    stamps = [int(w.stat().st_mtime) for w in weights]
    return [str(folder), sum(w.stat().st_size for w in weights), max(stamps, default=0)]


def speculative_config(folder: str, gamma: int, schedule: Sequence[tuple[int, int, int]] = ()
                       ) -> dict[str, Any]:
    """vLLM's `speculative_config` for a model drafter exported to `folder` (its full-head copy where its
    head is reduced) at `gamma`, with a batch-size schedule where one is given (γ at most `gamma`)."""
    from draftnas.drafter.families import parse_drafter
    from draftnas.models.records import FULL_HEAD_DIR

    plain = Path(folder) / FULL_HEAD_DIR
    model = str(plain) if (Path(folder) / "config.json").is_file() and plain.is_dir() else folder
    return scheduled_config(parse_drafter(model), gamma, schedule)


def scheduled_config(spec: DrafterSpec, gamma: int, schedule: Sequence[tuple[int, int, int]] = (),
                     **where: Any) -> dict[str, Any]:
    """`spec`'s vLLM config drafting at most the larger of `gamma` and the schedule's γ, with the batch-size
    schedule where one is given (`where` as the family's settings take it: the folder vLLM loads)."""
    config = dict(spec.settings(VLLM, max([gamma, *(g for _, _, g in schedule)]), **where))
    if schedule:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule]
    return config


def batch_schedule(batches: Sequence[int], gammas: Sequence[int], speedups: Sequence[float]
                   ) -> list[tuple[int, int, int]]:
    """γ per batch range from a sweep: each range the batches whose best γ is the same, up to the last batch
    predicted to pay (speedup > 1), then one closing range to any batch at the best γ of the first batch that
    does not pay (merged with the last where they agree). A range ends just before the next swept batch where
    that one pays too, else at its own batch. vLLM cannot stop drafting within a server: it carries a
    schedule's last γ on to every larger batch, and at γ 0 it still runs the drafter's first forward each
    step, which prices (and measured on a Zen 4) below γ 1. Empty where batch 1 does not pay."""
    pays = [s > 1.0 and g >= 1 for g, s in zip(gammas, speedups, strict=True)]
    out: list[tuple[int, int, int]] = []
    for i, (b, g) in enumerate(zip(batches, gammas, strict=True)):
        if not pays[i]:
            break
        end = batches[i + 1] - 1 if i + 1 < len(batches) and pays[i + 1] else b
        if out and out[-1][2] == g:
            out[-1] = (out[-1][0], end, g)
        else:
            out.append((b, end, g))
    if out:
        after = next((g for g, p in zip(gammas, pays, strict=True) if not p and g >= 1), out[-1][2])
        if after == out[-1][2]:
            out[-1] = (out[-1][0], ANY_BATCH, after)
        else:
            out.append((out[-1][1] + 1, ANY_BATCH, after))
    return out


def schedule_gamma(schedule: Sequence[Sequence[int]], batch: int) -> int:
    """The γ vLLM drafts at `batch` running sequences under `schedule` (its ranges, as vLLM reads them: a
    batch in no range takes the γ of the last range before it)."""
    found = 0
    for start, end, gamma in sorted(tuple(r) for r in schedule):
        if start > batch:
            break
        found = gamma
        if batch <= end:
            break
    return found


def parse_schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """A batch-size schedule as `START-END:γ,...` (`1-3:4,4-65536:0`) or as the JSON list the search
    prints (`[[1,3,4],[4,65536,0]]`), checked as vLLM checks it: ranges in order, not overlapping, the
    first from batch 1, γ >= 0, and some range drafting."""
    text = text.strip()
    try:
        if text.startswith("["):
            rows = [tuple(int(x) for x in r) for r in json.loads(text)]
        else:
            rows = []
            for part in text.split(","):
                span, drafts = part.split(":")
                start, end = span.split("-")
                rows.append((int(start), int(end), int(drafts)))
    except (ValueError, TypeError) as e:
        raise option_error("gamma_schedule", f"{text!r} is not START-END:γ,... (e.g. 1-3:4,4-65536:0) nor "
                                             f"the JSON list the search prints ({e})") from None
    if any(len(r) != 3 for r in rows):
        raise option_error("gamma_schedule", f"{text!r}: each range is (start, end, γ)")
    previous = 0
    for low, high, gamma in rows:
        first = previous == 0
        if (first and low != 1) or (not first and low <= previous):
            raise option_error("gamma_schedule", f"{text!r}: ranges must start at batch 1 and follow each "
                                                 "other in order without overlapping")
        if high < low or gamma < 0:
            raise option_error("gamma_schedule", f"{text!r}: a range's end is below its start or its γ is "
                                                 "negative")
        previous = high
    if not any(g for _, _, g in rows):
        raise option_error("gamma_schedule", f"{text!r} never drafts a token at any batch (every γ is 0)")
    return tuple((s, e, g) for s, e, g in rows)


def config_line(config: dict[str, Any]) -> str:
    return f"--speculative-config '{json.dumps(config, separators=(',', ':'))}'"
