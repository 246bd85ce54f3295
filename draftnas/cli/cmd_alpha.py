"""`draftnas alpha`: measure (drafter -> acceptance) pairs on an embedded family, and fit a model of them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from draftnas.cli.app import app, console, parse_ints, print_json
from draftnas.cli.progress import progress_bars
from draftnas.core.errors import InvalidInputError

alpha_app = typer.Typer(
    help="Acceptance as a function of the drafter: measure pairs on an embedded family, fit a model "
         "that `draftnas search --acceptance-prior MODEL.json` uses where the target's weights are absent.",
    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(alpha_app, name="alpha")


@alpha_app.command("measure")
def measure(
    base: str = typer.Option(..., "--base", help="Embedded model (or folder) to cut drafters from; it is "
                                                  "also their target."),
    out: Path = typer.Option(..., "--out", "-o", help="JSONL file of pairs (appended; a re-run resumes)."),
    pairs: int = typer.Option(24, "--pairs", help="Drafters to measure, spread over the space's depths."),
    space: str | None = typer.Option(None, "--space", help="Search space whose knobs and heal budget "
                                                            "are sampled (default: the base's shipped one)."),
    heal_steps: str | None = typer.Option(None, "--heal-steps",
                                          help="Comma-separated heal budgets sampled (default: 0 and the "
                                               "space's), e.g. 0,30,150."),
    per_domain: int = typer.Option(9, "--per-domain", help="Prompts per domain traced (a third held out)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the design and of healing."),
    json_out: bool = typer.Option(False, "--json", help="Print the pairs as JSON on stdout."),
) -> None:
    """Cut a designed set of drafters from BASE, heal each (none, and the space's budget) and measure
    its acceptance per domain on held-out traces of BASE (seconds per unhealed drafter on a 2-core CPU,
    minutes per healed one)."""
    from draftnas.search.pairs import measure_pairs
    from draftnas.search.space_file import load_search_space

    budgets = None if heal_steps is None else parse_ints("--heal-steps", heal_steps, "0,30,150")
    with progress_bars(json_out) as on:
        result = measure_pairs(base, out, n=pairs, seed=seed, per_domain=per_domain,
                               space=load_search_space(space) if space else None,
                               heal_steps=budgets,
                               progress=on("drafters"), trace_progress=on("tracing"))
    if json_out:
        print_json([p.to_dict() for p in result])
        return
    domains = sorted({d for p in result for d in p.per_domain})
    table = Table(title=f"{len(result)} pairs in {out}")
    for col in ("drafter", "layers", "heal", "alpha", *domains, "s"):
        table.add_column(col, justify="left" if col in ("drafter", "layers") else "right", no_wrap=True)
    for p in result:
        table.add_row(p.candidate, ",".join(map(str, p.layers)), str(p.heal_steps), f"{p.alpha:.3f}",
                      *(f"{p.per_domain.get(d, float('nan')):.3f}" for d in domains), f"{p.evaluate_s:.0f}")
    console.print(table)
    console.print(f"next: draftnas alpha fit {out} --out alpha-model.json")


@alpha_app.command("fit")
def fit(
    pairs: list[Path] = typer.Argument(..., help="Pair files from `draftnas alpha measure`."),
    out: Path = typer.Option(..., "--out", "-o", help="Model file to write (JSON)."),
    ridge: float = typer.Option(1.0, "--ridge", help="L2 penalty on the standardized weights."),
    json_out: bool = typer.Option(False, "--json", help="Print the model as JSON on stdout."),
) -> None:
    """Fit logit(alpha) on drafter features (ridge), with its leave-one-out error and, given several
    families, its error on a family left out entirely."""
    from draftnas.search.alpha import FEATURES, fit_alpha_model, read_pairs, save_alpha_model

    rows = [p for path in pairs for p in read_pairs(path)]
    if out.exists() and not out.is_file():
        raise InvalidInputError(f"--out {out} is not a file")
    model = fit_alpha_model(rows, ridge=ridge, sources=[path.name for path in pairs])
    save_alpha_model(model, out)
    if json_out:
        print_json(model.to_dict())
        return
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
    console.print(f"next: draftnas search --target llama-65b --acceptance-prior {out}")
