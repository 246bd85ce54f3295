"""Command-line interface: thin typer commands over the library.

Each command module registers itself on `app`; `main` maps `DraftnasError` to one
red line and exit code 2 (the traceback only with --debug).
"""

from __future__ import annotations

import importlib
import sys

from draftnas.cli.app import app, err_console
from draftnas.core.errors import DraftnasError
from draftnas.core.options import OptionError

# Registration order is the order of `draftnas --help`: the pipeline's order.
_COMMAND_MODULES = ("cmd_basic", "cmd_engines", "cmd_profile", "cmd_trace", "cmd_search", "cmd_report",
                    "cmd_heal", "cmd_export", "cmd_lookup", "cmd_bench", "cmd_verdict", "cmd_e2e",
                    "cmd_alpha", "cmd_distill")
for _module in _COMMAND_MODULES:
    importlib.import_module(f"draftnas.cli.{_module}")


def main() -> None:
    debug = "--debug" in sys.argv
    try:
        app(prog_name="draftnas")
    except DraftnasError as exc:
        if debug:
            raise
        text = exc.for_flags() if isinstance(exc, OptionError) else str(exc)
        err_console.print(f"[bold red]error:[/bold red] {text}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        sys.exit(130)


__all__ = ["app", "main"]
