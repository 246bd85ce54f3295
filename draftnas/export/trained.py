"""A trained drafter (`draftnas distill train`) written as a loadable Hugging Face folder: its plan
replayed on the base, its delta put on (checked by hash), then the same folder format every export has
(a reduced head kept as a reduced head), so `draftnas bench` and the GGUF export take it as they take any.
A trained head (`draftnas distill head`) is written as its folder (what vLLM serves as eagle3) with, when
asked, the eagle3 GGUF llama.cpp's draft-eagle3 loads beside it (`export.head_gguf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftnas.drafter.head.records import HeadTrainResult
from draftnas.drafter.training.curve_fit import read_curve_run, read_train_result
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
    run = read_curve_run(request.run)
    if isinstance(run, HeadTrainResult):
        return export_head_run(run, request)
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


def export_head_run(result: HeadTrainResult, request: DistillExportRequest) -> tuple[Path, Path | None]:
    """The head of a `distill head` run written to `request.out` (its folder as trained), and its eagle3
    GGUF there when `request.gguf` names a type; every check (the type, the head against the target's GGUF)
    before anything is written, and the folder written whole or not at all."""
    import shutil

    from draftnas.core.options import option_error
    from draftnas.core.records import write_folder_atomically
    from draftnas.drafter.head.folder import read_shape
    from draftnas.export.head_gguf import fit_problems, head_gguf_name, write_head_gguf
    from draftnas.models.ggml_quants import WRITTEN
    from draftnas.models.gguf_file import gguf_of, read_info

    source = Path(result.head)
    if not source.is_dir():
        source = Path(request.run) / source.name
    shape = read_shape(source)
    quant, target_file = None, None
    if request.gguf is not None:
        quant = check_quant(request.gguf, "gguf")
        if quant not in WRITTEN:
            raise option_error("gguf", f"{quant}: not a type a head's GGUF is written in (allowed: "
                                       f"{', '.join(WRITTEN)})")
        target_file = gguf_of(result.target)
        problems = fit_problems(shape, read_info(target_file))
        if problems:
            raise option_error("gguf", f"asks for a file llama.cpp cannot run beside {target_file.name}: "
                                       + "; ".join(problems))
    name = head_gguf_name(request.out, quant or "F16")

    def write(tmp: Path) -> None:
        for item in source.iterdir():
            if item.is_file() and item.suffix != ".gguf":
                shutil.copy2(item, tmp / item.name)
        if quant is not None and target_file is not None:
            write_head_gguf(tmp, target_file, tmp / name, quant)

    folder = write_folder_atomically(request.out, write)
    return folder, (folder / name if quant is not None else None)
