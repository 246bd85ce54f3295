"""`draftnas trace`: run the target once over a prompt set and cache its tokens and top-k probabilities."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from draftnas.cli.app import app, console, err_console, print_json
from draftnas.core.errors import InvalidInputError


def parse_temperatures(text: str) -> tuple[float, ...]:
    """'0,0.7' -> (0.0, 0.7); one-line error naming the bad item."""
    values = []
    for item in (t.strip() for t in text.split(",")):
        try:
            values.append(float(item))
        except ValueError:
            raise InvalidInputError(f"--temperature: {item!r} is not a number (e.g. 0,0.7)") from None
    return tuple(values)


@app.command()
def trace(
    target: str = typer.Option(..., "--target", "-t", help="Target model: embedded name, folder or .gguf."),
    prompts: str = typer.Option("all", "--prompts", "-p",
                                help="Prompt set (chat, translation, translation-de, code, math, all; "
                                     "comma-separated) or a JSONL file."),
    out: Path = typer.Option(..., "--out", "-o", help="Output .safetensors file."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", help="Tokens generated per prompt."),
    temperature: str = typer.Option("0", "--temperature", help="Comma-separated temperatures; 0 = greedy."),
    top_k: int = typer.Option(20, "--top-k", help="Target probabilities kept per position."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampled (temperature > 0) traces."),
    per_domain: int | None = typer.Option(None, "--per-domain", help="At most this many prompts per domain."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts decoded together (left padded)."),
    json_out: bool = typer.Option(False, "--json", help="Print the trace metadata as JSON."),
) -> None:
    """Run the target over a prompt set and store its continuations + top-k probabilities (resumable)."""
    from draftnas.acceptance.records import TraceOptions
    from draftnas.acceptance.traces import load_traces
    from draftnas.acceptance.tracing import build_traces
    from draftnas.core.prompts import load_prompts

    prompt_list = load_prompts(prompts, per_domain=per_domain)
    options = TraceOptions(max_new_tokens=max_new_tokens, temperatures=parse_temperatures(temperature),
                           top_k=top_k, seed=seed, batch_size=batch_size)
    options.validate()
    with Progress(TextColumn("[bold]tracing[/bold]"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=json_out) as bar:
        task = bar.add_task("trace", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        path = build_traces(target, prompt_list, options, out, prompt_set=prompts, progress=progress)
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
