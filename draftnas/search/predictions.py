"""What a search predicts for the runs a bench will make, written as JSON beside the study.

`predictions.json` holds, for the target alone, the winner and each reference drafter with weights,
the predicted tokens/s, speedup and their terms (draft and verify ms, tokens per step, gamma). A bench
given the file (`draftnas bench --predictions`) prints each beside what it measured.

Most of those predictions re-read shapes the calibration timed a few minutes earlier. To check the
latency model itself, each reference is priced a second time as if its full depth had not been timed
(`CalibratedModel.without_full_depth`: from the line through its 1-, 2- and half-depth prefixes); that
"held out" prediction and its error are reported apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from draftnas.core.options import option_error
from draftnas.core.records import Record, write_json_file
from draftnas.core.throughput import RequestTerms
from draftnas.latency.corrected import CalibratedModel
from draftnas.search.records import RankedTrial, SearchResult
from draftnas.search.run_options import SearchOptions
from draftnas.search.scoring import predict_workload, weights_predictor

FILE_NAME = "predictions.json"
ROLES = ("target", "winner", "reference")


@dataclass(frozen=True)
class ArmPrediction(Record):
    """One predicted run: `role` target / winner / reference, at batch 1 of the workload."""

    role: str
    name: str
    tokens_per_s: float
    speedup: float | None = None
    gamma: int | None = None
    tokens_per_step: float | None = None
    draft_ms: float | None = None
    verify_ms: float | None = None
    target_ms: float | None = None
    held_out: bool = False  # priced by the latency model on a shape the calibration did not time
    p_min: float = 0.0  # the drafter's confidence stop (0: gamma drafts every step)
    # the median over prompts of each prompt's tokens/s and speedup (what a bench's headline is), where the
    # acceptance was walked per prompt; tokens_per_s / speedup are the pooled figures
    median_tokens_per_s: float | None = None
    median_speedup: float | None = None
    request: RequestTerms | None = None  # the latencies that priced it, to price a bench's prompts alike


@dataclass(frozen=True)
class SearchPredictions(Record):
    study: str
    target: str
    dtype: str
    engine: str | None
    calibration: str
    arms: tuple[ArmPrediction, ...]
    verdict: dict[str, Any] | None = None  # llama.cpp: the search's verdict (`search.llama_cpp.Verdict`)

    def get(self, role: str, held_out: bool = False, name: str | None = None) -> ArmPrediction | None:
        return next((a for a in self.arms if a.role == role and a.held_out == held_out
                     and (name is None or a.name == name)), None)


def arm_prediction(role: str, r: RankedTrial, held_out: bool = False) -> ArmPrediction:
    e = r.primary
    return ArmPrediction(role=role, name=r.reference or r.candidate.name,
                         tokens_per_s=r.throughput.tokens_per_s, speedup=r.throughput.speedup,
                         gamma=e.gamma, tokens_per_step=e.tokens_per_step,
                         draft_ms=e.draft_ms, verify_ms=e.verify_ms, target_ms=e.target_ms, held_out=held_out,
                         p_min=e.p_min, median_tokens_per_s=r.throughput.median_tokens_per_s,
                         median_speedup=r.throughput.median_speedup, request=r.throughput.request)


def _held_out(r: RankedTrial, model: CalibratedModel, options: SearchOptions) -> ArmPrediction | None:
    """`r` priced again without its stack's full-depth timing (None when no such timing priced it)."""
    c = model.calibration
    weights = r.candidate.choice.weights
    stacks = c.stacks if weights == "dense" else c.quant_stacks.get(weights, {})
    shape = r.candidate.arch.with_shape(name="")
    names = frozenset(n for n, s in stacks.items() if s.arch.with_shape(name="") == shape)
    # a stack timed at no depth below its full one (a 1-layer drafter) has no line to price it without
    if not names or any(not any(k < stacks[n].arch.num_hidden_layers for k in stacks[n].prefix_ms)
                        for n in names):
        return None
    predictor = weights_predictor(model.without_full_depth(names), r.candidate.choice.weights)
    draft = tuple(predictor.predict_ms(r.candidate.arch, batch_size=b, new_tokens=1,
                                       context_tokens=options.space.workload.context_tokens,
                                       head_vocab_size=r.candidate.head_vocab_size)
                  for b in r.latency.batch_sizes)
    latency = replace(r.latency, draft_ms=draft)
    throughput = predict_workload(latency, r.acceptance, options.space.workload, options.space.gamma)
    return arm_prediction("reference", replace(r, latency=latency, throughput=throughput), held_out=True)


def search_predictions(result: SearchResult, predictor: object, options: SearchOptions) -> SearchPredictions:
    """The target alone, the best trial and each reference, predicted; references held out too when the
    latency model is a host calibration."""
    arms = []
    if result.best is not None:
        b = result.best
        arms.append(ArmPrediction(role="target", name=result.info.target, target_ms=b.primary.target_ms,
                                  tokens_per_s=b.throughput.baseline_tokens_per_s))
        arms.append(arm_prediction("winner", b))
    for r in result.references:
        arms.append(arm_prediction("reference", r))
        if isinstance(predictor, CalibratedModel):
            held = _held_out(r, predictor, options)
            if held is not None:
                arms.append(held)
    return SearchPredictions(study=result.study_name, target=result.info.target, dtype=options.dtype,
                             engine=options.engine, calibration=result.profile_note or "", arms=tuple(arms),
                             verdict=result.verdict)


def write_predictions(path: Path, predictions: SearchPredictions) -> Path:
    return write_json_file(path, predictions.to_dict())


def read_predictions(path: str | Path) -> SearchPredictions:
    """A search's predictions file, or one line saying why `path` is not one."""
    try:
        return SearchPredictions.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise option_error("predictions", f"{path}: no such file (a search writes "
                                          f"runs/<study>/{FILE_NAME})") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise option_error("predictions", f"{path}: not a search's predictions ({type(exc).__name__}: "
                                          f"{exc})") from None
