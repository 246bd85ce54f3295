"""`draftnas verdict`: what pays where, engine by workload, from the lookup searches and benches run."""

from __future__ import annotations

from rich.table import Table

from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.core.intervals import with_interval
from draftnas.report.records import VerdictRequest
from draftnas.report.verdict import Route, WorkloadVerdict, verdicts_from_request


@app.command()
@options_command(request=VerdictRequest, output=Output)
def verdict(request: VerdictRequest, output: Output) -> None:
    """What pays where: per workload (one `draftnas lookup` result each) and engine, the drafter family
    that pays, its settings in that engine, its predicted speedup and break-even, what the bench
    measured on the held-out prompts, and the route to take beside llama.cpp's plain decode."""
    verdicts = verdicts_from_request(request)
    if emit_json(output, [v.to_dict() for v in verdicts]):
        return
    render(verdicts)


def _x(value: float | None, interval: tuple[float, float] | None) -> str:
    return with_interval(value, interval, unit="x")


def _row(v: WorkloadVerdict, r: Route) -> list[str]:
    exact = "" if r.exact_match_rate is None or r.exact_match_rate >= 1 else \
        f" ({r.exact_match_rate:.0%} exact)"
    return [v.workload, r.engine, r.family, r.settings, _x(r.predicted, r.predicted_interval),
            r.break_even or "-", _x(r.measured, r.measured_interval) + exact,
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.1f}", r.verdict]


def _how(route: Route) -> str:
    """An engine's settings to use, or why none: its best route measured or predicted not to pay."""
    if route.verdict.startswith("pays") or route.verdict.startswith("not priced"):
        return route.run_with
    return f"decode plainly: its best, {route.family} {route.settings}, {route.verdict}"


def render(verdicts: list[WorkloadVerdict]) -> None:
    table = Table(title="What pays where: each engine's best drafter family per workload",
                  header_style="bold")
    for column in ("workload", "engine", "family", "settings", "predicted", "break-even", "measured",
                   "tokens/s", "verdict"):
        table.add_column(column, overflow="fold")
    for v in verdicts:
        for engine in v.engines:
            best = v.best(engine)
            if best is not None:
                table.add_row(*_row(v, best))
        table.add_section()
    console.print(table)
    for v in verdicts:
        console.print(f"[bold]{v.workload}[/bold]: take {v.recommended}", highlight=False, soft_wrap=True)
        for engine in v.engines:
            best = v.best(engine)
            if best is not None:
                console.print(f"  {engine}: {_how(best)}", highlight=False, soft_wrap=True)
    hosts = sorted({v.host for v in verdicts})
    plain = ", ".join(f"{v.workload} {v.plain_tokens_per_s:.1f}" for v in verdicts)
    console.print("speedups over the target alone in the same engine (measured: medians paired per prompt "
                  "and round [95% intervals], on each set's held-out prompts; predicted: the median prompt "
                  "[95% interval]); tokens/s: llama.cpp's decode only, draftnas's loop's with the prefill; "
                  f"llama.cpp alone: {plain} "
                  f"tokens/s; host {'; '.join(hosts)}", highlight=False, soft_wrap=True)
