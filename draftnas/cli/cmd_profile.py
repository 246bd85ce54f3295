"""`draftnas profile`: measure this device's decoder latency and write a latency profile."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.table import Table

from draftnas.cli.app import app, console, fmt_params
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.latency.records import EngineCalibration, LatencyProfile, ProfileRequest


@app.command()
@options_command(request=ProfileRequest, output=Output)
def profile(request: ProfileRequest, output: Output) -> None:
    """Time decoder shapes (draft and verify steps) on this device and fit its latency model."""
    from draftnas.latency.request import profile_from_request

    with progress_bars(output.json) as on:
        done = profile_from_request(request, progress=on("profiling" if request.engine == "torch"
                                                          else "llama-bench"),
                                    command=" ".join(["draftnas", *sys.argv[1:]]))
    if done.calibration is not None:
        if not emit_json(output, {"path": done.path, **done.calibration.to_dict()}):
            _render_llama_cpp(done.calibration, request, Path(done.path))
        return
    prof, path = done.profile, Path(done.path)
    assert prof is not None
    if done.target is not None:
        if not emit_json(output, {"path": str(path), **prof.to_dict()}):
            _render_target(prof, path)
            console.print(f"next: {done.next_command}", highlight=False)
        return
    png = None
    if request.report:
        png = _report(prof, Path(request.report_png) if request.report_png
                      else path.with_name(path.stem + "-report.png"), quiet=output.json)
    if not emit_json(output, {"path": str(path), "report_png": str(png) if png else None, **prof.to_dict()}):
        _render_summary(prof, path)


def _render_target(prof: LatencyProfile, path: Path) -> None:
    table = Table(title=f"Extrapolated target latencies added to {path}")
    for col in ("target", "timed", "batch", "new tokens", "ms (extrapolated)"):
        table.add_column(col, justify="left" if col in ("target", "timed") else "right")
    for key, t in prof.targets.items():
        for name, ms in t.ms.items():
            b, n = name.split("x")
            table.add_row(key, f"{'/'.join(map(str, t.timed_layers))} of {t.arch.num_hidden_layers} layers",
                          b, n,
                          f"{ms:.2f}")
    console.print(table)
    for key, t in prof.targets.items():
        if t.check is not None:
            console.print(f"{key}: method checked on {t.check.shape}: mean |error| "
                          f"{t.check.mean_abs_error_pct:.1f}%, max {t.check.max_abs_error_pct:.1f}% "
                          f"({len(t.check.points)} conditions; {t.device_name}, {t.wall_s:.0f} s)")
        else:
            console.print(f"{key}: no deeper stack fits here to check the method on")


def _render_summary(prof: LatencyProfile, path: Path) -> None:
    from draftnas.latency.model import heldout_errors

    table = Table(show_header=False, title=f"Latency profile -> {path}")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}%"

    rows = [("device", f"{prof.device_name} ({prof.device}, {prof.dtype}, {prof.mode})"),
            ("kind", prof.kind), ("measurements", str(len(prof.measurements))),
            ("training MAPE", pct(prof.train_mape)), ("held-out MAPE", pct(prof.heldout_mape))]
    for shape, err in heldout_errors(prof).items():
        rows.append((f"  held out: {shape}", pct(err)))
    if prof.extrapolation is not None:
        ex = prof.extrapolation
        rows.append((f"extrapolation {ex.shape} from {'/'.join(map(str, ex.timed_layers))} layers",
                     f"mean |err| {ex.mean_abs_error_pct:.1f}%, max {ex.max_abs_error_pct:.1f}%"))
    if prof.skipped:
        first = prof.skipped[0]
        rows.append(("not timed (memory)", f"{len(prof.skipped)} configurations, e.g. {first.shape} at batch "
                     f"{first.batch_size}, {first.new_tokens} new, context {first.context_tokens}: "
                     f"{first.reason}"))
    if prof.wall_s is not None:
        rows.append(("wall time", f"{prof.wall_s:.0f} s"))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    if prof.kind == "spec-sheet":
        console.print(f"[yellow]{prof.notes}[/yellow]")


def _report(prof: LatencyProfile, png: Path, quiet: bool) -> Path:
    from draftnas.report.profile import depth_width_report, save_report_png

    rep = depth_width_report(prof)
    save_report_png(rep, png)
    if quiet:
        return png
    table = Table(title=f"Draft latency at batch {rep.batch_size}, {rep.new_tokens} new token, "
                        f"context {rep.context_tokens} ({rep.device_name}, {rep.dtype})")
    for col in ("series", "shape", "layers", "hidden", "non-emb params", "measured ms", "IQR",
                "model ms", "split"):
        table.add_column(col, justify="left" if col in ("series", "shape", "split") else "right")
    for r in rep.rows:
        measured = "-" if r.measured_ms is None else f"{r.measured_ms:.2f}"
        iqr = "-" if r.q1_ms is None else f"{r.q1_ms:.2f}-{r.q3_ms:.2f}"
        table.add_row(r.series, r.shape, str(r.layers), str(r.hidden_size),
                      fmt_params(r.non_embedding_params), measured, iqr, f"{r.predicted_ms:.2f}", r.split)
    console.print(table)
    console.print(f"Fitted: {rep.ms_per_layer_overhead:.3f} ms fixed per layer + "
                  f"{rep.ms_per_million_layer_params * 1e3:.3f} ms per billion layer parameters (batch 1). "
                  f"Plot: {png}")
    return png


def _render_llama_cpp(calibration: EngineCalibration, request: ProfileRequest, path: Path) -> None:
    """Each batch's cost over a decode, and the random drafters' decode per depth."""
    t = calibration.target
    model = Path(str(request.model))
    table = Table(title=f"{model.name} in llama.cpp ({calibration.version}), {calibration.threads} threads, "
                        f"context {request.context}", header_style="bold")
    for col in ("tokens", "ms", "over a decode"):
        table.add_column(col, justify="right")
    for k, ms in t.batch_ms.items():
        table.add_row(str(k), f"{ms:.1f}", f"{ms / t.decode_ms:.2f}x")
    console.print(table)
    for q, points in calibration.quants.items():
        console.print(f"random {request.base} drafters in {q}: decode " + ", ".join(
            f"{n} layers {p.decode_ms:.1f} ms" for n, p in points.items()), highlight=False)
    console.print(f"written to {path}", highlight=False)
