"""`draftnas lookup`: lookup drafting priced for a target on a workload in an engine (every setting replayed
exactly on the target's answers, timed with the engine's own step costs)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.search.lookup_records import LookupPrice, LookupRequest, LookupResult

SHOWN = 8


@app.command()
@options_command(request=LookupRequest, output=Output)
def lookup(request: LookupRequest, output: Output) -> None:
    """Price lookup drafting (the draft: what followed the last n tokens where they occurred before) on a
    workload's search split: the target answers in the engine, each (n, m) is replayed exactly over those
    answers and priced with the engine's measured decode and batch costs. Prints the best settings, the
    engine's flags for them, and writes OUT/lookup.json and the held-out prompts for `draftnas bench`."""
    from draftnas.search.lookup import search_lookup

    with progress_bars(output.json) as on:
        result = search_lookup(request, progress=on("the target's answers"),
                               steps_progress=on("the answers again with lookup, timing its steps"))
    if emit_json(output, result.to_dict()):
        return
    render(result)


def render(result: LookupResult) -> None:
    table = Table(title=f"Lookup drafting for {result.target} on {result.workload} in {result.engine} "
                        f"({len(result.searched_prompts)} prompts, {result.answer_tokens:,} answer tokens)")
    for column in ("setting", "tokens/step", "accepted", "steps drafting", "speedup (median)", "lowest",
                   "pooled", "break-even tokens/step"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for p in result.prices[:SHOWN]:
        table.add_row(p.label, f"{p.tokens_per_step:.2f}", f"{p.acceptance:.0%}", f"{p.drafted_share:.0%}",
                      f"{p.speedup:.3f}x", f"{p.speedup_low:.3f}x", f"{p.pooled_speedup:.3f}x",
                      f"{p.break_even_tokens_per_step:.2f}")
    console.print(table)
    costs = ", ".join(f"{k}: {ms / result.decode_ms:.2f}x" for k, ms in sorted(result.batch_ms.items())
                      if k > 1)
    best = result.best
    verdict = "pays" if best.speedup > 1 else "does not pay"
    lines = [
        f"best: {best.label}, predicted {best.speedup:.3f}x the target alone in {result.engine} "
        f"(median prompt{_interval(best)}; lowest {best.speedup_low:.3f}x): lookup {verdict} on this "
        "workload here",
        f"{result.engine} flags: {' '.join(result.flags)}",
        f"transformers: generate(..., {', '.join(f'{k}={v}' for k, v in result.transformers.items())}) "
        "(its lookup also tries shorter matches and takes the earliest, so bench it there)",
        f"step costs at {result.context_tokens} tokens of context: decode {result.decode_ms:.1f} ms; "
        f"a batch of k tokens over a decode: {costs}",
        *([f"priced at llama-server's steps: its decode {result.decode_ms:.1f} ms (llama-bench "
           f"{result.bench_decode_ms:.1f}), a drafting step {result.server_step_scale:.2f}x llama-bench's "
           f"batch; llama-bench's costs alone would have said {result.bench_best.label} at "
           f"{result.bench_best.speedup:.3f}x"] if result.bench_best is not None else []),
        (f"bench it on the held-out prompts: draftnas bench --engine llama.cpp -t {result.target} "
         f"-d {best.label} -p {result.heldout_file} --per-domain 0 --out-json BENCH.json; then what pays "
         f"where: draftnas verdict {Path(result.heldout_file).parent},BENCH.json" if result.heldout_file
         else "priced on every prompt given (--no-held-out): no held-out prompts written"),
        f"host: {result.host}, {result.threads} threads; {result.wall_s / 60:.1f} min",
    ]
    for line in lines + edge_warnings(result):
        console.print(line, highlight=False, soft_wrap=True)


def _interval(price: LookupPrice) -> str:
    """', 95% interval over prompts [low, high]' where the result has one."""
    if price.speedup_ci_low is None or price.speedup_ci_high is None:
        return ""
    return f", 95% interval over prompts [{price.speedup_ci_low:.3f}, {price.speedup_ci_high:.3f}]"


def edge_warnings(result: LookupResult) -> list[str]:
    """A warning where the best setting sits on the largest n or m searched: the optimum may lie beyond."""
    best, out = result.best, []
    for name, value, searched in (("match length n", best.n, {p.n for p in result.prices}),
                                  ("draft length m", best.m, {p.m for p in result.prices})):
        if len(searched) > 1 and value == max(searched):
            out.append(f"WARNING: the best {name} ({value}) is the largest searched; the optimum may lie "
                       "beyond it (search longer ones)")
    return out
