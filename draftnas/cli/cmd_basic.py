"""`draftnas targets` and `draftnas predict`: torch-free commands."""

from __future__ import annotations

from rich.table import Table

from draftnas.cli.app import app, console, fmt_params
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.core.registry import TargetsRequest
from draftnas.core.throughput import PredictRequest
from draftnas.models.records import EMBEDDED, InspectRequest


@app.command()
@options_command(request=TargetsRequest, output=Output)
def targets(request: TargetsRequest, output: Output) -> None:
    """List the registered architectures (usable as --target / --base for latency work)."""
    from draftnas.core.registry import registered_targets

    archs = registered_targets(request)
    if emit_json(output, [{**a.to_dict(), "parameters": a.count_parameters(),
                           "embedded_weights": a.name in EMBEDDED} for a in archs]):
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
@options_command(request=PredictRequest, output=Output)
def predict(request: PredictRequest, output: Output) -> None:
    """Predict speculative-decoding throughput from acceptance rate and latencies."""
    from draftnas.core.throughput import predict_from_request

    est = predict_from_request(request)
    gamma = request.gamma
    if emit_json(output, {**est.to_dict(), "gamma_chosen": gamma is None}):
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
@options_command(request=InspectRequest, output=Output)
def inspect(request: InspectRequest, output: Output) -> None:
    """Show a target's shape and where its weights come from (converts a GGUF once)."""
    from draftnas.models.sources import inspect_model

    spec = request.spec
    info = inspect_model(spec)
    if emit_json(output, {**info.to_dict(), "parameters": info.architecture.count_parameters()}):
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
