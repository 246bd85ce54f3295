"""Command-line interface: thin typer commands over the library.

Each command module registers itself on `app`; `main` maps `DraftnasError` to one
red line and exit code 2 (the traceback only with --debug).
"""

from __future__ import annotations

import sys

from draftnas.cli import cmd_basic  # noqa: F401  (registers commands)
from draftnas.cli import cmd_trace  # noqa: F401
from draftnas.cli import cmd_bench  # noqa: F401
from draftnas.cli import cmd_heal  # noqa: F401
from draftnas.cli import cmd_export  # noqa: F401
from draftnas.cli import cmd_search  # noqa: F401
from draftnas.cli import cmd_report  # noqa: F401
from draftnas.cli import cmd_profile  # noqa: F401
from draftnas.cli import cmd_e2e  # noqa: F401
from draftnas.cli.app import app, err_console
from draftnas.errors import DraftnasError


def main() -> None:
    debug = "--debug" in sys.argv
    try:
        app(prog_name="draftnas")
    except DraftnasError as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        sys.exit(130)


__all__ = ["app", "main"]
