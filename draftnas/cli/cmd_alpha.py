"""`draftnas alpha`: measure (drafter -> acceptance) pairs on an embedded family, and fit a model of them."""

from __future__ import annotations

import typer
from rich.table import Table

from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.search.explain import alpha_next_command
from draftnas.search.requests import AlphaFitRequest, AlphaMeasureRequest

alpha_app = typer.Typer(
    help="Acceptance as a function of the drafter: measure pairs on an embedded family, fit a model "
         "that `draftnas search --acceptance-prior MODEL.json` uses where the target's weights are absent.",
    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(alpha_app, name="alpha")


@alpha_app.command("measure")
@options_command(request=AlphaMeasureRequest, output=Output)
def measure(request: AlphaMeasureRequest, output: Output) -> None:
    """Cut a designed set of drafters from BASE, heal each (none, and the space's budget) and measure
    its acceptance per domain on held-out traces of BASE (seconds per unhealed drafter on a 2-core CPU,
    minutes per healed one)."""
    from draftnas.search.pairs import pairs_from_request

    with progress_bars(output.json) as on:
        result = pairs_from_request(request, progress=on("drafters"), trace_progress=on("tracing"))
    if emit_json(output, [p.to_dict() for p in result]):
        return
    out = request.out
    domains = sorted({d for p in result for d in p.per_domain})
    table = Table(title=f"{len(result)} pairs in {out}")
    for col in ("drafter", "layers", "heal", "alpha", *domains, "s"):
        table.add_column(col, justify="left" if col in ("drafter", "layers") else "right", no_wrap=True)
    for p in result:
        table.add_row(p.candidate, ",".join(map(str, p.layers)), str(p.heal_steps), f"{p.alpha:.3f}",
                      *(f"{p.per_domain.get(d, float('nan')):.3f}" for d in domains), f"{p.evaluate_s:.0f}")
    console.print(table)
    console.print(alpha_next_command("measure", out))


@alpha_app.command("fit")
@options_command(request=AlphaFitRequest, output=Output)
def fit(request: AlphaFitRequest, output: Output) -> None:
    """Fit logit(alpha) on drafter features (ridge), with its leave-one-out error and, given several
    families, its error on a family left out entirely."""
    from draftnas.search.alpha import FEATURES, fit_from_request

    model = fit_from_request(request)
    if emit_json(output, model.to_dict()):
        return
    out = request.out
    console.print(f"acceptance model written to {out}: {model.label()}")
    h = model.heldout
    console.print(f"held-out ({h.method}, {h.n} pairs): mean abs error {h.mean_abs_error:.3f}, "
                  f"max {h.max_abs_error:.3f}")
    for fam, err in h.by_family_left_out.items():
        console.print(f"  fitted without {fam}, on {fam}: mean abs error {err:.3f}")
    table = Table(title="weights on standardized features (logit alpha, all domains)")
    table.add_column("feature")
    table.add_column("weight", justify="right")
    table.add_column("fitted range", justify="right")
    w = model.weights["all"]
    table.add_row("intercept", f"{w[0]:+.3f}", "")
    for name, weight in zip(FEATURES, w[1:], strict=True):
        lo, hi = model.ranges[name]
        table.add_row(name, f"{weight:+.3f}", f"{lo:.3g}..{hi:.3g}")
    console.print(table)
    console.print(alpha_next_command("fit", out))
