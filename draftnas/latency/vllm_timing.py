"""The vLLM calibration: the target's and the drafters' forwards and vLLM's own work per step, timed inside
vLLM's engine process (`models.vllm_driver` with `time_forwards`), read into a `latency.vllm.VllmCalibration`.

It starts four engines, five with a head: the target alone at batch 1..B, the target with the base as its
`draft_model` at γ, the target with `ngram` lookup at γ, the target with the head as its `eagle3` drafter at
γ, and the base cut to two layers alone, so a drafter of the base's width at any depth is priced from the
line through the depths timed. vLLM's CPU build has no synthetic acceptance (its CPU sampler asserts
against `rejection_sample_method: synthetic`), so the drafts are real; the forwards are timed by the tokens
they read, which acceptance does not change (a verify reads γ + 1 tokens per sequence whatever was
accepted).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from draftnas.core.engine_kinds import VLLM
from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.machine import cpu_identity
from draftnas.core.registry import Architecture
from draftnas.latency.vllm import VllmCalibration
from draftnas.models.sources import state_dir
from draftnas.models.vllm_engine import Vllm, run_vllm

log = logging.getLogger(__name__)
SHALLOW = 2  # the depth of the base cut timed beside its full depth


@dataclass(frozen=True)
class TimedRun:
    """One request group of a timing job: its batch, seconds, and forwards ([model, tokens, seconds])."""

    batch: int
    seconds: float
    forwards: list[list]

    @property
    def steps(self) -> int:
        return sum(1 for role, _, _ in self.forwards if role == "target")

    def overhead_ms(self) -> float:
        """vLLM's own ms per step: the group's wall time less its forwards, over its steps."""
        return 1000 * (self.seconds - sum(s for _, _, s in self.forwards)) / max(1, self.steps)


def timed_runs(result: dict) -> list[TimedRun]:
    """The request groups of a driver result run with `time_forwards`."""
    return [TimedRun(int(r["batch"]), float(r["seconds"]), r.get("forwards") or [])
            for rnd in result["rounds"] for r in rnd]


def forward_ms(runs: Sequence[TimedRun], role: str) -> dict[int, float]:
    """Median ms of `role`'s forwards by the tokens they read."""
    by: dict[int, list[float]] = {}
    for run in runs:
        for who, tokens, seconds in run.forwards:
            if who == role and tokens > 0:
                by.setdefault(int(tokens), []).append(1000 * float(seconds))
    return {n: round(statistics.median(v), 3) for n, v in sorted(by.items())}


def overhead_by_batch(runs: Sequence[TimedRun]) -> dict[int, float]:
    """Median ms of vLLM's own work per step, by the batch the group was submitted at."""
    by: dict[int, list[float]] = {}
    for run in runs:
        if run.steps:
            by.setdefault(run.batch, []).append(run.overhead_ms())
    return {b: round(max(0.0, statistics.median(v)), 3) for b, v in sorted(by.items())}


