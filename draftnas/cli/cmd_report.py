"""`draftnas report`: Markdown + PNG plots of a search study, from its storage."""

from __future__ import annotations

from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.report.records import ReportRequest


@app.command()
@options_command(request=ReportRequest, output=Output)
def report(request: ReportRequest, output: Output) -> None:
    """Write a study's ranking, Pareto front, speedup-vs-γ and latency-vs-depth plots."""
    from draftnas.report.study import report_from_request

    files = report_from_request(request)
    if emit_json(output, files.to_dict()):
        return
    console.print(f"wrote {files.markdown} ({files.n_ranked} ranked drafters) and "
                  f"{len(files.plots)} plots", highlight=False)
    if files.acceptance_assumed:
        console.print("[yellow]acceptance in this study is ASSUMED, not measured[/yellow]")
