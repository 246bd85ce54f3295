"""`draftnas bench`: real speculative decoding of target + drafter (and a reference drafter), each arm
measured in one interleaved run, beside the estimate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from draftnas.bench.batch_records import BatchedBenchResult
from draftnas.bench.replay_records import ReplayResult
from draftnas.bench.request_records import BenchRequest
from draftnas.cli.app import app, console
from draftnas.cli.flags import Output, command_line, emit_json, options_command
from draftnas.cli.progress import progress_bars
from draftnas.core.engine_kinds import VLLM
from draftnas.core.intervals import measured_word, with_interval

if TYPE_CHECKING:
    from draftnas.bench.records import ArmResult, BenchResult


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _flag(value: bool | None) -> str:
    return "-" if value is None else ("[green]yes[/green]" if value else "[red]no[/red]")


def _match(arm: ArmResult) -> str:
    if arm.exact_match_rate is None:
        return "-"
    text = f"{arm.exact_match_rate:.0%}"
    if arm.divergence_margins:
        text += " (margins " + ", ".join(f"{m:.3g}" for m in arm.divergence_margins) + ")"
    return text


def arms_table(result: BenchResult) -> Table:
    """Every arm: tokens/s and speedup over its baseline (medians over prompts, 95% intervals), its
    draft length and share of drafted tokens accepted, tokens per step (measured and estimated),
    losslessness against the baseline's greedy output (a drafter run with int8 weights says so)."""
    rounds = f"{result.rounds} rounds, " if result.rounds > 1 else ""
    table = Table(title=f"Speculative decoding, gamma={result.gamma}, T={result.temperature:g} "
                        f"({result.n_prompts} prompts x {result.max_new_tokens} tokens, {rounds}"
                        f"{result.device}, {result.dtype}, {result.threads} threads, "
                        f"loop engine {result.engine}); "
                        "tokens/s and speedup: median over prompts [95% interval]",
                  header_style="bold")
    for col in ("arm", "engine", "tokens/s", "speedup", "over", "γ", "accepted", "tok/step", "estimated",
                "lossless", "exact match", "ms/draft"):
        table.add_column(col, justify="left" if col in ("arm", "engine", "over") else "right")
    for a in result.arms:
        engine = a.engine + (f" {a.draft_weights}" if a.draft_weights not in (None, "dense") else "")
        table.add_row(a.name, engine, with_interval(a.tokens_per_s, a.tokens_per_s_interval, ".2f"),
                      with_interval(a.speedup, a.speedup_interval, ".3f", "x"), a.baseline or "-",
                      _fmt(a.gamma, "d"), _fmt(a.draft_acceptance_rate, ".1%"),
                      _fmt(a.tokens_per_step, ".3f"), _fmt(a.predicted_tokens_per_step, ".3f"),
                      _flag(a.lossless), _match(a),
                      _fmt(a.draft_ms_per_token))
    return table


def engines_table(*results: BenchResult) -> Table:
    """Both engines' arms in one table: tokens/s and speedup over the target alone in the same engine."""
    table = Table(title="Both engines, the same prompts (each engine's arms interleaved among themselves, "
                        "the engines one after the other)", header_style="bold")
    for col in ("engine", "arm", "tokens/s", "speedup over the target alone in that engine"):
        table.add_column(col, justify="left" if col in ("engine", "arm") else "right")
    for r in results:
        for a in r.arms:
            table.add_row(a.engine, a.name, with_interval(a.tokens_per_s, a.tokens_per_s_interval, ".2f"),
                          with_interval(a.speedup, a.speedup_interval, ".3f", "x"))
    return table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def predictions_table(result: BenchResult) -> Table:
    """The search's predictions beside the bench's medians: tokens/s and speedup, each with its error;
    the held-out row (the latency model on a shape the calibration did not time) marked."""
    table = Table(title="Predicted against measured here: the median over prompts (the predicted latencies "
                        "priced on each of these prompts' walks where the bench estimated or replayed them, "
                        "else on the search's prompts, else the pooled prediction) and the pooled "
                        "figure (all tokens over all seconds); error = predicted / measured - 1",
                  header_style="bold")
    for col in ("arm", "predicted", "tokens/s: median pred.", "median", "error", "pooled pred.", "pooled",
                "error", "speedup: median pred.", "median", "error", "pooled pred.", "pooled", "error"):
        table.add_column(col, justify="left" if col in ("arm", "predicted") else "right")
    for c in result.predictions:
        what = f"{c.name}" + (" (held out: untimed shape)" if c.held_out else "") + (
            " (as exported)" if c.source == "export" else f" ({c.source})" if c.source != "search" else "")
        median_tps = c.predicted_bench_median_tokens_per_s or c.predicted_median_tokens_per_s
        median_speedup = c.predicted_bench_median_speedup or c.predicted_median_speedup
        table.add_row(c.arm, what, f"{median_tps or c.predicted_tokens_per_s:.2f}",
                      f"{c.measured_tokens_per_s:.2f}", _pct(c.tokens_per_s_error),
                      f"{c.predicted_tokens_per_s:.2f}", _fmt(c.pooled_tokens_per_s),
                      _pct(c.pooled_tokens_per_s_error),
                      _fmt(median_speedup or c.predicted_speedup, ".3f"),
                      _fmt(c.measured_speedup, ".3f"), _pct(c.speedup_error),
                      _fmt(c.predicted_speedup, ".3f"),
                      _fmt(c.pooled_speedup, ".3f"), _pct(c.pooled_speedup_error))
    return table


