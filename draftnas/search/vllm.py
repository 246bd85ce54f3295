"""A search for vLLM (`search --engine vllm`): its constraints checked against the space, its latency model
timed inside vLLM on this host (`latency.vllm`), and the settings it prints: the `--speculative-config`
JSON for the pick and, at a batch, a `num_speculative_tokens_per_batch_size` schedule.

vLLM's `draft_model` loads a folder of an architecture it knows, dense; draftnas exports a pruned drafter
with a plain full-head copy beside its reduced head (`export --full-head`), so a reduced head is priced
as vLLM runs it, at the full vocabulary. A drafter of pruned width would load, but the calibration times
the base's full width only, so the space may not prune widths.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftnas.core.engine_kinds import VLLM
from draftnas.core.machine import cpu_count, cpu_identity
from draftnas.core.options import option_error
from draftnas.core.registry import Architecture
from draftnas.latency.vllm import VllmCalibration, VllmModel, calibrate_vllm, store_path, stored_or_calibrated
from draftnas.search.space import SearchSpace

CALIBRATION_PROMPT_TOKENS = 64  # prompt tokens a timing request reads (its prefill is timed too)


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
               threads: int | None, progress: Callable[[int, int], None] | None = None
               ) -> tuple[VllmModel, str]:
    """The vLLM latency model of this host for `space` (stored per host, vLLM version, files and settings),
    and the line saying what was measured."""
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

    def calibrate() -> VllmCalibration:
        return calibrate_vllm(vllm, target_folder, base_folder, base_arch, prompts, batches, gamma, n,
                              progress=progress)

    calibration, where = stored_or_calibrated(store_path(request), calibrate)
    model = VllmModel(calibration, target_arch, base_arch)
    return model, f"{model.summary()}; {where}"


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
    config = dict(parse_drafter(model).settings(VLLM, max([gamma, *(g for _, _, g in schedule)])))
    if schedule:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule]
    return config


def batch_schedule(batches: Sequence[int], gammas: Sequence[int], speedups: Sequence[float]
                   ) -> list[tuple[int, int, int]]:
    """γ per batch range from a sweep: each range the batches whose best γ is the same, up to the last batch
    predicted to pay (speedup > 1); none from the first that does not. A range ends just before the next
    swept batch where that one pays too, else at its own batch: no batch past the last one predicted to
    pay drafts."""
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
    return out


def config_line(config: dict[str, Any]) -> str:
    return f"--speculative-config '{json.dumps(config, separators=(',', ':'))}'"
