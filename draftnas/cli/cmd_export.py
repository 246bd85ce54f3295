"""`draftnas export`: a search trial or a plan file as a Hugging Face drafter folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from draftnas.cli.app import app, console, fmt_params, print_json
from draftnas.cli.cmd_heal import render_heal
from draftnas.cli.progress import progress_bars

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.export.records import ExportResult


@app.command()
def export(
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write (refused when not empty)."),
    study: str | None = typer.Option(None, "--study", help="Optuna study name (with --storage)."),
    storage: str | None = typer.Option(
        None, "--storage",
        help="Optuna storage: sqlite:///F, postgresql://..., journal:F (default: runs/<study>/study.db)."),
    trial: int | None = typer.Option(None, "--trial", help="Trial number (default: the best)."),
    plan: Path | None = typer.Option(None, "--plan", help="Pruning plan JSON instead of a study."),
    base: str | None = typer.Option(None, "--base", help="Base model (default: the plan's)."),
    target: str | None = typer.Option(None, "--target", help="Target it drafts for (default: the base)."),
    traces: Path | None = typer.Option(
        None, "--traces",
        help=("Traces to heal toward (no target needed); also where a reduced-vocabulary "
              "trial's draft vocabulary comes from (default: the study folder's traces).")),
    heal_steps: int | None = typer.Option(
        None, "--heal-steps",
        help="Distillation steps toward the target before export; 0 exports the pruned weights unhealed. "
             "Default: 400 (toward the target's top-64, on the workload's prompts and 128 more the target "
             "writes itself), or 0 when the study's search space heals none (the shipped Gemma-3 space). "
             "If healing lowers held-out top-1 agreement, the unhealed weights are exported."),
    gamma: int | None = typer.Option(None, "--gamma",
                                     help="Draft tokens per step for generation_config, 1-32 "
                                          "(default: the best for the drafter as exported when the study "
                                          "measured acceptance, else the searched best, else 4)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out folder."),
    full_head: bool = typer.Option(
        False, "--full-head",
        help="A reduced-head drafter also gets a plain full-vocabulary copy in full-head/ (loads with no "
             "remote code, e.g. as a serving engine's draft model; as large as the base)."),
    fmt: str = typer.Option(
        "hf", "--format",
        help="hf: the Hugging Face folder alone. gguf: also OUT/<name>-<quant>.gguf, a file llama.cpp loads "
             "as the target's drafter (the target's tokenizer, full vocabulary; a trial searched with "
             "--engine llama.cpp gets one in its searched type without asking)."),
    quant: str | None = typer.Option(
        None, "--quant",
        help="The GGUF's ggml type with --format gguf: Q8_0, Q4_0, F16, BF16 or F32 are written directly; "
             "other llama.cpp types (Q4_K_M, Q6_K, ...) through llama-quantize from a llama.cpp build. "
             "Default: the type the trial was searched in, else Q8_0."),
    llama_cpp: str | None = typer.Option(
        None, "--llama-cpp", help="The llama.cpp build for llama-quantize (default: the one "
                                  "`draftnas engines --build` made)."),
    push_to_hub: str | None = typer.Option(None, "--push-to-hub", help="Upload to this hub repo (online)."),
    seed: int = typer.Option(0, "--seed"),
    device: str | None = typer.Option(None, "--device", help="cpu | cuda: where healing trains (default: "
                                      "the study's device, else cpu). The folder is written from the host."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Export a drafter (from a study trial or a plan) as a Hugging Face folder, and as a GGUF for
    llama.cpp with --format gguf."""
    from draftnas.core.errors import InvalidInputError
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request

    if fmt not in ("hf", "gguf"):
        raise InvalidInputError(f"--format {fmt!r} is not known (allowed: hf, gguf)")
    if quant is not None and fmt != "gguf":
        raise InvalidInputError("--quant is the GGUF's type: pass --format gguf with it")
    gguf = (quant or "default") if fmt == "gguf" else None
    if quant is not None:
        from draftnas.models.llama_cpp import check_quant

        gguf = check_quant(quant)  # before any work

    request = ExportRequest(out_dir=str(out), study=study, storage=storage, trial=trial,
                            plan_file=str(plan) if plan else None, base=base, target=target,
                            traces=str(traces) if traces else None, heal_steps=heal_steps, gamma=gamma,
                            force=force, push_to_hub=push_to_hub, seed=seed, device=device,
                            full_head=full_head, gguf=gguf, llama_cpp=llama_cpp)
    with progress_bars(json_out) as on:
        result = export_from_request(request, progress=on("healing"),
                                     data_progress=on("target continuations"))
    if json_out:
        print_json(result.to_dict())
        return
    render_export(result)


def render_export(result: ExportResult) -> None:
    """What an export did: healing, where the folder is, its gamma, and its prediction as exported."""
    from draftnas.export.card import rescored_lines

    if result.heal is not None:
        render_heal(result.heal)
    console.print(f"exported [bold]{result.name}[/bold] ({fmt_params(result.parameters)} parameters, "
                  f"from {result.source}) to [bold]{result.out_dir}[/bold], gamma {result.gamma}")
    if result.prediction is not None and result.acceptance is not None:
        for line in rescored_lines(result.prediction, result.acceptance, result.searched_tokens_per_step):
            console.print(line, highlight=False, soft_wrap=True)
    if result.gguf:
        console.print(f"GGUF for llama.cpp: [bold]{result.gguf}[/bold]")
    if result.hub_url:
        console.print(f"pushed to {result.hub_url}")
