"""`draftnas search`: an Optuna study over drafter shapes, ranked by predicted throughput."""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.cli.app import app, console, err_console
from draftnas.cli.cmd_export import render_export
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.cli.search_render import ranked_table, trained_table
from draftnas.core.engine_kinds import engine_kind
from draftnas.core.options import option
from draftnas.search.hand_made import hand_made_best
from draftnas.search.requests import SearchRequest

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.export.records import BestExport
    from draftnas.search.records import SearchResult


@dataclass(frozen=True)
class Rows:
    """How many ranked rows `draftnas search` prints."""

    top: int = option(15, low=1, help="Rows in the ranked table (the JSON holds every trial).")


def result_json(result: SearchResult, exported: BestExport | None = None,
                hand_made: BestExport | None = None) -> dict[str, Any]:
    """The result as JSON, with the export's folder, gamma and record after --export (and the hand-made
    best's, where it is not the winner)."""
    data = result.to_dict()
    info = result.info
    data["acceptance"] = ("FITTED" if info.acceptance_model else "ASSUMED" if info.acceptance_assumed
                          else "measured")
    data["note"] = result.info.note
    if exported is not None:
        data["export"] = {"folder": exported.folder, "gamma": exported.gamma, "record": exported.record}
    if hand_made is not None:
        data["hand_made_export"] = {"folder": hand_made.folder, "gamma": hand_made.gamma,
                                    "record": hand_made.record}
    return data


@app.command()
@options_command(request=SearchRequest, output=Output, rows=Rows)
def search(request: SearchRequest, output: Output, rows: Rows) -> None:
    """Search drafter depth/width for a target; rank by predicted speculative tokens/s."""
    from draftnas.search.explain import next_commands, summary_lines
    from draftnas.search.resolve import search as run

    signal.signal(signal.SIGTERM, _terminate)  # `kill` stops like Ctrl-C: trial in flight told FAIL
    with progress_bars(output.json) as on:
        result = run(request, progress=on("trials"), trace_progress=on("tracing target"),
                     calibration_progress=on(f"timing {request.engine}'s steps on this machine"
                                             if engine_kind(request.engine).external
                                             else "timing the target on this machine"),
                     standings=None if output.json else _say)
    if not output.json:
        _render(result, rows.top, summary_lines(result))
    if result.interrupted:
        emit_json(output, result_json(result))
        lost = (f"trial {result.interrupted_trial} (in flight) was marked FAIL"
                if result.interrupted_trial is not None else "no trial was in flight")
        err_console.print(f"[yellow]interrupted: {lost}; re-run the same command to resume[/yellow]")
        sys.exit(130)
    exported = hand = None
    if request.export:
        from draftnas.export.request import export_best

        with progress_bars(output.json) as on:
            exported = export_best(result, Path("drafters"), progress=on("healing the best drafter"),
                                   data_progress=on("target continuations"))
            bar = hand_made_best(result)  # the bar the winner is benched against, beside the stock drafter
            if bar is not None and result.best is not None and bar.number != result.best.number:
                hand = export_best(result, Path("drafters"), trial=bar,
                                   progress=on("exporting the hand-made best"),
                                   data_progress=on("target continuations"))
        if not output.json:
            if exported.result is None:
                console.print(f"{exported.folder} already holds trial {result.best.number} of study "  # type: ignore[union-attr]
                              f"{result.study_name} (exported before; its README.md has the figures)")
            else:
                render_export(exported.result)
    route = None
    if result.best is not None and not engine_kind(request.engine).external:  # the fastest plain decoding?
        from draftnas.search.llama_cpp import plain_route

        route = plain_route(request.target, f"trial {result.best.number} in draftnas's loop",
                            result.best.throughput.tokens_per_s, build=request.llama_cpp)
    if emit_json(output, result_json(result, exported,
                                     hand) | ({"plain_route": route.to_dict()} if route else {})):
        return
    if route is not None:
        console.print(route.line(), highlight=False, soft_wrap=True)
    elif result.best is not None and not engine_kind(request.engine).external:
        from draftnas.search.llama_cpp import no_build_line

        if line := no_build_line(request.llama_cpp):
            console.print(line, highlight=False, soft_wrap=True)
    done = (exported.folder, exported.gamma, exported.p_min) if exported else None
    if hand is not None and not output.json:
        console.print(f"the hand-made best is in {hand.folder}, at γ {hand.gamma}", highlight=False)
    for line in next_commands(result, done, request.target_gguf, hand.folder if hand else None):
        console.print(line, highlight=False, soft_wrap=True)


def _say(lines: list[str]) -> None:
    for line in lines:
        err_console.print(line, highlight=False, soft_wrap=True)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _render(result: SearchResult, top: int, summary: list[str]) -> None:
    console.print(ranked_table(result, top))
    if result.trained:
        console.print(trained_table(result))
    for line in summary:
        console.print(line, highlight=False, soft_wrap=True)
    if result.verdict is not None:
        from draftnas.search.llama_cpp import Verdict

        for line in Verdict.from_dict(result.verdict).lines():
            console.print(line, highlight=False, soft_wrap=True)
    if any(r.economics is not None for r in result.ranked):
        from draftnas.report.study import save_batch_plot

        path = save_batch_plot(result, Path(result.run_dir) / "speedup-vs-batch.png")
        console.print(f"plot: predicted speedup against batch size, top drafters and references: {path}")
