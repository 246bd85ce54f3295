"""A trained drafter kept as data: its plan over the base and the tensors training changed (the delta),
checked by sha256. `load_trained` replays the plan on the base and puts the delta on, so a search or a
bench prices the trained drafter without training it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.provenance import sha256_file
from draftnas.drafter.records import PruningPlan

DELTA_FILE = "delta.safetensors"
PLAN_FILE = "plan.json"


def save_delta(drafter: Any, plan: PruningPlan, names: list[str], folder: Path) -> str:
    """Write the named (trained) tensors of `drafter` (fp32) and its plan into `folder`; returns the
    delta's sha256."""
    from safetensors.torch import save_file

    state = drafter.state_dict()
    tensors = {n: state[n].detach().to(torch.float32).contiguous() for n in names if n in state}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (DELTA_FILE + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(folder / DELTA_FILE)
    plan.save(folder / PLAN_FILE)
    return sha256_file(folder / DELTA_FILE)


def load_trained(folder: str | Path, base_model: Any, sha256: str | None = None) -> tuple[Any, PruningPlan]:
    """(drafter, plan): the plan in `folder` applied to `base_model` (left untouched), then the delta on;
    with `sha256`, a delta whose hash differs is refused."""
    from safetensors.torch import load_file

    from draftnas.drafter.prune.surgery import apply_plan

    root = Path(folder)
    delta_path, plan_path = root / DELTA_FILE, root / PLAN_FILE
    for path in (delta_path, plan_path):
        if not path.is_file():
            raise InvalidInputError(f"{path}: missing (a trained drafter folder holds {DELTA_FILE} and "
                                    f"{PLAN_FILE})")
    if sha256 is not None and sha256_file(delta_path) != sha256:
        raise InvalidInputError(f"{delta_path}: its sha256 differs from the recorded one; retrain it with "
                                "the recorded command")
    try:
        plan = PruningPlan.from_json(plan_path.read_text())
        delta = load_file(str(delta_path))
    except Exception as exc:  # damaged JSON or safetensors raise many kinds
        raise InvalidInputError(f"{root}: not a readable trained drafter ({exc})") from None
    drafter = apply_plan(base_model, plan)
    state = drafter.state_dict()
    unknown = sorted(set(delta) - set(state))
    if unknown:
        names = ", ".join(unknown[:3])
        raise InvalidInputError(f"{delta_path}: tensors {names} are not in the drafter its plan "
                                "makes")
    with torch.no_grad():
        for name, value in delta.items():
            if state[name].shape != value.shape:
                raise InvalidInputError(f"{delta_path}: {name} has shape {tuple(value.shape)}, the drafter "
                                        f"{tuple(state[name].shape)}")
            state[name].copy_(value.to(state[name].dtype))
    drafter.eval()
    return drafter, plan
