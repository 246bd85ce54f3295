"""What a search run is given once its request is resolved (`SearchOptions`: shapes, space, profile,
study, how acceptance is read, where drafters run), and the name its study takes by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.placement import Placement
from draftnas.core.registry import Architecture
from draftnas.drafter.training.distill_records import CurveSet
from draftnas.search.records import StudySettings
from draftnas.search.space import SearchSpace


@dataclass(frozen=True)
class SearchOptions:
    """Everything `run_search` needs besides the latency model and the evaluator (resolved)."""

    target: str
    target_arch: Architecture
    base: str
    base_arch: Architecture
    space: SearchSpace
    profile: str
    study: StudySettings = StudySettings()
    acceptance_prior: float | None = None
    upper_bound_pruning: bool = True
    profile_note: str | None = None  # calibration summary, or: the profile is not of this machine
    placement: Placement | None = None  # GPUs, tensor parallelism and memory (GPU profiles with hardware)
    acceptance_model: str | None = None  # label of the alpha(drafter) model the evaluator predicts with
    engine: str | None = None  # the loop engine the calibration timed (None: the profile as it is)
    dtype: str = "fp32"  # the weights' dtype the latency was calibrated and acceptance estimated in
    quant_dtype: str | None = None  # quantized drafters' activation dtype where it is not `dtype`
    references: tuple[str, ...] = ()  # the space's references and --reference: priced beside the trials
    device: str = "cpu"  # where drafters were built, healed and scored (and a calibration timed)
    curves: CurveSet | None = None  # trained shapes' curves (`draftnas distill curve`), priced by the ranking
    train_tokens: int | None = None  # the budget they are priced at (None: each curve's largest measured)

    @property
    def study_name(self) -> str:
        return self.study.study_name or default_study_name(self.target, self.space, self.study.sampler)


def default_study_name(target: str, space: SearchSpace, sampler: str) -> str:
    name = space.name if space.target.lower() == target.lower() else f"{space.name}-for-{target}"
    return f"{name}-nsga2" if sampler == "nsga2" else name
