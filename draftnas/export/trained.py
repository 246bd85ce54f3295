"""A trained drafter (`draftnas distill train`) written as a loadable Hugging Face folder: its plan
replayed on the base, its delta put on (checked by hash), then the same folder format every export has
(a reduced head kept as a reduced head), so `draftnas bench` and the GGUF export take it as they take any.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftnas.drafter.training.curve_fit import read_train_result
from draftnas.drafter.training.distill_records import DistillExportRequest
from draftnas.export.folder import check_destination, export_drafter
from draftnas.export.records import ExportInfo
from draftnas.models.llama_cpp import check_quant


def zero_expanded_head(model: Any, subset: Any) -> Any:
    """In place: a full-vocabulary head whose kept rows are the trained head's and whose other rows are
    zero (a logit of 0: below any token the head kept and the drafter is sure of), for engines that load
    full heads only."""
    import torch

    from draftnas.drafter.vocab import kept_ids

    head = model.get_output_embeddings()
    full = torch.zeros(subset.vocab_size, head.weight.shape[1], dtype=head.weight.dtype)
    full[kept_ids(subset)] = head.weight.detach()
    new = torch.nn.Linear(full.shape[1], full.shape[0], bias=False, dtype=full.dtype)
    with torch.no_grad():
        new.weight.copy_(full)
    model.set_output_embeddings(new)
    model.config.tie_word_embeddings = False
    model.draft_vocab_subset = None
    return model


def export_trained(request: DistillExportRequest) -> tuple[Path, Path | None]:
    """Write the trained drafter of `request.run` to `request.out` (and its GGUF when asked); returns
    (folder, gguf)."""
    from draftnas.drafter.training.trained import load_trained
    from draftnas.models.sources import load_model

    request.validate()
    if request.gguf is not None:
        check_quant(request.gguf, "gguf")  # a type llama.cpp lacks is said before anything loads
    check_destination(request.out, request.force)
    result = read_train_result(request.run)
    base = load_model(result.base)
    drafter, plan = load_trained(request.run, base.model, result.delta_sha256)
    last = result.readings[-1]
    measured = {"trained_tokens": result.trained_tokens, "kept": result.kept,
                "delta_sha256": result.delta_sha256,
                "heldout_top1": last.top1_agreement, f"heldout_tokens_per_step_gamma{result.gamma}":
                last.tokens_per_step, "untrained_top1": result.readings[0].top1_agreement,
                "command": result.command}
    info = ExportInfo(base=result.base, target=result.target, plan=plan, measured=measured,
                      source=f"draftnas distill train ({result.trained_tokens:,} tokens)",
                      gamma=request.gamma)
    folder = export_drafter(drafter, base.tokenizer, request.out, info, force=request.force)
    if request.gguf is None:
        return folder, None
    from draftnas.export.gguf import export_gguf

    if plan.vocab is not None:
        zero_expanded_head(drafter, plan.vocab)
    quant = check_quant(request.gguf, "gguf")
    return folder, export_gguf(drafter, result.target, folder, plan.label(), quant)
