"""`draftnas search`: an Optuna study over drafter shapes, ranked by predicted throughput."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from draftnas.cli.app import app, console, err_console, fmt_params, print_json
from draftnas.cli.cmd_export import render_export
from draftnas.cli.progress import progress_bars
from draftnas.core.errors import InvalidInputError

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.search.records import RankedTrial, SearchResult


def ranked_table(result: SearchResult, top: int = 15) -> Table:
    """The ranking as a rich table (best first); says when acceptance is assumed."""
    info = result.info
    assumed = info.acceptance_assumed
    title = (f"study {result.study_name}: drafters for {info.target} from {info.base}, "
             f"ranked by predicted tokens/s on {info.profile}")
    if (result.profile_note or "").startswith("calibrated"):
        title += ", calibrated on this machine"
    if info.acceptance_model:
        title += f"\n[bold yellow]ACCEPTANCE {info.acceptance_model}, NOT MEASURED[/]"
    elif assumed:
        title += f"\n[bold yellow]ACCEPTANCE ASSUMED ({info.acceptance_prior:g} per token), NOT MEASURED[/]"
    table = Table(title=title, header_style="bold", title_justify="left")
    acc_col = ("fitted α / tok/step" if info.acceptance_model else "assumed α / tok/step" if assumed
               else "top-1 / tok/step")
    rows = rows_with_references(result, top)
    name_width = max((len(r.candidate.name) for r in rows), default=9)
    for col in ("#", "trial", "candidate", "layers x width", "params", "draft / verify ms",
                acc_col, "best γ", "tokens/s", "speedup", "break-even α b1 / bN", "stops paying at b"):
        # the name is never cut ("L1bi-h6kv2-m0.5-v4…" was): its column keeps its width, the
        # others wrap at their spaces when the terminal is narrow
        if col == "candidate":
            table.add_column(col, no_wrap=True, min_width=name_width)
        else:
            table.add_column(col, justify="left" if col == "layers x width" else "right", overflow="fold")
    rank = 0
    for r in rows:
        rank += r.reference is None
        table.add_row(*_row(rank, r))
    batches = result.ranked[0].latency.batch_sizes if result.ranked else ()
    caption = []
    if len(batches) > 1:
        caption.append(f"ms and γ at the workload's main batch size; tokens/s and speedup over batch "
                       f"sizes {', '.join(map(str, batches))} (weighted)")
    w = info.space.workload
    if w.prompt_tokens:
        caption.append(f"tokens/s and speedup of whole requests: a {w.prompt_tokens}-token prompt prefilled, "
                       f"{w.new_tokens} tokens generated")
    if result.references:
        caption.append("ref: a published drafter (the space's references), priced the same way")
    caption.append("break-even α: the acceptance at which speculation ties plain decoding, at batch 1 and "
                   "the largest; stops paying: the first batch where it no longer wins at its α")
    table.caption = "\n".join(caption)
    return table


def rows_with_references(result: SearchResult, top: int) -> list[RankedTrial]:
    """The top trials and the space's published drafters, by predicted tokens/s."""
    rows = [*result.ranked[:top], *result.references]
    return sorted(rows, key=lambda r: -r.throughput.tokens_per_s)


def _alpha(value: float | None) -> str:
    return "none ≤ 1" if value is None else f"{value:.2f}"


def _row(rank: int, r: RankedTrial) -> list[str]:
    p = r.primary
    acc = f"{r.acceptance.acceptance_rate:.3f} / {p.tokens_per_step:.2f}"
    trial = f"{r.number}" + (f" (=#{r.reused_from})" if r.reused_from is not None else "")
    e = r.economics
    even = "" if e is None else f"{_alpha(e.break_even_alpha_batch1)} / {_alpha(e.break_even_alpha_largest)}"
    stops = "" if e is None else (f"{e.crossover_batch}" if e.crossover_batch is not None
                                  else f"> {e.sweep_batches[-1]}")
    return ["ref" if r.reference else str(rank), "—" if r.reference else trial, r.candidate.name,
            r.candidate.shape_label(), fmt_params(r.candidate.parameters),
            f"{p.draft_ms:.3f} / {p.verify_ms:.3f}", acc, str(p.gamma), f"{r.throughput.tokens_per_s:,.1f}",
            f"{r.throughput.speedup:.3f}x", even, stops]


def summary_lines(result: SearchResult) -> list[str]:
    c = result.counts
    lines = [
        f"trials: {c.get('COMPLETE', 0)} complete, {c.get('PRUNED', 0)} pruned "
        f"({result.pruned_by_upper_bound} by the upper bound, {result.pruned_infeasible} infeasible), "
        f"{c.get('FAIL', 0)} failed, {c.get('RUNNING', 0)} running; this process told "
        f"{len(result.told_here)} in {result.wall_s:.1f} s",
        f"storage: {result.storage}  (study {result.study_name})",
    ]
    if result.info.placement is not None:
        lines.append(f"placement: {result.info.placement.summary()}")
    if result.pruned_by_upper_bound:
        what = "healing + acceptance estimates" if not result.info.acceptance_assumed else "evaluations"
        lines.append(f"upper-bound pruning saved {result.pruned_by_upper_bound} {what} "
                     "(acceptance 1 at their latency could not beat the best trial)")
    if result.reused:
        lines.append(f"{result.reused} trial(s) re-proposed an evaluated drafter and reused its evaluation")
    if result.best is not None:
        b = result.best
        lines.append(f"best: trial {b.number} {b.candidate.name}: {b.throughput.tokens_per_s:,.1f} tokens/s, "
                     f"{b.throughput.speedup:.3f}x plain decoding "
                     f"({b.throughput.baseline_tokens_per_s:,.1f} tokens/s)")
    if result.best is not None and result.best.throughput.speedup < 1.0:
        lines.append(_no_winner(result))
    if result.info.acceptance_model:
        lines.append(f"NOTE: {result.info.note}. Transferring a model fitted on other families to this one "
                     "is an assumption; the break-even α column says what each drafter needs.")
    elif result.info.acceptance_assumed:
        lines.append(f"NOTE: {result.info.note}; ranking reflects latency only.")
    if result.profile_note:
        lines.append(result.profile_note if result.profile_note.startswith("calibrated")
                     else f"NOTE: {result.profile_note}.")
    return lines


