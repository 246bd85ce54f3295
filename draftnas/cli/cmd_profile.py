"""`draftnas profile`: measure this device's decoder latency and write a latency profile."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from draftnas.cli.app import app, console, fmt_params, parse_ints, print_json
from draftnas.cli.flags import options_command
from draftnas.cli.progress import progress_bars
from draftnas.latency.records import ProfileOptions

if TYPE_CHECKING:
    from draftnas.latency.records import LatencyProfile


@app.command()
@options_command(ProfileOptions)
def profile(
    options: ProfileOptions,
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Profile JSON to write (default: draftnas-profile-DEVICE-DTYPE.json)."),
    report: bool = typer.Option(False, "--report",
                                help="Print draft latency vs depth and width and save it as a PNG."),
    report_png: Path | None = typer.Option(None, "--report-png",
                                           help="PNG path for --report (default: next to --out)."),
    from_file: Path | None = typer.Option(None, "--from",
                                          help="Do not measure: load this profile (e.g. for --report)."),
    json_out: bool = typer.Option(False, "--json", help="Print the profile as JSON on stdout."),
    target: str | None = typer.Option(
        None, "--target", help="Time this target's real shape (random weights) through only its first k "
                               "layers (--layers), extrapolate to full depth and add the result to the "
                               "profile (--from, default the shipped one for --device); the search then "
                               "prices that target with it."),
    layers: str = typer.Option("2,4", "--layers", help="Layer counts timed for --target, e.g. 2,4."),
    tp: int = typer.Option(1, "--tp", help="With --target on CUDA: time one tensor-parallel rank's share "
                                           "of N GPUs."),
    batch_sizes: str = typer.Option("1", "--batch-sizes",
                                    help="Batch sizes timed for --target, e.g. 1,8,32."),
    max_gamma: int = typer.Option(4, "--max-gamma", help="With --target: verify steps of up to this many "
                                                         "drafted tokens (+1) are timed."),
    context: int = typer.Option(128, "--context", help="With --target: context tokens before each step."),
    engine: str = typer.Option(
        "torch", "--engine",
        help="torch: draftnas's own runtime (the default). llama.cpp: time --model (a GGUF) in llama.cpp's "
             "stock llama-bench: decode and a batch of k = 2..8 (or --max-gamma+1) tokens after --context "
             "tokens; "
             "with --base and --quants also random-weight GGUF drafters of that base at three depths per "
             "quant type, lines fitted."),
    model: Path | None = typer.Option(None, "--model",
                                      help="With --engine llama.cpp: the GGUF file to time."),
    base: str | None = typer.Option(
        None, "--base", help="With --engine llama.cpp: the registry shape of the drafters' base (e.g. "
                             "qwen2.5-coder-0.5b)."),
    quants: str = typer.Option(
        "", "--quants", help="With --engine llama.cpp and --base: quant types of the random drafters, e.g. "
                             "Q8_0,Q4_0."),
    llama_cpp: str | None = typer.Option(
        None, "--llama-cpp", help="With --engine llama.cpp: the folder of the build's tools."),
) -> None:
    """Time decoder shapes (draft and verify steps) on this device and fit its latency model."""
    from draftnas.latency.files import load_profile, save_profile
    from draftnas.latency.measure import measure_profile

    if engine != "torch":
        _profile_llama_cpp(engine, model, base, quants, context, max_gamma, llama_cpp, out, json_out)
        return

    if target is not None:
        path, prof = _profile_target(target, from_file, out, options, layers, tp, batch_sizes, max_gamma,
                                     context)
        if json_out:
            print_json({"path": str(path), **prof.to_dict()})
            return
        _render_target(prof, path)
        return
    if from_file is not None:
        prof = load_profile(from_file)
        path = from_file
    else:
        options.validate()
        with progress_bars() as on:
            prof = measure_profile(options, progress=on("profiling"))
        prof = dataclasses.replace(prof, command=" ".join(["draftnas", *sys.argv[1:]]))
        path = out or Path(f"draftnas-profile-{options.device}-{options.resolved_dtype()}"
                           f"{'' if options.mode == 'eager' else '-' + options.mode}.json")
        save_profile(prof, path)
    png = None
    if report:
        png = _report(prof, report_png or path.with_name(path.stem + "-report.png"), quiet=json_out)
    if json_out:
        print_json({"path": str(path), "report_png": str(png) if png else None, **prof.to_dict()})
        return
    _render_summary(prof, path)


def _profile_target(target: str, from_file: Path | None, out: Path | None, asked: ProfileOptions, layers: str,
                    tp: int, batch_sizes: str, max_gamma: int, context: int) -> tuple[Path, LatencyProfile]:
    from draftnas.core.errors import InvalidInputError
    from draftnas.latency.files import default_profile, load_profile, save_profile
    from draftnas.latency.measure import measure_target
    from draftnas.search.candidate import resolve_architecture

    arch = resolve_architecture(target)
    device = asked.device
    base = load_profile(from_file) if from_file is not None else default_profile(device)
    options = dataclasses.replace(asked, dtype=asked.dtype or base.dtype).validate()
    if base.device != device or base.dtype != options.resolved_dtype():
        raise InvalidInputError(f"the profile is {base.device} {base.dtype}; time --target on the same "
                                f"device and dtype (--device {base.device} --dtype {base.dtype}) or pass "
                                "another --from")
    if max_gamma < 1 or context < 0:
        raise InvalidInputError(f"--max-gamma must be >= 1 and --context >= 0, got {max_gamma} and {context}")
    batches = parse_ints("--batch-sizes", batch_sizes)
    if not batches or min(batches) < 1:
        raise InvalidInputError(f"--batch-sizes {batch_sizes!r}: give batch sizes >= 1")
    path = out or Path(f"draftnas-profile-{device}-{base.dtype}-{arch.name}.json")
    counts = parse_ints("--layers", layers)
    with progress_bars() as on:
        timing = measure_target(options, arch, layer_counts=counts, batch_sizes=batches,
                                max_gamma=max_gamma, context_tokens=context, gpus=tp,
                                progress=on("profiling"))
    key = arch.name if tp == 1 else f"{arch.name}/tp{tp}"
    prof = dataclasses.replace(base, targets={**base.targets, key: timing})
    save_profile(prof, path)
    return path, prof


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
    console.print(f"next: draftnas search --target {next(iter(prof.targets)).split('/')[0]} --profile {path}")


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


def _profile_llama_cpp(engine: str, model: Path | None, base: str | None, quants: str, context: int,
                       max_gamma: int, build: str | None, out: Path | None, json_out: bool) -> None:
    """`profile --engine llama.cpp`: the file (and random drafters of --base per quant type) timed by
    llama-bench; written as JSON, printed as a table with each batch's cost over a decode."""
    from draftnas.core.errors import InvalidInputError
    from draftnas.core.machine import cpu_count
    from draftnas.core.records import write_json_file
    from draftnas.core.registry import get_architecture
    from draftnas.latency.llama_cpp import calibrate_llama_cpp, probe_flags
    from draftnas.models.ggml_quants import WRITTEN
    from draftnas.models.llama_cpp import find_llama_cpp

    if engine != "llama.cpp":
        raise InvalidInputError(f"--engine {engine!r} is not known (allowed: torch, llama.cpp)")
    if model is None or not model.is_file() or model.suffix != ".gguf":
        raise InvalidInputError(f"--engine llama.cpp times a GGUF file: --model {model} is not one")
    kinds = [q.strip().upper() for q in quants.split(",") if q.strip()]
    if [q for q in kinds if q not in WRITTEN]:
        raise InvalidInputError(f"--quants {quants!r}: random drafters are written in {', '.join(WRITTEN)}")
    if kinds and base is None:
        raise InvalidInputError("--quants times random drafters of a base: pass --base (a registry shape)")
    arch = get_architecture(base) if base else None
    threads = cpu_count()
    llama = probe_flags(find_llama_cpp(build), model, threads)

    with progress_bars(json_out) as on:
        calibration = calibrate_llama_cpp(llama, model, arch or get_architecture("qwen2.5-coder-0.5b"),
                                          kinds if arch else [], context, max(max_gamma + 1, 8), {}, threads,
                                          on("llama-bench"))
    path = out or Path(f"draftnas-profile-llama-cpp-{model.stem}.json")
    write_json_file(path, calibration.to_dict())
    if json_out:
        print_json({"path": str(path), **calibration.to_dict()})
        return
    t = calibration.target
    table = Table(title=f"{model.name} in llama.cpp ({calibration.version}), {threads} threads, "
                        f"context {context}", header_style="bold")
    for col in ("tokens", "ms", "over a decode"):
        table.add_column(col, justify="right")
    for k, ms in t.batch_ms.items():
        table.add_row(str(k), f"{ms:.1f}", f"{ms / t.decode_ms:.2f}x")
    console.print(table)
    for q, points in calibration.quants.items():
        console.print(f"random {base} drafters in {q}: decode " + ", ".join(
            f"{n} layers {p.decode_ms:.1f} ms" for n, p in points.items()), highlight=False)
    console.print(f"written to {path}", highlight=False)
