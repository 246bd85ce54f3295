"""`draftnas e2e`: profile -> traces -> search -> export + baselines -> bench, one results table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from draftnas.cli.app import app, console, err_console, fmt_params, print_json

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.e2e import E2EResult


def results_table(result: E2EResult) -> Table:
    b = result.options.budget
    m = result.machine
    table = Table(title=f"draftnas e2e on {result.options.target}: measured vs predicted (greedy, batch 1, "
                        f"{m.cpu_model}, load {m.load_average_before})", header_style="bold",
                  title_justify="left")
    for col in ("drafter", "role", "layers x width", "params", "draft ms pred/meas", "tok/step meas (est)",
                "γ", "tok/s", "speedup", "pred tok/s", "pred speedup", "error"):
        table.add_column(col, justify="left" if col in ("drafter", "role", "layers x width") else "right")
    table.add_row("target alone", "target", "-", "-", "-", "1", "0", f"{result.target_tokens_per_s:.1f}",
                  "1.000x", f"{result.target_predicted_tokens_per_s:.1f}", "1.000x", "-")
    for r in result.rows:
        for g in sorted(r.measured, key=int):
            meas, pred = r.measured[g], r.predicted[g]
            tag = "" if int(g) == b.fixed_gamma else " best"
            err = 100.0 * (pred.speedup - meas.speedup) / meas.speedup
            table.add_row(r.name + (f" (={r.same_as})" if r.same_as else ""), r.role, r.shape,
                          fmt_params(r.parameters),
                          f"{pred.draft_ms:.1f}/{r.terms.draft_ms:.1f}" if r.terms else "-",
                          f"{meas.tokens_per_step:.2f} ({pred.tokens_per_step:.2f})", f"{g}{tag}",
                          f"{meas.tokens_per_s:.1f}", f"{meas.speedup:.3f}x", f"{pred.tokens_per_s:.1f}",
                          f"{pred.speedup:.3f}x", f"{err:+.1f}%")
    return table


@app.command()
def e2e(
    target: str = typer.Option("smollm2-135m", "--target", "-t", help="Target (and base) with weights."),
    out: str = typer.Option("runs/e2e", "--out", help="Run folder (re-running resumes from it)."),
    budget: str = typer.Option("quick", "--budget", help="quick (minutes, proves the machinery) | full "
                               "(the README figures)."),
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
    json_out: bool = typer.Option(False, "--json",
                                  help="Print the result as JSON on stdout (progress stays on stderr)."),
    out_json: Path | None = typer.Option(None, "--out-json",
                                         help="Also write the result as JSON to this file."),
) -> None:
    """Run the whole pipeline, then bench the winner against first-k, deep-narrow, even and the target."""
    from draftnas.e2e import E2EOptions, budget_preset, run_e2e

    overrides: dict[str, Any] = {} if repeats is None else {"repeats": repeats}
    options = E2EOptions(target=target, out_dir=out, budget=budget_preset(budget, **overrides), seed=seed,
                         profile=profile, space=space, threads=threads,
                         tuned_domain=None if tuned_domain.lower() == "none" else tuned_domain)
    quiet = json_out
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, disable=quiet) as bar:
        tasks: dict[str, Any] = {}

        def on(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        result = run_e2e(options, progress=on)
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
