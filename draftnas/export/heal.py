"""`draftnas heal`: a drafter (a plan and its base, or a folder) healed toward a teacher, and
optionally exported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from draftnas.core.machine import require_device
from draftnas.core.options import option_error
from draftnas.core.records import Progress
from draftnas.drafter.heal.heal_records import HealReading, HealResult
from draftnas.drafter.records import PruningPlan, load_plan
from draftnas.export.folder import check_destination, export_drafter, load_drafter
from draftnas.export.records import ExportInfo, HealRequest
from draftnas.export.request import teacher_for
from draftnas.models.sources import load_model


def heal_from_request(request: HealRequest, *, progress: Progress | None = None,
                      on_reading: Callable[[HealReading], None] | None = None,
                      data_progress: Progress | None = None) -> HealResult:
    """Build (from a plan) or load (a folder) the drafter, heal it toward the teacher, and with
    `out_dir` export it."""

    request.validate()
    require_device(request.options.device)  # before any model is loaded
    if request.out_dir:
        check_destination(request.out_dir, request.force)
    if request.plan_file is not None:
        from draftnas.drafter.build import build_drafter

        plan_file = load_plan(request.plan_file)
        plan: PruningPlan | None = plan_file
        base = request.base or plan_file.base
        if not base:
            raise option_error("base", "must be given: the plan names no base model")
        loaded = load_model(base)
        target = request.target or base
        built = build_drafter(plan_file, loaded, heal=request.options,
                              teacher=teacher_for(request.traces, target, base, loaded),
                              checkpoint_dir=request.checkpoint_dir, progress=progress,
                              data_progress=data_progress, on_reading=on_reading)
        model, tokenizer, result = built.model, loaded.tokenizer, built.heal
    else:
        from draftnas.drafter.heal.heal import heal

        drafter = str(request.drafter)
        folder = load_drafter(drafter)
        meta_path = Path(drafter) / "draftnas.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        plan = PruningPlan.from_data(meta["plan"]) if meta.get("plan") else None
        base = str(meta.get("base") or drafter)
        target = request.target or str(meta.get("target") or base)
        teacher = teacher_for(request.traces, target, base, None)
        model, tokenizer = folder.model, folder.tokenizer
        result = heal(model, teacher, request.options, tokenizer=tokenizer,
                      checkpoint_dir=request.checkpoint_dir, progress=progress, on_reading=on_reading,
                      data_progress=data_progress)
    assert result is not None
    if request.out_dir:
        info = ExportInfo(base=base, target=target, plan=plan, heal=result, seed=request.options.seed,
                          gamma=request.options.gamma, source="draftnas heal",
                          measured={"top1_agreement_after_healing": result.top1_after})
        export_drafter(model, tokenizer, request.out_dir, info, force=request.force)
    return result