def catch_up_tokens(runs: Sequence[TimedRun], gamma: int) -> int:
    """Tokens per sequence beyond γ that the drafter's first forward after a verify reads (the most common
    over the verify steps whose sequences can be counted)."""
    seen: Counter[int] = Counter()
    for run in runs:
        f = [x for x in run.forwards if not x[0].endswith(("-logits", "-fc"))]
        for i, (role, tokens, _) in enumerate(f[:-1]):
            if role == "target" and tokens % (gamma + 1) == 0 and f[i + 1][0] == "draft":
                sequences = tokens // (gamma + 1)
                if f[i + 1][1] % sequences == 0 and sequences <= run.batch:
                    seen[f[i + 1][1] // sequences - gamma] += 1
    if not seen:
        raise InfeasibleCandidateError("vLLM's speculative run timed no verify step followed by a draft")
    return seen.most_common(1)[0][0]


@dataclass(frozen=True)
class TimedHead:
    """An eagle3 head folder to time beside the drafters: its shape's label and draft vocabulary rows."""

    folder: Path
    label: str
    rows: int


def calibrate_vllm(vllm: Vllm, target: Path, base: Path, base_arch: Architecture, prompts: list[list[int]],
                   batches: Sequence[int], gamma: int, threads: int, new_tokens: int = 16, rounds: int = 2,
                   progress: Callable[[int, int], None] | None = None, head: TimedHead | None = None
                   ) -> VllmCalibration:
    """Time the target alone, the target drafting with `base` at `gamma` (and with `head` as its eagle3
    drafter, where one is given), and `base` cut to two layers alone, each at every batch in `batches` over
    `prompts` (`new_tokens` a request, end-of-sequence ignored), inside vLLM's engine process."""
    started = time.perf_counter()
    cut = _cut(base, base_arch, SHALLOW) if base_arch.num_hidden_layers > SHALLOW else None
    job = {"dtype": "float32", "prompts": prompts, "max_tokens": new_tokens, "rounds": rounds, "seed": 0,
           "ignore_eos": True, "time_forwards": True, "batches": list(batches),
           "max_model_len": max(len(p) for p in prompts) + new_tokens + gamma + 64, "kv_cache_gb": 2}
    spec = {"method": "draft_model", "model": str(base), "num_speculative_tokens": gamma}
    ngram = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4,
             "num_speculative_tokens": gamma}
    jobs = [("target", job | {"model": str(target), "speculative_config": None}),
            ("speculative", job | {"model": str(target), "speculative_config": spec}),
            ("ngram", job | {"model": str(target), "speculative_config": ngram})]
    if head is not None:
        eagle = {"method": "eagle3", "model": str(head.folder), "num_speculative_tokens": gamma}
        jobs.append(("head", job | {"model": str(target), "speculative_config": eagle}))
    if cut is not None:
        jobs.append(("cut", job | {"model": str(cut), "speculative_config": None}))
    results: dict[str, dict] = {}
    try:
        for done, (name, one) in enumerate(jobs):
            if progress:
                progress(done, len(jobs))
            log.info("timing in vLLM: %s", name)
            results[name] = run_vllm(vllm, one, threads=threads)
    finally:
        if cut is not None:
            _remove(cut)
    if progress:
        progress(len(jobs), len(jobs))
    plain, speculative = timed_runs(results["target"]), timed_runs(results["speculative"])
    drafters = {base_arch.num_hidden_layers: forward_ms(speculative, "draft")}
    if cut is not None:
        drafters[SHALLOW] = forward_ms(timed_runs(results["cut"]), "target")
    lookup = timed_runs(results["ngram"])
    heads_run = timed_runs(results["head"]) if head is not None else []
    target_ms = forward_ms([*plain, *speculative, *lookup], "target")
    heads = forward_ms(speculative, "draft-logits")
    calibration = VllmCalibration(
        engine=VLLM, version=results["target"]["vllm"], device=vllm.device, cpu=cpu_identity(),
        threads=threads, target=str(target), base=base_arch.name, gamma=gamma, batches=tuple(batches),
        prompt_tokens=round(statistics.mean(len(p) for p in prompts)), target_ms=target_ms,
        target_head_ms=forward_ms([*plain, *speculative, *lookup], "target-logits"), drafter_ms=drafters,
        drafter_head_ms=heads, plain_overhead_ms=overhead_by_batch(plain),
        spec_overhead_ms=overhead_by_batch(speculative), catch_up_tokens=catch_up_tokens(speculative, gamma),
        ngram_overhead_ms=overhead_by_batch(lookup),
        forwards=sum(len(r.forwards) for res in results.values() for r in timed_runs(res)),
        wall_s=round(time.perf_counter() - started, 1), timed_at=time.strftime("%Y-%m-%d %H:%M"))
    if head is None:
        return calibration
    return replace(calibration, head_label=head.label, head_rows=head.rows,
                   head_ms=forward_ms(heads_run, "draft"), head_fc_ms=forward_ms(heads_run, "draft-fc"),
                   head_logits_ms=forward_ms(heads_run, "draft-logits"),
                   head_overhead_ms=overhead_by_batch(heads_run),
                   head_catch_up_tokens=catch_up_tokens(heads_run, gamma))


def _cut(base: Path, arch: Architecture, layers: int) -> Path:
    """A folder vLLM loads: `base`'s first `layers` layers (its config and tokenizer files beside them),
    under the state folder; removed once timed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = state_dir() / "vllm-cuts" / f"{arch.name}-{layers}L"
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path in sorted(base.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                parts = key.split(".")
                if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                    continue
                tensors[key] = f.get_tensor(key)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    config["num_hidden_layers"] = layers
    for key in ("layer_types", "max_window_layers"):
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for extra in base.iterdir():
        if extra.suffix in (".json", ".jinja", ".txt", ".model") and extra.name != "config.json" \
                and not extra.name.endswith(".index.json"):
            (out / extra.name).write_bytes(extra.read_bytes())
    return out


def _remove(folder: Path) -> None:
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
