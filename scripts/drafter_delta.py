"""Pack an exported drafter as its plan + the tensors healing changed; unpack it onto the base.

A machine that reaches no registry and takes files in small transfers (a lent GPU box)
gets the base model's GGUF once and, per drafter, only what differs from
`apply_plan(base, plan)`: the healed layers, norms and a reduced head. Unpacking
rebuilds the same drafter folder (weights equal to the exported ones, checked).

    python scripts/drafter_delta.py pack DRAFTER_FOLDER BASE OUT_DIR
    python scripts/drafter_delta.py unpack PACKED_DIR BASE OUT_FOLDER
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftnas.drafter.prune.surgery import apply_plan
from draftnas.drafter.records import VOCAB_FILE, PruningPlan, load_vocab_subset
from draftnas.models.sources import load_model


def _plan(folder: Path) -> PruningPlan:
    return PruningPlan.from_data(json.loads((folder / "draftnas.json").read_text())["plan"])


def pack(drafter: Path, base: str, out: Path) -> None:
    rebuilt = apply_plan(load_model(base).model, _plan(drafter)).state_dict()
    exported = load_file(str(drafter / "model.safetensors"))
    changed = {k: v.contiguous() for k, v in exported.items()
               if k not in rebuilt or rebuilt[k].shape != v.shape or not torch.equal(rebuilt[k], v)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(changed, str(out / "delta.safetensors"))
    for name in ("draftnas.json", "config.json", "generation_config.json", VOCAB_FILE):
        if (drafter / name).is_file():
            shutil.copy(drafter / name, out / name)
    print(f"packed {len(changed)} of {len(exported)} tensors "
          f"({sum(v.numel() * v.element_size() for v in changed.values()) / 1e6:.1f} MB) into {out}")


def unpack(packed: Path, base: str, out: Path) -> None:
    loaded = load_model(base)
    drafter = apply_plan(loaded.model, _plan(packed))
    delta = load_file(str(packed / "delta.safetensors"))
    head = delta.get("lm_head.weight")
    if head is not None and head.shape[0] != drafter.get_output_embeddings().weight.shape[0]:
        drafter.config.tie_word_embeddings = False  # an untied, full-size head stored at export
        drafter.set_output_embeddings(torch.nn.Linear(head.shape[1], head.shape[0], bias=False))
    missing = [k for k in delta if k not in drafter.state_dict()]
    if missing:
        raise SystemExit(f"delta names tensors the rebuilt drafter lacks: {missing[:3]}")
    drafter.load_state_dict({**drafter.state_dict(), **delta})
    drafter.save_pretrained(str(out))
    loaded.tokenizer.save_pretrained(str(out))
    for name in ("draftnas.json", "generation_config.json", VOCAB_FILE):
        if (packed / name).is_file():
            shutil.copy(packed / name, out / name)
    if (out / VOCAB_FILE).is_file():
        load_vocab_subset(out)  # schema check
    print(f"unpacked {len(delta)} tensors onto {base} -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("pack", "unpack"):
        raise SystemExit(__doc__)
    verb, src, base_spec, dest = sys.argv[1:]
    (pack if verb == "pack" else unpack)(Path(src), base_spec, Path(dest))
