"""`draftnas report`: Markdown + PNG plots of a search study, from its storage."""

from __future__ import annotations

import typer

from draftnas.cli.app import app, console, print_json


@app.command()
def report(
    study: str = typer.Option(..., "--study", help="Study name (as printed by draftnas search)."),
    storage: str | None = typer.Option(None, "--storage", help="Storage URL (default: "
                                       "runs/<study>/study.db)."),
    out: str = typer.Option(..., "--out", help="Folder for report.md and the PNG plots."),
    run_dir: str = typer.Option("runs", "--run-dir", help="Folder of studies' outputs."),
    top: int = typer.Option(20, "--top", help="Rows in the ranking."),
    json_out: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a study's ranking, Pareto front, speedup-vs-γ and latency-vs-depth plots."""
    from draftnas.report.study import write_report

    files = write_report(study, storage, out, run_dir=run_dir, top=top)
    if json_out:
        print_json(files.to_dict())
        return
    console.print(f"wrote {files.markdown} ({files.n_ranked} ranked drafters) and "
                  f"{len(files.plots)} plots", highlight=False)
    if files.acceptance_assumed:
        console.print("[yellow]acceptance in this study is ASSUMED, not measured[/yellow]")
