"""`draftnas engines`: the speculative-decoding engines draftnas can drive here, llama.cpp's build and vLLM's
install."""

from __future__ import annotations

from rich.table import Table

from draftnas.cli.app import app, console, err_console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.models.records import EnginesRequest


@app.command()
@options_command(request=EnginesRequest, output=Output)
def engines(request: EnginesRequest, output: Output) -> None:
    """List the engines draftnas can drive here (draftnas's loops, transformers, llama.cpp, vLLM) with
    versions and devices; --build builds llama.cpp, --install vllm installs vLLM in an environment of its
    own."""
    from draftnas.models.llama_cpp import engines_here

    rows = engines_here(request, say=lambda line: err_console.print(line, highlight=False))
    if emit_json(output, [r.to_dict() for r in rows]):
        return
    table = Table(title="Engines draftnas can drive here", header_style="bold")
    for col in ("engine", "ready", "version", "where"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.engine, "[green]yes[/green]" if r.ready else "[red]no[/red]", r.version, r.where)
    console.print(table)