def _no_winner(result: SearchResult) -> str:
    """Why nothing beats plain decoding here: the acceptance-1 ceiling, from the step latencies."""
    from draftnas.search.results import acceptance_ceiling

    ceiling = acceptance_ceiling(result)
    assert ceiling is not None
    r, bound = ceiling
    e = bound.primary()
    why = (f"even accepting every drafted token, the best of them ({r.candidate.name}) would reach "
           f"{bound.speedup:.2f}x: at gamma {e.gamma}, {e.gamma} draft step(s) of {e.draft_ms:.1f} ms and a "
           f"verify of {e.gamma + 1} tokens at {e.verify_ms:.1f} ms, against {e.target_ms:.1f} ms per "
           "target token")
    if bound.speedup <= 1.0:
        return f"NOTE: no candidate beats plain decoding: {why}; no acceptance makes these drafters pay here."
    if result.info.acceptance_assumed:
        return (f"NOTE: no candidate beats plain decoding at the acceptance given: {why}, so it is "
                "acceptance that falls short; the break-even α column says how much each drafter needs.")
    steps = result.info.space.heal.steps
    healed = f" after the search's {steps}-step healing" if steps else ""
    return (f"NOTE: no candidate beats plain decoding at the acceptance measured{healed}: {why}, so it is "
            "acceptance that falls short; export heals longer and prices the drafter again (--export), "
            "or trace more of your workload, or search another base.")


def exportable(result: SearchResult) -> bool:
    """Whether the best trial is a drafter with weights (not a latency-only shape)."""
    b = result.best
    return b is not None and b.candidate.plan is not None and not result.info.acceptance_assumed


def next_commands(result: SearchResult, exported: tuple[str, int] | None = None) -> list[str]:
    """What to run next with the best drafter: export it (unless `exported`: its folder and gamma),
    bench it (beside the first reference with weights, at its own best gamma, in the dtype the search
    chose), use it from transformers."""
    from draftnas.models.sources import has_weights

    b = result.best
    if b is None:
        return []
    if not exportable(result):
        return ["next: this was a latency-only search (no weights to prune); search with the base's weights "
                "(--base) to get a drafter you can export"]
    folder, gamma = exported or (f"drafters/{b.candidate.name}", b.primary.gamma)
    w = result.info.space.workload  # bench on the workload's prompt set, as the acceptance was measured
    reduced = b.candidate.head_vocab_size is not None
    load = f"AutoModelForCausalLM.from_pretrained('{folder}'{', trust_remote_code=True' if reduced else ''})"
    export = [] if exported is not None else [
        f"  draftnas export --study {result.study_name} --storage {result.storage} --trial {b.number} "
        f"--out {folder}"]
    ref = next((r for r in result.references if r.reference and has_weights(r.reference)), None)
    reference = ref.reference if ref is not None else None
    ref_gamma = ref.primary.gamma if ref is not None else gamma  # the reference at its own best gamma
    return [
        "next:",
        *export,
        f"  draftnas bench --target {result.info.target} --draft {folder} --gamma {gamma}"
        + (f" --engine {result.info.engine}" if result.info.engine else "")
        + (f" --dtype {result.info.dtype}" if result.info.dtype != "fp32" else "")
        + (f" --device {result.info.device}" if result.info.device != "cpu" else "")
        + (f" --reference {reference}" if reference else "")
        + (f" --reference-gamma {ref_gamma}" if ref_gamma != gamma else "")
        + (f" --prompts {w.prompt_set} --per-domain 3" if w.prompt_set != "all" else "")
        + (f" --predictions {result.predictions_file}" if result.predictions_file else ""),
        f"  in transformers: target.generate(..., assistant_model={load})",
        "  on CPU, route both models' small products first (a multi-token verify can cost far more than a "
        "decode with the default kernel): from draftnas.models.linears import route_linears; "
        "route_linears(target); route_linears(drafter"
        + (", int8=True)  # it runs with int8 weights" if b.candidate.choice.weights == "int8" else ")"),
    ]


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
    out = root / b.candidate.name
    record = exported_record(out)
    if record is not None and record.get("source") == study_source(result.study_name, b.number):
        if not json_out:
            console.print(f"{out} already holds trial {b.number} of study {result.study_name} (exported "
                          "before; its README.md has the figures)")
        return str(out), int(record.get("gamma", b.primary.gamma)), record
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
                            threads=threads, llama_cpp=llama_cpp)
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
        for line in next_commands(result, exported[:2] if exported else None):
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
