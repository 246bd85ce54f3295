"""Drafters: pruning plans, the one drafter builder (cut, reduced head, int8), healing by distillation, and
training to a token budget on self-distilled data.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "PruningPlan": "records",
    "load_plan": "records",
    "HealOptions": "heal.heal_records",
    "HealResult": "heal.heal_records",
    "BuiltDrafter": "records",
    "build_drafter": "build",
    "make_distill_data": "training.distill_data",
    "train_from_request": "training.train",
    "load_trained": "training.trained",
    "DistillDataRequest": "training.distill_records",
    "DistillTrainRequest": "training.distill_records",
    "DistillCurveRequest": "training.distill_records",
    "DistillExportRequest": "training.distill_records",
    "curves_from_request": "training.curve_fit",
}
__all__ = [
    "BuiltDrafter",
    "DistillCurveRequest",
    "DistillDataRequest",
    "DistillExportRequest",
    "DistillTrainRequest",
    "HealOptions",
    "HealResult",
    "PruningPlan",
    "build_drafter",
    "curves_from_request",
    "load_plan",
    "load_trained",
    "make_distill_data",
    "train_from_request",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.drafter.build import build_drafter
    from draftnas.drafter.heal.heal_records import HealOptions, HealResult
    from draftnas.drafter.records import BuiltDrafter, PruningPlan, load_plan
    from draftnas.drafter.training.curve_fit import curves_from_request
    from draftnas.drafter.training.distill_data import make_distill_data
    from draftnas.drafter.training.distill_records import (
        DistillCurveRequest,
        DistillDataRequest,
        DistillExportRequest,
        DistillTrainRequest,
    )
    from draftnas.drafter.training.train import train_from_request
    from draftnas.drafter.training.trained import load_trained
