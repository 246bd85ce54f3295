"""`draftnas trace`: run the target once over a prompt set and cache its tokens and top-k probabilities."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from draftnas.acceptance.records import TraceOptions
from draftnas.cli.app import app, console, print_json
from draftnas.cli.flags import options_command
from draftnas.cli.progress import progress_bars


@app.command()
@options_command(TraceOptions)
def trace(
    options: TraceOptions,
    target: str = typer.Option(..., "--target", "-t", help="Target model: embedded name, folder or .gguf."),
    prompts: str = typer.Option("all", "--prompts", "-p",
                                help="Prompt set (chat, translation, translation-de, code, math, all; "
                                     "comma-separated) or a JSONL file."),
    out: Path = typer.Option(..., "--out", "-o", help="Output .safetensors file."),
    per_domain: int | None = typer.Option(None, "--per-domain", help="At most this many prompts per domain."),
    json_out: bool = typer.Option(False, "--json", help="Print the trace metadata as JSON."),
) -> None:
    """Run the target over a prompt set and store its continuations + top-k probabilities (resumable)."""
    from draftnas.acceptance.traces import load_traces
    from draftnas.acceptance.tracing import build_traces
    from draftnas.core.machine import require_device
    from draftnas.core.prompts import load_prompts

    prompt_list = load_prompts(prompts, per_domain=per_domain)
    options.validate()
    require_device(options.device)
    with progress_bars(json_out) as on:
        path = build_traces(target, prompt_list, options, out, prompt_set=prompts, progress=on("tracing"))
    meta = load_traces(path).metadata
    if json_out:
        print_json({**meta.to_dict(), "path": str(path), "file_bytes": path.stat().st_size})
        return
    table = Table(show_header=False, title=f"Traces written to {path}")
    rows = [
        ("target", f"{meta.target} ({meta.model_type}, {meta.num_hidden_layers} layers)"),
        ("prompts", f"{meta.n_prompts} from {meta.prompt_set} (hash {meta.prompt_set_hash[:12]})"),
        ("temperatures", ", ".join(f"{t:g}" for t in meta.temperatures)),
        ("records / tokens", f"{meta.n_records} / {meta.n_tokens}"),
        ("top-k, max new tokens", f"{meta.top_k}, {meta.max_new_tokens}"),
        ("tokenizer fingerprint", meta.tokenizer_fingerprint),
        ("wall time", f"{meta.wall_s:.1f} s ({meta.n_tokens / max(meta.wall_s, 1e-9):.1f} tokens/s)"),
        ("file size", f"{path.stat().st_size / 1e6:.2f} MB"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
