"""`draftnas e2e`: profile -> traces -> search -> export + baselines -> bench, one results table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from draftnas.cli.app import app, console, print_json
from draftnas.cli.progress import progress_bars

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.e2e.records import E2EResult


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
def e2e(
    target: str = typer.Option("smollm2-135m", "--target", "-t", help="Target (and base) with weights."),
    out: str = typer.Option("runs/e2e", "--out", help="Run folder (re-running resumes from it)."),
    budget: str = typer.Option("quick", "--budget", help="smoke (every stage runs here, no figures) | quick "
                               "(minutes, proves the machinery) | full (the README figures)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the search, healing and benches."),
    repeats: int | None = typer.Option(None, "--repeats", help="Bench repeats (median); default: budget's."),
    profile: str | None = typer.Option(None, "--profile", help="Latency profile JSON or shipped name "
                                       "(e.g. cpu); default: measure one into the run folder."),
    space: str | None = typer.Option(None, "--space", help="Search space YAML or shipped name."),
    tuned_domain: str = typer.Option("translation", "--tuned-domain", help="Also heal the winner's plan on "
                                     "this domain's traces alone and bench it, to see whether it accepts "
                                     "more there (chat | translation | code | math | none)."),
    threads: int | None = typer.Option(None, "--threads", help="Torch CPU threads (1 when other jobs load "
                                       "the CPU; recorded with the figures)."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda: where every stage runs (the profile "
                               "is timed as CUDA graphs on a GPU; traces, healing, terms and benches)."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print the result as JSON on stdout (progress stays on stderr)."),
    out_json: Path | None = typer.Option(None, "--out-json",
                                         help="Also write the result as JSON to this file."),
) -> None:
    """Run the whole pipeline, then bench the winner against first-k, deep-narrow, even and the target."""
    from draftnas.e2e.records import E2EOptions, budget_preset
    from draftnas.e2e.run import run_e2e

    overrides: dict[str, Any] = {} if repeats is None else {"repeats": repeats}
    options = E2EOptions(target=target, out_dir=out, budget=budget_preset(budget, **overrides), seed=seed,
                         profile=profile, space=space, threads=threads, device=device,
                         tuned_domain=None if tuned_domain.lower() == "none" else tuned_domain)
    quiet = json_out
    with progress_bars(quiet) as on_stage:
        result = run_e2e(options, progress=lambda stage, done, total: on_stage(stage)(done, total))
    if out_json is not None:
        import json

        out_json.write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    if quiet:
        print_json(result.to_dict())
        return
    console.print(results_table(result))
    for note in result.notes:
        console.print(f"- {note}", highlight=False, soft_wrap=True)
    folder = Path(result.out_dir)
    console.print(f"results: {folder / 'results.md'} and {folder / 'results.json'}", highlight=False)