def comparison_lines(result: BenchResult) -> list[str]:
    """One line per drafter-over-reference comparison: the ratio, its interval, the verdict."""
    return [f"{c.numerator} / {c.denominator}: {with_interval(c.ratio, c.interval, '.3f', 'x')} "
            f"over {c.prompts} prompts: {c.verdict}" for c in result.comparisons]


def drafting_lines(result: BenchResult) -> list[str]:
    """Per arm of draftnas's loop: its share of seconds inside the drafter, and the speedup a drafter that
    cost nothing at the same tokens per step would give (the verify passes and prefills alone)."""
    return [f"{a.name}: {a.draft_share:.0%} of its seconds drafting; with drafts that cost nothing, at its "
            f"{a.tokens_per_step:.3f} tokens/step: "
            f"{with_interval(a.free_draft_speedup, a.free_draft_speedup_interval, '.3f', 'x')} over "
            f"{a.baseline} (measured {a.speedup:.3f}x)" for a in result.arms
            if a.draft_share is not None and a.free_draft_speedup is not None and a.speedup is not None
            and a.tokens_per_step is not None]


def prompts_table(result: BenchResult) -> Table:
    table = Table(title="Per prompt (seconds, prefill included)", header_style="bold")
    names = [a.name for a in result.arms]
    table.add_column("round", justify="right")
    for col in ("prompt", "domain", "new tok", *names):
        table.add_column(col, justify="left" if col in ("prompt", "domain") else "right")
    for p in result.prompts:
        table.add_row(str(p.round), p.prompt_id, p.domain, str(p.run("target").new_tokens),
                      *(f"{p.run(n).seconds:.2f}" for n in names))
    return table


def batch_table(result: BatchedBenchResult) -> Table:
    """Per batch size: the target's tokens/s, then each drafter's tokens/s, measured speedup (the median of
    the runs, their range beside it) beside the predicted one, tokens per step and exact match with the
    target's batched greedy output."""
    table = Table(title=f"Batched speculative decoding, gamma={result.gamma} ({result.max_new_tokens} "
                        f"tokens per sequence, {result.device}, {result.dtype}, {result.threads} threads, "
                        f"{'vLLM' if result.engine == VLLM else 'static engine'})", header_style="bold")
    labels = list(result.drafters)
    table.add_column("B", justify="right")
    table.add_column("target tok/s", justify="right")
    for label in labels:
        for col in ("tok/s", "speedup", "predicted", "tok/step", "exact"):
            table.add_column(f"{label} {col}", justify="right")
    for p in result.points:
        cells = [str(p.batch_size), f"{p.target_tokens_per_s:.2f}"]
        for k in labels:
            spread = sorted((p.speedup_runs or {}).get(k, ()))
            cells += [f"{p.tokens_per_s[k]:.2f}", f"{p.speedup[k]:.3f}x"
                      + (f" ({spread[0]:.3f}-{spread[-1]:.3f})" if len(spread) > 1 else ""),
                      f"{p.predicted_speedup[k]:.3f}x" if k in p.predicted_speedup else "-",
                      f"{p.tokens_per_step[k]:.3f}", f"{p.exact_match_rate[k]:.0%}"]
        table.add_row(*cells)
    return table


def _crossover(batch: int | None, upto: int) -> str:
    return f"B={batch}" if batch is not None else f"not reached up to B={upto}"


