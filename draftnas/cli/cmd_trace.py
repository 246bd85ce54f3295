"""`draftnas trace`: run the target once over a prompt set and cache its tokens and top-k probabilities."""

from __future__ import annotations

from rich.table import Table

from draftnas.acceptance.records import TraceRequest
from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars


@app.command()
@options_command(request=TraceRequest, output=Output)
def trace(request: TraceRequest, output: Output) -> None:
    """Run the target over a prompt set and store its continuations + top-k probabilities (resumable)."""
    from draftnas.acceptance.traces import load_traces
    from draftnas.acceptance.tracing import trace_from_request

    with progress_bars(output.json) as on:
        path = trace_from_request(request, progress=on("tracing"))
    meta = load_traces(path).metadata
    if emit_json(output, {**meta.to_dict(), "path": str(path), "file_bytes": path.stat().st_size}):
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
