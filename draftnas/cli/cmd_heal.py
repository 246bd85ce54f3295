"""`draftnas heal`: distill a pruned drafter toward its target and report acceptance before/after."""

from __future__ import annotations

from rich.table import Table

from draftnas.cli.app import app, console, fmt_params
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.drafter.heal.heal_records import HealResult
from draftnas.export.records import HealRequest


@app.command()
@options_command(request=HealRequest, output=Output)
def heal(request: HealRequest, output: Output) -> None:
    """Heal a pruned drafter by distillation toward its target (top-1 agreement before/after)."""
    from draftnas.export.heal import heal_from_request

    with progress_bars(output.json) as on:
        result = heal_from_request(request, progress=on("healing"),
                                   data_progress=on("target continuations"))
    if emit_json(output, result.to_dict()):
        return
    render_heal(result)
    if request.out_dir:
        console.print(f"healed drafter exported to [bold]{request.out_dir}[/bold]")


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