def replay_table(result: ReplayResult) -> Table:
    """A replay: the target alone and the replayed loop (medians over prompts [95% interval]), the
    speedup beside the latency model's, and whether the replay took exactly the recorded steps."""
    stand_in = ", a STAND-IN (below)" if result.note else ""
    table = Table(title=f"Replay of {result.source} acceptance ({result.label}){stand_in}, "
                        f"gamma={result.gamma}: "
                        f"{result.n_prompts} prompts, {result.rounds} rounds, {result.device}, "
                        f"{result.dtype}, {result.threads} threads, random weights; "
                        "median over prompts [95% interval]",
                  header_style="bold")
    for col in ("target", "drafter", "target tok/s", "loop tok/s", "speedup", "predicted", "tok/step",
                "steps replayed/recorded", "exact"):
        table.add_column(col, justify="left" if col in ("target", "drafter") else "right")
    weights = f" {result.draft_weights}" if result.draft_weights != "dense" else ""
    head = f" head {result.head_rows}" if result.head_rows else ""
    table.add_row(result.target, result.drafter + weights + head,
                  with_interval(result.target_tokens_per_s, result.target_tokens_per_s_interval, ".2f"),
                  with_interval(result.tokens_per_s, result.tokens_per_s_interval, ".2f"),
                  with_interval(result.speedup, result.speedup_interval, ".3f", "x"),
                  _fmt(result.predicted_speedup, ".3f") + ("x" if result.predicted_speedup else ""),
                  f"{result.tokens_per_step:.3f}", f"{result.replayed_steps}/{result.recorded_steps}",
                  _flag(result.exact))
    return table


def _print_replay(result: ReplayResult) -> None:
    console.print(replay_table(result))
    lines = [f"accepts: {result.accepts} ({result.source}, recorded on {result.recorded_on})"]
    if result.note:
        lines.append(f"STAND-IN: {result.note}")
    lines.append(f"predicted: {result.profile}" if result.profile else
                 "predicted: none (a quantized drafter, or no profile for this device: --profile)")
    lines.append(f"host: {result.host}, {result.threads} threads, load average before "
                 f"{result.load_average_before}")
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


def _standing(result: BatchedBenchResult, label: str) -> str:
    """Each batch size in words by its runs' paired speedups (`core.intervals.measured_word`): "pays at B=1,
    2; not separable at B=4; does not pay at B=8, 16"."""
    said: dict[str, list[str]] = {}
    for p in result.points:
        runs = (p.speedup_runs or {}).get(label) or (p.speedup[label],)
        said.setdefault(measured_word(min(runs), max(runs)), []).append(str(p.batch_size))
    return "; ".join(f"{word} at B={', '.join(batches)}" for word, batches in said.items())


def _per_run(result: BatchedBenchResult, label: str) -> str:
    """` (per run: B=2, B=2, B=4)` where the crossover was read in more than one run."""
    runs = (result.measured_crossover_runs or {}).get(label) or ()
    return (f" (per run: {', '.join('none' if b is None else f'B={b}' for b in runs)})" if len(runs) > 1
            else "")


def _predicted_crossover(result: BatchedBenchResult, label: str) -> str:
    """The predicted crossover and what its acceptance came from, or why there is none."""
    if result.engine == VLLM:
        if not result.profile:
            return ("none: no vLLM calibration of this target here (`draftnas search --engine vllm --batch "
                    "B` times one)")
        return (_crossover(result.predicted_crossover[label], max(p.batch_size for p in result.points))
                + " (acceptance from draftnas's replay of each prompt, not from vLLM's counters)")
    if not result.profile:
        return "none: no profile for this device (--profile)"
    return (_crossover(result.predicted_crossover[label], 1024) + " (at the tokens per step this run measured"
            + (", accepts replayed)" if result.replay else ")"))


def _schedule_lines(result: BatchedBenchResult) -> list[str]:
    """The schedule arm against the best fixed-γ arm of its drafter at each B, paired per run, in words."""
    from draftnas.bench.vllm_batched import schedule_readings

    out = []
    for schedule in result.schedule_against or {}:
        readings = schedule_readings(result, schedule)
        if not readings:
            continue
        cells = "; ".join(f"B={r.batch_size} (γ {r.gamma}) over {r.best_fixed}: {r.ratio:.3f}x "
                          f"({r.low:.3f}-{r.high:.3f}), "
                          + ("faster" if r.low > 1 else "slower" if r.high < 1 else "not separable")
                          for r in readings)
        out.append(f"{schedule} against the fastest fixed-γ arm at each B (paired per run; its range over "
                   f"runs): {cells}")
    return out


