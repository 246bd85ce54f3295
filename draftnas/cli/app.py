"""The typer app, shared console and rendering helpers. No arithmetic here."""

from __future__ import annotations

import logging
import os
import sys

import typer
from rich.console import Console

app = typer.Typer(
    name="draftnas",
    help=(
        "Find the fastest speculative-decoding draft model for a target LLM on your hardware.\n\n"
        "Latency dominates: a drafter's depth, not its acceptance rate, decides most of the "
        "speedup (Yan et al., NAACL 2025)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain click help: this typer's rich panels print every flag as "--quick <bool>" and read
    # "[default: …]" in a help text as markup (leaving "Trial number .")
    rich_markup_mode=None,
)
# Piped output (CI logs, `| less`) gets a wide table instead of rich's 80 columns.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show info logs."),
) -> None:
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def fmt_params(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
