"""The exported folder's format, written and read in one place.

The folder holds `config.json` (written by transformers from the model, whose config
`apply_plan` set from the tensor shapes), `model.safetensors` (in the dtype the drafter runs in),
the tokenizer files, `generation_config.json` (assisted-generation settings for the drafter), a
model card `README.md` and `draftnas.json` (candidate, plan, profile, estimates, seed, versions). A
reduced draft head is saved as `models.hf_head`'s class (its copy shipped as
`modeling_draftnas_head.py`) with `draft_vocab.json`, and, when asked for, a plain full-head variant
beside it.

It is written into a temporary folder next to the destination and renamed into place at the
end, so a crash never leaves a half-written drafter; a non-empty destination is refused unless
`force`. `load_drafter` reads any drafter folder back, the reduced head included.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from draftnas.core.errors import ExportError
from draftnas.core.options import option_error
from draftnas.core.provenance import package_versions
from draftnas.core.records import write_folder_atomically
from draftnas.core.registry import Architecture
from draftnas.drafter.loading import EARLIER_HEAD_COPIES, load_drafter, reduced_head_class_of  # noqa: F401
from draftnas.drafter.vocab import expand_head, kept_ids, model_subset
from draftnas.export.card import model_card
from draftnas.export.records import SCHEMA_VERSION, ExportInfo, drafter_name
from draftnas.models import hf_head
from draftnas.models.records import FULL_HEAD_DIR, HEAD_MODULE, HEAD_MODULE_FILE

log = logging.getLogger(__name__)


def check_destination(out_dir: str | Path, force: bool) -> Path:
    """The destination, refused (ExportError) when it is a file or a non-empty folder without force."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise option_error("out_dir", f"{out} exists and is not a folder; choose another", flag="--out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise option_error("out_dir", f"{out} is not empty; set {{force}} to replace it, or choose another",
                           flag="--out")
    return out


def export_drafter(model: Any, tokenizer: Any, out_dir: str | Path, info: ExportInfo,
                   force: bool = False, full_head: bool = False) -> Path:
    """Write `model` + `tokenizer` as a loadable HF folder at `out_dir` (atomically). Returns it.
    `full_head`: a reduced-head drafter also gets a plain full-vocabulary copy in `full-head/` (for
    engines that run no remote code; it is as large as the base)."""
    out = write_folder_atomically(check_destination(out_dir, force),
                                  lambda tmp: _write_folder(model, tokenizer, tmp, info, full_head))
    log.info("exported drafter to %s", out)
    return out


def _write_folder(model: Any, tokenizer: Any, folder: Path, info: ExportInfo,
                  full_head: bool = False) -> None:
    # what a plain load reads: a quantized drafter loaded plainly runs dense, so its own dense settings
    _set_generation_config(model, *((info.plain_gamma, info.plain_p_min) if info.plain_gamma
                                    else (info.gamma, info.p_min)))
    subset = model_subset(model)
    full_parameters = None
    if subset is not None:  # the reduced head as it is, and (asked for) a plain full-head variant beside it
        _save_reduced_head(model, subset, folder)
        if full_head:
            full_parameters = _save_full_head(model, subset, tokenizer, folder / FULL_HEAD_DIR)
        subset.save(folder)
    else:
        model.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    arch = Architecture.from_hf_config(model.config, name=drafter_name(info))
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    meta = {
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": int(time.time()),
        "architecture": arch.to_dict(),
        "parameters": parameters,
        **info.to_dict(),
        "versions": package_versions(("draftnas", "torch", "transformers", "optuna", "safetensors")),
    }
    if full_parameters is not None:
        meta["full_head_parameters"] = full_parameters
    (folder / "draftnas.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    (folder / "README.md").write_text(model_card(info, arch.to_dict(), parameters, subset, full_parameters))


def reduced_head_class(model_or_config: Any) -> Any:
    """The draftnas.models.hf_head class for a LLaMA, Qwen2 or Gemma-3 drafter (by its transformers class
    or config); an ExportError for other families."""
    config = getattr(model_or_config, "config", model_or_config)
    base = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "gemma3_text": "Gemma3ForCausalLM"}.get(config.model_type)
    if base is None:
        raise ExportError(f"a reduced draft head is exported for LLaMA, Qwen2 and Gemma-3 drafters, "
                          f"not {config.model_type!r}")
    return getattr(hf_head, hf_head.CLASS_BY_BASE[base])


def _save_reduced_head(model: Any, subset: Any, folder: Path) -> None:
    """`model` (head already reduced) as a draftnas.models.hf_head class: N-row head, the kept ids as the
    `draft_vocab_ids` buffer, `auto_map` naming the shipped copy of draftnas/models/hf_head.py."""

    cls = reduced_head_class(model)
    config = copy.deepcopy(model.config)
    config.draft_vocab_size = subset.size
    config.tie_word_embeddings = False
    config.auto_map = {"AutoModelForCausalLM": f"{HEAD_MODULE}.{cls.__name__}"}
    weight = model.get_output_embeddings().weight
    with torch.device("meta"):
        reduced = cls(config)
    state = {**model.state_dict(), "draft_vocab_ids": kept_ids(subset).to(weight.device)}
    reduced.load_state_dict(state, strict=True, assign=True)
    reduced.generation_config = model.generation_config
    reduced.save_pretrained(folder, safe_serialization=True)
    shutil.copyfile(hf_head.__file__, folder / HEAD_MODULE_FILE)


def _save_full_head(model: Any, subset: Any, tokenizer: Any, folder: Path) -> int:
    """A plain transformers folder with the head expanded to the whole vocabulary (kept rows from
    the reduced head, the others from the input embedding); returns its parameter count."""

    reduced = model.get_output_embeddings()
    expand_head(model, subset)
    try:
        model.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    finally:
        model.set_output_embeddings(reduced)


def _set_generation_config(model: Any, gamma: int, p_min: float = 0.0) -> None:
    """Assisted-generation settings read from the drafter's generation_config by transformers:
    a constant `gamma` draft tokens per step and the search's confidence stop (`p_min`; 0: none), which
    is what the search's estimates assume (transformers stops on the same rule; where scikit-learn is
    installed it also moves the threshold as it goes)."""
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    gen.num_assistant_tokens = int(gamma)
    gen.num_assistant_tokens_schedule = "constant"
    gen.assistant_confidence_threshold = float(p_min)


def exported_record(folder: str | Path) -> dict[str, Any] | None:
    """A draftnas folder's `draftnas.json` (None when the folder holds none or it is unreadable)."""
    path = Path(folder) / "draftnas.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
