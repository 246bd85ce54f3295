"""`draftnas distill`: self-distillation data at scale, training a drafter to a token budget on it, and
the curve of acceptance against training tokens that the search prices trained shapes with."""

from __future__ import annotations

import typer
from rich.table import Table

from draftnas.cli.app import app, console, fmt_params
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.drafter.head.records import HeadTrainRequest, HeadTrainResult
from draftnas.drafter.training.distill_records import (
    DistillCurveRequest,
    DistillDataRequest,
    DistillDataResult,
    DistillExportRequest,
    DistillTrainRequest,
    DistillTrainResult,
)

distill_app = typer.Typer(
    help="Trained drafters: the target's own outputs as data (the seed's temperatures, top-k kept), a "
         "drafter "
         "trained on them to a token budget (pretrain, then finetune on a domain), and the fitted curve of "
         "acceptance against training tokens.",
    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(distill_app, name="distill")


@distill_app.command("data")
@options_command(request=DistillDataRequest, output=Output)
def data(request: DistillDataRequest, output: Output) -> None:
    """Make or extend OUT: the target's answers to the shipped prompts and to prompts it writes itself, at
    each temperature, and its top-k over text found on this machine. Resumes and appends; stops at
    --minutes or --tokens (trained positions)."""
    from draftnas.drafter.training.distill_data import make_distill_data

    with progress_bars(output.json) as on:
        result = make_distill_data(request, progress=on("data"))
    if emit_json(output, result.to_dict()):
        return
    render_data(result)


def render_data(result: DistillDataResult) -> None:
    table = Table(title=f"Self-distillation data in {result.out} ({result.target})", show_header=False)
    table.add_row("this call",
                  f"+{result.added_positions:,} positions, {result.added_sequences:,} sequences in "
                               f"{result.wall_s / 60:.1f} min ({result.positions_per_s:,.0f} positions/s; "
                               f"{result.host})")
    table.add_row("stopped by", result.stopped_by)
    table.add_row("the set", f"{result.total_positions:,} positions in {result.units_done} units")
    for kind, n in result.positions_per_kind.items():
        table.add_row(f"  {kind}", f"{n:,}")
    for domain, n in result.positions_per_domain.items():
        table.add_row(f"  domain {domain}", f"{n:,}")
    console.print(table)


@distill_app.command("train")
@options_command(request=DistillTrainRequest, output=Output)
def train(request: DistillTrainRequest, output: Output) -> None:
    """Cut --layers of the base at full width (a reduced head of --head-rows), train it on DATA to --tokens
    (then --finetune-tokens of --finetune-domain), reading held-out agreement at log-spaced budgets.
    Checkpoints and resumes; keeps the trained delta over the base, checked by hash."""
    from draftnas.drafter.training.train import train_from_request

    with progress_bars(output.json) as on:
        result = train_from_request(request, progress=on("training"))
    if emit_json(output, result.to_dict()):
        return
    render_train(result)


def render_train(result: DistillTrainResult) -> None:
    table = Table(title=f"{result.label} from {result.base}: {result.trained_tokens:,} of "
                        f"{result.budget_tokens:,} tokens in {result.train_s / 60:.1f} min "
                        f"({result.tokens_per_s:,.0f} tokens/s; {result.host})", header_style="bold")
    for col in ("tokens", "phase", "minutes", "loss", "top-1", "tokens/step"):
        table.add_column(col, justify="right")
    for r in result.readings:
        table.add_row(f"{r.tokens:,}", r.phase, f"{r.train_s / 60:.1f}",
                      "-" if r.loss is None else f"{r.loss:.3f}",
                      f"{r.top1_agreement:.3f}", f"{r.tokens_per_step:.3f}")
    console.print(table)
    console.print(f"trained {fmt_params(result.trainable_parameters)} parameters ({result.train}); kept: "
                  f"{result.kept}; delta {result.delta_file} (sha256 {result.delta_sha256[:16]})"
                  + (f"; resumed at {result.resumed_from_tokens:,} tokens" if result.resumed_from_tokens
                     else ""))
    console.print(f"reproduce: {result.command}")


@distill_app.command("head")
@options_command(request=HeadTrainRequest, output=Output)
def head(request: HeadTrainRequest, output: Output) -> None:
    """Train a head on the target's hidden states (EAGLE-3's layout: one layer reading --layers of the
    target, a --draft-vocab-row head) on DATA to --tokens, reading exact greedy acceptance on held-out
    continuations at log-spaced budgets. Checkpoints and resumes; writes OUT/head, the folder vLLM serves
    (`--speculative-config '{"method": "eagle3", "model": "OUT/head", ...}'`) and `head:OUT/head` names.
    Across GPUs (or CPU processes): `torchrun --nproc_per_node N -m draftnas distill head ...`, --batch-rows
    rows per process, gradients averaged over them; the first process reports and writes."""
    from draftnas.drafter.head.train import train_head
    from draftnas.drafter.training.ranks import launched_ranks

    main = launched_ranks().main
    with progress_bars(output.json or not main) as on:
        result = train_head(request, progress=on("training"))
    if not main or emit_json(output, result.to_dict()):
        return
    render_head(result)


def render_head(result: HeadTrainResult) -> None:
    share = result.features_s / result.train_s if result.train_s else 0.0
    table = Table(title=f"{result.label} on {result.target}: {result.trained_tokens:,} of "
                        f"{result.budget_tokens:,} tokens in {result.train_s / 60:.1f} min "
                        f"({result.tokens_per_s:,.0f} tokens/s, {share:.0%} of it the target's forwards; "
                        f"{result.host})", header_style="bold")
    for col in ("tokens", "minutes", "loss", "top-1", f"tokens/step (γ {result.gamma})"):
        table.add_column(col, justify="right")
    for r in result.readings:
        table.add_row(f"{r.tokens:,}", f"{r.train_s / 60:.1f}", "-" if r.loss is None else f"{r.loss:.3f}",
                      f"{r.top1_agreement:.3f}", f"{r.tokens_per_step:.3f}")
    console.print(table)
    console.print(f"{fmt_params(result.parameters)} parameters; kept: {result.kept}; head folder "
                  f"{result.head}" + (f"; resumed at {result.resumed_from_tokens:,} tokens"
                                      if result.resumed_from_tokens else ""))
    console.print(f"reproduce: {result.command}")


@distill_app.command("curve")
@options_command(request=DistillCurveRequest, output=Output)
def curve(request: DistillCurveRequest, output: Output) -> None:
    """Fit tokens per step against log training tokens for each training run given, check the fit at the
    largest budget it was not fitted on, and write the curves (JSON) and a plot."""
    from draftnas.drafter.training.curve_fit import curves_from_request

    result = curves_from_request(request)
    if emit_json(output, result.to_dict()):
        return
    table = Table(title=f"Training curves -> {request.out}", header_style="bold")
    for col in ("drafter", "points", "fit: a + b ln T", "slope, 95%", "held-out budget", "predicted",
                "measured", "error on the gain over 1"):
        table.add_column(col, justify="right")
    for c in result.curves:
        check, interval = c.check, c.slope_interval()
        slope = "-" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]" + \
            ("" if c.measurable_slope else " no measurable slope")
        table.add_row(c.label, str(len(c.points)), f"{c.intercept:.3f} + {c.slope:.4f} ln T", slope,
                      f"{check.tokens:,}" if check else "-", f"{check.predicted:.3f}" if check else "-",
                      f"{check.measured:.3f}" if check else "-", f"{check.error:+.1%}" if check else "-")
    console.print(table)
    if result.plot:
        console.print(f"plot: {result.plot}")


@distill_app.command("export")
@options_command(request=DistillExportRequest, output=Output)
def export(request: DistillExportRequest, output: Output) -> None:
    """Write RUN's trained drafter (plan over its base + delta, hash-checked) to OUT as a drafter folder that
    `draftnas bench --draft OUT` and `draftnas export --gguf` take; a head run's head as its folder (vLLM's
    eagle3, `--draft head:OUT`), with --gguf also the eagle3 file llama.cpp's draft-eagle3 loads."""
    from draftnas.export.trained import export_trained

    folder, gguf = export_trained(request)
    if emit_json(output, {"folder": str(folder), "gguf": None if gguf is None else str(gguf)}):
        return
    from draftnas.drafter.head.folder import is_head_folder

    head = is_head_folder(folder)
    console.print(f"trained {'head' if head else 'drafter'} written to [bold]{folder}[/bold]"
                  + (f" (`--draft head:{folder}`)" if head else ""))
    if gguf is not None:
        how = " (--spec-type draft-eagle3)" if head else ""
        console.print(f"GGUF for llama.cpp{how}: [bold]{gguf}[/bold]")
