"""`draftnas targets` and `draftnas predict`: torch-free commands."""

from __future__ import annotations

import typer
from rich.table import Table

from draftnas.cli.app import app, console, fmt_params, print_json


@app.command()
def targets(
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    family: str | None = typer.Option(None, help="Only this family (llama, qwen2, gemma3, opt)."),
) -> None:
    """List the registered architectures (usable as --target / --base for latency work)."""
    from draftnas.core.registry import load_registry
    from draftnas.models.records import EMBEDDED

    archs = [a for a in load_registry().values() if family is None or a.family == family]
    if json_out:
        print_json([{**a.to_dict(), "parameters": a.count_parameters(),
                     "embedded_weights": a.name in EMBEDDED} for a in archs])
        return
    table = Table(title="Registered architectures", header_style="bold")
    for col in ("name", "family", "layers", "hidden", "interm.", "heads", "kv", "head_dim",
                "vocab", "tied", "params"):
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for a in archs:
        name = f"{a.name} [green](weights embedded)[/green]" if a.name in EMBEDDED else a.name
        table.add_row(name, a.family, str(a.num_hidden_layers), str(a.hidden_size),
                      str(a.intermediate_size), str(a.num_attention_heads),
                      str(a.num_key_value_heads), str(a.head_dim), str(a.vocab_size),
                      "yes" if a.tie_word_embeddings else "no", fmt_params(a.count_parameters()))
    console.print(table)


@app.command()
def predict(
    acceptance: float = typer.Option(..., "--acceptance", "-a",
                                     help="Per-token acceptance rate alpha in [0, 1]."),
    draft_ms: float = typer.Option(..., "--draft-ms", help="Drafter latency for one token (ms)."),
    target_ms: float = typer.Option(..., "--target-ms",
                                    help="Target latency for one plain decode step (ms)."),
    gamma: int | None = typer.Option(None, "--gamma", "-g",
                                        help="Draft tokens per step; omitted: pick the best."),
    verify_ms: float | None = typer.Option(
        None, "--verify-ms", help="Target latency to verify gamma+1 tokens (ms); default --target-ms."),
    max_gamma: int = typer.Option(8, "--max-gamma", help="Largest gamma tried when --gamma is omitted."),
    batch_size: int = typer.Option(1, "--batch-size", "-b", help="Sequences decoded together."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Predict speculative-decoding throughput from acceptance rate and latencies."""
    from draftnas.core.throughput import best_gamma, predict_throughput

    if gamma is None:
        est = best_gamma(acceptance_rate=acceptance, draft_ms=draft_ms, target_ms=target_ms,
                         verify_ms=verify_ms, max_gamma=max_gamma, batch_size=batch_size)
    else:
        est = predict_throughput(gamma=gamma, draft_ms=draft_ms, target_ms=target_ms,
                                 verify_ms=verify_ms, acceptance_rate=acceptance,
                                 batch_size=batch_size)
    if json_out:
        print_json({**est.to_dict(), "gamma_chosen": gamma is None})
        return
    table = Table(show_header=False, title="Predicted speculative decoding")
    rows = [
        ("gamma" + (" (best)" if gamma is None else ""), f"{est.gamma}"),
        ("expected tokens per step", f"{est.tokens_per_step:.4f}"),
        ("step latency", f"{est.step_ms:.3f} ms"),
        ("speculative throughput", f"{est.tokens_per_s:.2f} tokens/s"),
        ("plain decoding", f"{est.baseline_tokens_per_s:.2f} tokens/s"),
        ("speedup", f"{est.speedup:.4f}x"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


@app.command()
def inspect(
    spec: str = typer.Argument(..., help="Registry name, embedded name, model folder, .gguf file or hub id."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a target's shape and where its weights come from (converts a GGUF once)."""
    from draftnas.models.sources import inspect_model

    info = inspect_model(spec)
    if json_out:
        print_json({**info.to_dict(), "parameters": info.architecture.count_parameters()})
        return
    a = info.architecture
    table = Table(show_header=False, title=f"{spec}")
    rows = [
        ("source", info.source.kind if info.source else "registry (shape only, no weights here)"),
        ("weights folder", info.folder or "-"),
        ("family", a.family),
        ("layers x hidden", f"{a.num_hidden_layers} x {a.hidden_size}"),
        ("heads / kv heads / head_dim", f"{a.num_attention_heads} / {a.num_key_value_heads} / {a.head_dim}"),
        ("intermediate", str(a.intermediate_size)),
        ("vocab", f"{a.vocab_size} ({'tied' if a.tie_word_embeddings else 'untied'} embeddings)"),
        ("parameters", fmt_params(a.count_parameters())),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
