"""`draftnas export`: a search trial or a plan file as a Hugging Face drafter folder."""

from __future__ import annotations

from draftnas.cli.app import app, console, fmt_params
from draftnas.cli.cmd_heal import render_heal
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.export.records import ExportRequest, ExportResult


@app.command()
@options_command(request=ExportRequest, output=Output)
def export(request: ExportRequest, output: Output) -> None:
    """Export a drafter (from a study trial or a plan) as a Hugging Face folder, and as a GGUF for
    llama.cpp with --format gguf."""
    from draftnas.export.request import export_from_request

    with progress_bars(output.json) as on:
        result = export_from_request(request, progress=on("healing"),
                                     data_progress=on("target continuations"))
    if not emit_json(output, result.to_dict()):
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