def _print_batched(result: BatchedBenchResult) -> None:
    console.print(batch_table(result))
    if result.replay:
        console.print(f"replayed: {result.replay}; random weights; the exact column is the share of "
                      "sequences whose replayed counts equal the record", highlight=False, soft_wrap=True)
    largest = max(p.batch_size for p in result.points)
    runs = max((len(v) for p in result.points for v in (p.speedup_runs or {}).values()), default=1)
    for label, spec in result.drafters.items():
        measured = _crossover(result.measured_crossover[label], largest) + _per_run(result, label)
        pays = _standing(result, label)
        decode = ", ".join(f"B={p.batch_size} {p.decode_speedup[label]:.3f}x" for p in result.points
                           if p.decode_speedup and label in p.decode_speedup)
        console.print(f"{label} ({spec}): measured over {runs} run(s) per B: {pays}; crossover measured "
                      f"{measured}, predicted {_predicted_crossover(result, label)}"
                      + (f"; without the prompts' prefill: {decode}" if decode else ""), highlight=False,
                      soft_wrap=True)
        for p in result.points:
            split = (p.time_split or {}).get(label)
            if split:
                idle = (p.idle_row_share or {}).get(label, 0.0)
                parts = ", ".join(f"{k} {v:.0%}" for k, v in split.items())
                console.print(f"  B={p.batch_size} time: {parts}; verified rows of finished sequences "
                              f"{idle:.0%}", highlight=False, soft_wrap=True)
    for line in _schedule_lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    if result.profile:
        console.print(f"predictions: {result.profile}", highlight=False, soft_wrap=True)
    console.print(f"host: {result.host}, {result.threads} threads, load average before "
                  f"{result.load_average_before}; prompts (cycled to fill a batch): "
                  f"{', '.join(result.prompts)}", highlight=False, soft_wrap=True)


@app.command()
@options_command(request=BenchRequest, output=Output)
def bench(request: BenchRequest, output: Output) -> None:
    """Decode with every arm (target alone, draftnas's loop, transformers' assisted generation) for the
    drafter and, with --reference, the drafter it must beat; compare them in one run. With
    --batch-size: the target alone and each drafter's batched loop at each batch size instead. With
    --replay: recorded acceptance replayed over random weights of the shapes --target and --draft name."""
    from draftnas.bench.request import bench_from_request

    with progress_bars(output.json) as on:
        result, torch_result = bench_from_request(request, progress=on("bench"),
                                                  torch_progress=on("bench, draftnas's loop"))
    data = result.to_dict() | ({"torch_arms": torch_result.to_dict()} if torch_result is not None else {}) \
        | {"command": command_line()}
    if emit_json(output, data):
        return
    out_json = output.out_json
    if isinstance(result, ReplayResult):
        _print_replay(result)
        if out_json is not None:
            console.print(f"result written to {out_json}")
        return
    if isinstance(result, BatchedBenchResult):
        _print_batched(result)
        if out_json is not None:
            console.print(f"result written to {out_json}")
        return
    console.print(prompts_table(result))
    console.print(arms_table(result))
    for line in comparison_lines(result) + drafting_lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    if result.engine == VLLM:
        from draftnas.bench.vllm import position_lines

        for line in position_lines(result):
            console.print(line, highlight=False, soft_wrap=True)
    if result.predictions:
        console.print(predictions_table(result))
    if result.predicted_from:
        console.print(f"predictions: {result.predicted_from}", highlight=False, soft_wrap=True)
    if result.ablation is not None:
        from draftnas.bench.ablation import HEADING, table_lines

        console.print(HEADING.removeprefix("## "), style="bold", highlight=False)
        for line in table_lines(result):
            console.print(line, highlight=False, soft_wrap=True)
        console.print(f"(the table is in {request.draft}/README.md too)", highlight=False)
    if torch_result is not None:
        console.print(arms_table(torch_result))
        for line in drafting_lines(torch_result):
            console.print(line, highlight=False, soft_wrap=True)
        console.print(engines_table(result, torch_result))
    if result.verdict is not None:
        from draftnas.search.llama_cpp import Verdict

        for line in Verdict.from_dict(result.verdict).lines():
            console.print(line, highlight=False, soft_wrap=True)
    for label, spec in result.drafters.items():
        console.print(f"{label}: {spec}", highlight=False, soft_wrap=True)
    if result.host:
        console.print(f"host: {result.host}, {result.threads} threads, load average before "
                      f"{result.load_average_before}", highlight=False)
    if result.left_out:
        console.print(f"left out {len(result.left_out)} prompt(s) a drafter was healed on: "
                      f"{', '.join(result.left_out)}", highlight=False, soft_wrap=True)
    if out_json is not None:
        console.print(f"result written to {out_json}")
    if request.options.write_accepts:
        console.print(f"accepted counts per step written to {request.options.write_accepts} (replay them "
                      "with bench --replay)", highlight=False, soft_wrap=True)
