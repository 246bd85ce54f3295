"""`draftnas search`: an Optuna study over drafter shapes, ranked by predicted throughput."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from draftnas.cli.app import app, console, err_console, print_json
from draftnas.cli.cmd_export import render_export
from draftnas.cli.progress import progress_bars
from draftnas.cli.search_render import exportable, next_commands, ranked_table, summary_lines
from draftnas.core.errors import InvalidInputError

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.search.records import SearchResult


def export_best(result: SearchResult, root: Path, json_out: bool) -> tuple[str, int, dict[str, Any]]:
    """`--export`: the best trial exported as `draftnas export` would (its default healing) into
    root/<name> and priced again at its acceptance as exported -> (folder, gamma, the export's
    record). A folder that already holds that trial is kept (its `draftnas.json` is the record)."""
    from draftnas.export.folder import exported_record
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request, study_source

    b = result.best
    if b is None or not exportable(result):
        raise InvalidInputError("--export needs a search that pruned real weights and measured acceptance; "
                                "this study has no such drafter to export")
    # a folder holding another study's drafter of the same name is kept; this one goes beside it
    for out in (root / b.candidate.name, root / f"{b.candidate.name}-{result.study_name}"):
        record = exported_record(out)
        if record is not None and record.get("source") == study_source(result.study_name, b.number):
            if not json_out:
                console.print(f"{out} already holds trial {b.number} of study {result.study_name} (exported "
                              "before; its README.md has the figures)")
            return str(out), int(record.get("gamma", b.primary.gamma)), record
        if not out.exists() or not any(out.iterdir()):
            break
    request = ExportRequest(out_dir=str(out), study=result.study_name, storage=result.storage, trial=b.number,
                            heal_steps=None, device=result.info.device)
    with progress_bars(json_out) as on:
        exported = export_from_request(request, progress=on("healing the best drafter"),
                                       data_progress=on("target continuations"))
    if not json_out:
        render_export(exported)
    return exported.out_dir, exported.gamma, exported.to_dict()


def result_json(result: SearchResult) -> dict[str, Any]:
    data = result.to_dict()
    info = result.info
    data["acceptance"] = ("FITTED" if info.acceptance_model else "ASSUMED" if info.acceptance_assumed
                          else "measured")
    data["note"] = result.info.note
    return data


@app.command()
def search(
    target: str = typer.Option(..., "--target", "-t", help="Target model: registry name or weights."),
    base: str | None = typer.Option(None, "--base", help="Base to prune drafters from (weights; "
                                    "default: the space's base)."),
    base_shape: str | None = typer.Option(None, "--base-shape", help="Registry name giving the base's "
                                          "shape for a latency-only search (no weights)."),
    space: str | None = typer.Option(None, "--space", help="Search space YAML or shipped name "
                                     "(default: the shipped space for --target)."),
    profile: str | None = typer.Option(None, "--profile", help="Latency profile JSON or shipped name "
                                       "(default: the space's; its 'cpu' is the shipped CPU profile "
                                       "measured on this CPU model when there is one)."),
    traces: str | None = typer.Option(None, "--traces", help="Target traces (draftnas trace); default: "
                                      "built once into the run folder when the target has weights."),
    trials: int = typer.Option(20, "--trials", "-n", help="Finished trials the study should hold."),
    timeout: float | None = typer.Option(None, "--timeout", help="Stop asking new trials after S s."),
    storage: str | None = typer.Option(None, "--storage", help="sqlite:///F, postgresql://..., "
                                       "journal:F (default: runs/<study>/study.db)."),
    study: str | None = typer.Option(None, "--study", help="Study name (default from space/target)."),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe | nsga2 (latency vs acceptance "
                                "Pareto front) | random."),
    seed: int | None = typer.Option(0, "--seed", help="Sampler seed."),
    acceptance_prior: str | None = typer.Option(
        None, "--acceptance-prior",
        help="Do not measure acceptance: a number assumes that per-token acceptance for every drafter "
             "(ASSUMED); a model file from `draftnas alpha fit` predicts it per drafter (FITTED ON ...)."),
    acceptance_anchor: float | None = typer.Option(
        None, "--acceptance-anchor",
        help="With a model: shift its level so the space's first reference drafter gets this acceptance; "
             "the model then only says how drafters differ."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs the target is sharded over (tensor "
                                    "parallelism; GPU profiles). Default: the smallest number that holds "
                                    "it at the workload's largest batch."),
    draft_tp: str = typer.Option("1", "--draft-tp", help="Drafter on 1 GPU, or 'same': sharded like the "
                                 "target (the two vLLM allows)."),
    dtype: str | None = typer.Option(None, "--dtype", help="Weights' dtype: fp32, fp16, bf16 or fp8. "
                                     "Default: on a calibrated CPU search the faster of fp32 and (where the "
                                     "CPU has native bf16) bf16, on a calibrated GPU search of bf16 and "
                                     "fp16, timed on the target first; else the profile's (spec-sheet "
                                     "profiles are re-derived)."),
    reference: list[str] = typer.Option([], "--reference", "-r",
                                        help="A drafter a user would otherwise pick (an embedded name, a "
                                             "folder or a registry shape), priced and ranked beside the "
                                             "trials as 'ref'; repeatable, added to the space's "
                                             "references."),
    memory_margin: float = typer.Option(0.1, "--memory-margin", help="Share of each GPU's memory kept "
                                        "free (vLLM's 1 - gpu_memory_utilization)."),
    run_dir: str = typer.Option("runs", "--run-dir", help="Folder for studies' outputs."),
    top: int = typer.Option(15, "--top", help="Rows in the ranked table."),
    device: str = typer.Option(
        "cpu", "--device", help="cpu | cuda: where the target's traces are written, drafters built, "
                                "healed and scored, the calibration timed (a measured profile of this "
                                "device is calibrated) and the printed bench runs."),
    calibrate: bool = typer.Option(
        True, "--calibrate/--no-calibrate",
        help="Before ranking, time the target's decode and verify steps, drafter-sized stacks, the "
             "space's reduced heads and a few short decoding runs on --device (about 1 min for "
             "SmolLM2-135M on 2 CPU cores) and correct a measured profile of that device with them."),
    engine: str = typer.Option(
        "static", "--engine",
        help="The speculative loop the calibration times and the printed bench command runs: static "
             "(draftnas's decoder over caches allocated once; its target alone is faster too), hf "
             "(transformers models over a growing cache) or llama.cpp (GGUF drafters timed, ranked and "
             "exported for llama.cpp's own tools; the target must be a GGUF, the default space is the "
             "target's -llama-cpp one, and the search says when no drafter can pay there)."),
    llama_cpp: str | None = typer.Option(
        None, "--llama-cpp", help="With --engine llama.cpp: the folder of a llama.cpp build's tools "
                                  "(default: the one `draftnas engines --build` made, or "
                                  "$DRAFTNAS_LLAMA_CPP)."),
    target_gguf: str | None = typer.Option(
        None, "--target-gguf",
        help="With --engine llama.cpp: time and bench this quantization of the target (same shape and "
             "tokenizer; e.g. a Q8_0 made from the embedded Q4_K_M with llama-quantize --allow-requantize) "
             "instead of its own file."),
    calibration: str | None = typer.Option(
        None, "--calibration",
        help="A stored calibration of this host (a JSON file the search wrote under ~/.cache/draftnas/"
             "calibrations/) to use instead of timing; one from another CPU, thread count or torch version "
             "is refused. Default: the stored one for this host and request when its target decode and "
             "verify still re-time within 10%, else a new calibration, stored for the next run."),
    threads: int | None = typer.Option(
        None, "--threads", help="torch's CPU threads for the whole search (default: torch's own, the "
                                "number of cores); part of the stored calibration's key."),
    export: bool = typer.Option(
        False, "--export",
        help="Then export the best drafter to drafters/<name> as `draftnas export` does (healed by "
             "default), price it again at its acceptance as exported, and print how to bench it and use "
             "it from transformers. A folder that already holds that trial is kept."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print the result as JSON on stdout (progress stays on stderr)."),
    out_json: Path | None = typer.Option(None, "--out-json",
                                         help="Also write the result as JSON to this file."),
) -> None:
    """Search drafter depth/width for a target; rank by predicted speculative tokens/s."""
    from draftnas.search.records import StudySettings
    from draftnas.search.resolve import SearchRequest
    from draftnas.search.resolve import search as run

    prior, model = parse_acceptance_prior(acceptance_prior)
    settings = StudySettings(n_trials=trials, timeout_s=timeout, storage=storage, study_name=study,
                             sampler=sampler, seed=seed, run_dir=run_dir)
    request = SearchRequest(target=target, base=base, base_shape=base_shape, space=space, profile=profile,
                            traces=traces, study=settings, acceptance_prior=prior, calibrate=calibrate,
                            acceptance_model=model, acceptance_anchor=acceptance_anchor, gpus=gpus,
                            draft_tp=draft_tp, dtype=dtype, memory_margin=memory_margin, engine=engine,
                            references=tuple(reference), device=device, calibration=calibration,
                            threads=threads, llama_cpp=llama_cpp, target_gguf=target_gguf)
    signal.signal(signal.SIGTERM, _terminate)  # `kill` stops like Ctrl-C: trial in flight told FAIL
    with progress_bars(json_out) as on:
        result = run(request, progress=on("trials"), trace_progress=on("tracing target"),
                     calibration_progress=on("timing the target on this machine"))
    if not json_out:
        _render(result, top)
    if result.interrupted:
        _write_json(result, None, json_out, out_json)
        lost = (f"trial {result.interrupted_trial} (in flight) was marked FAIL"
                if result.interrupted_trial is not None else "no trial was in flight")
        err_console.print(f"[yellow]interrupted: {lost}; re-run the same command to resume[/yellow]")
        sys.exit(130)
    exported = export_best(result, Path("drafters"), json_out) if export else None
    _write_json(result, exported, json_out, out_json)
    if not json_out:
        for line in next_commands(result, exported[:2] if exported else None, target_gguf):
            console.print(line, highlight=False, soft_wrap=True)


def parse_acceptance_prior(text: str | None) -> tuple[float | None, str | None]:
    """--acceptance-prior: (a constant alpha, None) or (None, a model file)."""
    if text is None:
        return None, None
    try:
        return float(text), None
    except ValueError:
        pass
    if not Path(text).expanduser().is_file():
        raise InvalidInputError(f"--acceptance-prior {text!r} is neither a number in [0, 1] nor a model file "
                                "(`draftnas alpha fit` writes one)")
    return None, text


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _write_json(result: SearchResult, exported: tuple[str, int, dict[str, Any]] | None, json_out: bool,
                out_json: Path | None) -> None:
    """The result as JSON (with the export's folder, gamma and record after --export): printed on
    stdout with --json, written to --out-json."""
    if not json_out and out_json is None:
        return
    data = result_json(result)
    if exported is not None:
        data["export"] = {"folder": exported[0], "gamma": exported[1], "record": exported[2]}
    if out_json is not None:
        out_json.write_text(json.dumps(data, indent=2, default=str) + "\n")
    if json_out:
        print_json(data)


def _render(result: SearchResult, top: int) -> None:
    console.print(ranked_table(result, top))
    for line in summary_lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    if result.verdict is not None:
        from draftnas.search.engine import Verdict

        for line in Verdict.from_dict(result.verdict).lines():
            console.print(line, highlight=False, soft_wrap=True)
    if any(r.economics is not None for r in result.ranked):
        from draftnas.report.study import save_batch_plot

        path = save_batch_plot(result, Path(result.run_dir) / "speedup-vs-batch.png")
        console.print(f"plot: predicted speedup against batch size, top drafters and references: {path}")
