"""`draftnas heal`: distill a pruned drafter toward its target and report acceptance before/after."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from draftnas.cli.app import app, console, fmt_params, print_json
from draftnas.cli.flags import options_command
from draftnas.cli.progress import progress_bars
from draftnas.drafter.records import HealOptions

if TYPE_CHECKING:
    from draftnas.drafter.records import HealResult


@app.command()
@options_command(HealOptions)
def heal(
    options: HealOptions,
    plan: Path | None = typer.Option(None, "--plan", help="Pruning plan JSON (or a draftnas.json)."),
    base: str | None = typer.Option(None, "--base", help="Base model the plan prunes (default: the plan's)."),
    drafter: Path | None = typer.Option(None, "--drafter", help="An exported drafter folder (not --plan)."),
    target: str | None = typer.Option(None, "--target", help="Live teacher (default: the base)."),
    traces: Path | None = typer.Option(None, "--traces",
                                       help="Distill toward these traces' top-k (no target forward)."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint",
                                           help="Folder for resumable state (rerun to resume)."),
    out: Path | None = typer.Option(None, "--out", help="Export the healed drafter to this folder."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out folder."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Heal a pruned drafter by distillation toward its target (top-1 agreement before/after)."""
    from draftnas.export.heal import heal_from_request
    from draftnas.export.records import HealRequest

    options.validate()
    request = HealRequest(plan_file=str(plan) if plan else None, base=base,
                          drafter=str(drafter) if drafter else None, target=target,
                          traces=str(traces) if traces else None, options=options,
                          checkpoint_dir=str(checkpoint) if checkpoint else None,
                          out_dir=str(out) if out else None, force=force)
    with progress_bars(json_out) as on:
        result = heal_from_request(request, progress=on("healing"),
                                   data_progress=on("target continuations"))
    if json_out:
        print_json(result.to_dict())
        return
    render_heal(result)
    if out:
        console.print(f"healed drafter exported to [bold]{out}[/bold]")


def render_heal(result: HealResult) -> None:
    table = Table(title=f"Healing ({result.teacher} teacher, {result.steps} steps, "
                        f"{result.train_s / 60:.1f} min)", header_style="bold")
    for col in ("step", "minutes", "loss", "top-1 agreement", f"tokens/step (g={result.gamma})"):
        table.add_column(col, justify="right")
    for r in result.readings:
        table.add_row(str(r.step), f"{r.train_s / 60:.2f}", "-" if r.loss is None else f"{r.loss:.3f}",
                      f"{r.top1_agreement:.3f}", f"{r.tokens_per_step:.3f}")
    console.print(table)
    console.print(f"top-1 {result.top1_before:.3f} -> {result.top1_after:.3f} "
                  f"({result.top1_rise_per_minute:+.3f} per minute of training); held out: "
                  f"{result.n_heldout_sequences} sequences, {result.n_heldout_positions} positions; "
                  f"trained {fmt_params(result.trainable_parameters)} parameters"
                  + (f"; resumed at step {result.resumed_from_step}" if result.resumed_from_step else ""))
