"""`draftnas e2e`: profile -> traces -> search -> export + baselines -> bench, one results table."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.e2e.records import E2EOptions, E2EResult


def results_table(result: E2EResult) -> Table:
    from draftnas.e2e.render import E2E_COLUMNS, e2e_table

    m = result.machine
    table = Table(title=f"draftnas e2e on {result.options.target}: measured vs predicted (greedy, batch 1, "
                        f"{m.cpu_model}, load {m.load_average_before})", header_style="bold",
                  title_justify="left")
    for col in E2E_COLUMNS:
        table.add_column(col, justify="left" if col in ("drafter", "role", "layers x width") else "right")
    for cells in e2e_table(result):
        table.add_row(*cells)
    return table


@app.command()
@options_command(options=E2EOptions, output=Output)
def e2e(options: E2EOptions, output: Output) -> None:
    """Run the whole pipeline, then bench the winner against first-k, deep-narrow, even and the target."""
    from draftnas.e2e.run import run_e2e

    with progress_bars(output.json) as on_stage:
        result = run_e2e(options, progress=lambda stage, done, total: on_stage(stage)(done, total))
    if emit_json(output, result.to_dict()):
        return
    console.print(results_table(result))
    for note in result.notes:
        console.print(f"- {note}", highlight=False, soft_wrap=True)
    folder = Path(result.out_dir)
    console.print(f"results: {folder / 'results.md'} and {folder / 'results.json'}", highlight=False)
