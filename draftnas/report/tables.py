"""Figure tables rendered from results files, never typed (a page marks them; `report.pages` renders a
page): each renderer takes the results folder and the files a marker names and returns the table's lines.

- `workloads FILE...`: per workload, llama.cpp's plain decode, the lookup search's pick and its predicted
  speedup, and the measured bench beside it (lookup search results `lookup.json`, benches `BenchResult`);
- `bench FILE`: every arm of one bench (tokens/s and speedup, medians with 95% intervals, paired per
  prompt and round) and its comparisons;
- `training FILE...`: training runs (`distill train` results): shape, budget, tokens/s, held-out readings;
- `replay FILE...`: replays at other sizes, with whose acceptance each replayed (a stand-in marked so);
- `batched FILE`: a batched bench, measured beside predicted per batch size, and the crossovers;
- `ablation FILE`: `bench --ablation`'s chain, each link over the one before paired per prompt and round;
- `curves FILE...`: `distill curve` results, each shape's fit and its check at the largest budget;
- `hosts BENCH+PLAIN...`: per host, the main job's pick benched in its engine beside the fastest plain
  decoding of the same weights there.
Every table ends with the host, threads, load and the files it came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftnas.bench.batch_records import BatchedBenchResult, BatchPoint
from draftnas.bench.records import ArmResult, BenchResult
from draftnas.bench.replay_records import ReplayResult
from draftnas.core.engine_kinds import ENGINE_KINDS, HF, LLAMA_CPP
from draftnas.core.intervals import predicted_word, with_interval
from draftnas.drafter.families import parse_drafter
from draftnas.report.verdict import arm_of, benches_of, vllm_bench_of
from draftnas.search.lookup_records import LookupResult


def _load(root: Path, name: str) -> Any:
    path = root / name
    if not path.is_file():
        raise FileNotFoundError(f"a table cites {name}, which is not in {root}")
    return json.loads(path.read_text("utf-8"))


def read_result(root: Path, name: str) -> dict[str, Any]:
    """The results file `name` under `root`, as JSON (one line naming it where it is not there)."""
    return dict(_load(root, name))


def _ratio(value: float | None, interval: Sequence[float] | None) -> str:
    return with_interval(value, interval, unit="x")


def _speed(value: float, interval: Sequence[float] | None) -> str:
    if interval and len(interval) == 2:
        return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"
    return f"{value:.2f}"


def _bench_line(data: BenchResult, name: str) -> str:
    return (f"{name}: {data.host}, {data.threads} threads, load before {data.load_average_before}; "
            f"{data.n_prompts} prompts x {data.rounds or 1} round(s), {data.max_new_tokens} "
            f"new tokens; {data.engine} ({data.dtype})")


def _arm_rows(data: BenchResult) -> list[str]:
    """One bench's arms as table rows (with the search's prediction and its error where it had one)."""
    predicted = {p.arm: p for p in data.predictions}
    head = "| arm | drafter | tokens/s | speedup over the target alone | tokens/step | lossless |"
    lines = [head + (" predicted tokens/s (error) |" if predicted else ""),
             "|---|---|---|---|---|---|" + ("---|" if predicted else "")]
    for arm in data.arms:
        lossless = "-" if arm.lossless is None else "yes" if arm.lossless else \
            f"no ({arm.exact_match_rate or 0:.0%} of outputs exact)"
        tps = arm.tokens_per_step
        row = (f"| {arm.name} | {arm.drafter or '-'} | "
               f"{_speed(arm.tokens_per_s, arm.tokens_per_s_interval)} | "
               f"{_ratio(arm.speedup, arm.speedup_interval)} | {'-' if tps is None else f'{tps:.2f}'} | "
               f"{lossless} |")
        if predicted:
            p = predicted.get(arm.name)
            row += " - |" if p is None else \
                f" {p.compared_tokens_per_s:.2f} ({p.tokens_per_s_error:+.1%}) |"
        lines.append(row)
    return lines


def bench_table(root: Path, files: Sequence[str]) -> list[str]:
    """Every arm of one bench and its paired comparisons (draftnas's loop's arms too where the bench ran
    them beside llama.cpp's)."""
    (name,) = files
    raw = read_result(root, name)
    data = BenchResult.from_dict(raw)
    decode_only = ENGINE_KINDS[data.engine or HF].decode_only
    lines = _arm_rows(data)
    torch_arms = raw.get("torch_arms")  # llama.cpp's bench: draftnas's loop on the same prompts beside it
    if torch_arms:
        loop = BenchResult.from_dict(torch_arms)
        lines += ["", f"draftnas's loop on the same prompts ({loop.dtype}, prefill included):", "",
                  *_arm_rows(loop)]
    lines.append("")
    for c in data.comparisons:
        lines.append(f"- {c.numerator} / {c.denominator}: {_ratio(c.ratio, c.interval)}, "
                     f"{c.verdict} (paired per prompt and round)")
    for arm in data.arms:
        if arm.accepted_per_position:
            replayed = arm.predicted_accepted_per_position
            lines.append(f"- {arm.name}: accepted drafts per position in {data.engine} "
                         f"{_positions(arm.accepted_per_position)}, draftnas's replay of the same "
                         f"requests {_positions(replayed) if replayed else '-'}")
    for p in data.predictions:
        if p.measured_speedup is not None and p.speedup_error is not None:
            predicted = p.predicted_bench_median_speedup or p.predicted_median_speedup or p.predicted_speedup
            untimed = " (priced as a shape the calibration did not time)" if p.held_out else ""
            lines.append(f"- {p.arm}{untimed}: predicted {predicted:.3f}x the target alone, measured "
                         f"{p.measured_speedup:.3f}x ({p.speedup_error:+.1%}; medians over prompts)")
    if data.predicted_from:
        lines.append(f"- predictions: {data.predicted_from}")
    timing = "decode only (the server's timings)" if decode_only else "prefill included"
    other = any(a.other_tokens_per_s is not None for a in data.arms)
    timing += (" (the other definition in the file's `other_tokens_per_s`)" if other else "")
    lines += [f"- tokens/s: {timing}; medians over prompts with 95% intervals",
              f"- {_bench_line(data, name)}"]
    if raw.get("command"):
        lines.append(f"- made by `{raw['command']}`")
    return lines


def _positions(rates: Sequence[float]) -> str:
    return " / ".join(f"{r:.3f}" for r in rates)


def _loop_cell(bench: BenchResult | None) -> str:
    """draftnas's loop on a workload: its fastest arm over the target alone, beside the model drafter's."""
    if bench is None:
        return "not benched"
    arms = [a for a in bench.arms if a.speedup is not None and a.engine != HF]
    best = max(arms, key=lambda a: a.speedup or 0.0)
    model = arm_of(bench, "draftnas")
    cell = f"{best.name} at {best.tokens_per_s:.2f} tokens/s, {_ratio(best.speedup, best.speedup_interval)}"
    if model is not None and best.name != "draftnas":
        cell += f"; the model drafter {_ratio(model.speedup, model.speedup_interval)}"
        paired = next((c for c in bench.comparisons
                       if c.numerator == best.name and c.denominator == "draftnas"), None)
        if paired is not None:
            cell += f"; {best.name} ÷ model drafter {_ratio(paired.ratio, paired.interval)}"
    return cell


def _model_cell(bench: BenchResult) -> str:
    """The model drafter a llama.cpp bench ran beside lookup (its reference without a lookup part)."""
    arm = next((a for a in bench.arms if a.name.startswith("reference")
                and parse_drafter(str(a.drafter)).family == "model"), None)
    if arm is None:
        return "not benched"
    gamma = f", γ {arm.gamma}" if arm.gamma else ""
    return f"{Path(str(arm.drafter)).name}{gamma}: {_ratio(arm.speedup, arm.speedup_interval)}{_exact(arm)}"


def _exact(arm: ArmResult) -> str:
    rate = arm.exact_match_rate
    return "" if rate is None else ", every output the target's" if rate >= 1 else \
        f", {rate:.0%} of outputs the target's"


def _vllm_cell(bench: BenchResult | None) -> str:
    """vLLM on a workload's held-out prompts: its target alone and each drafting arm over it."""
    if bench is None:
        return "not benched"
    target = arm_of(bench, "target")
    parts = [f"alone {_speed(target.tokens_per_s, target.tokens_per_s_interval)}"] if target else []
    for arm in bench.arms:
        if arm.name == "target" or arm.speedup is None:
            continue
        name = Path(str(arm.drafter)).name
        label = ("lookup" if arm.name == "lookup" else
                 f"draftnas's pick {name}" if arm.name == "draftnas" else name) + (
                     f", γ {arm.gamma}" if arm.gamma and arm.name != "lookup" else "")
        parts.append(f"{label}: {_ratio(arm.speedup, arm.speedup_interval)}{_exact(arm)}")
    return "; ".join(parts)


def workloads_table(root: Path, files: Sequence[str]) -> list[str]:
    """Per workload: llama.cpp's plain tokens/s, the lookup search's pick (predicted) and its bench in
    llama.cpp (measured), and draftnas's loop's fastest arm where benched; a bench belongs to the search
    whose held-out prompts it ran."""
    loaded = [read_result(root, f) for f in files]
    searches = [LookupResult.from_dict(d) for d in loaded if "prices" in d]
    benches = [BenchResult.from_dict(d) for d in loaded if "arms" in d]
    lines = ["| workload | llama.cpp alone, tokens/s | lookup in llama.cpp | predicted | measured | "
             "a model drafter in llama.cpp | draftnas's loop, fastest arm over its target alone | "
             "vLLM (fp32): its target alone, tokens/s, and each arm over it |",
             "|---|---|---|---|---|---|---|---|"]
    for s in searches:
        best = s.best
        name = s.workload if s.heldout_prompts else \
            f"{s.searched_prompts[0].rsplit('-', 1)[0]}, priced on the bench's own prompts"
        llama, loop, other_prompts = benches_of(s, benches)
        plain, measured, model = f"{1000 / s.decode_ms:.1f} (llama-bench)", "not benched", "not benched"
        if llama is not None:
            target, arm = arm_of(llama, "target"), arm_of(llama, "draftnas")
            plain = _speed(target.tokens_per_s, target.tokens_per_s_interval) if target else plain
            if arm is not None:
                measured = _ratio(arm.speedup, arm.speedup_interval) + _exact(arm)
            model = _model_cell(llama)
        loop_cell = _loop_cell(loop) + (" (other prompts of the set)" if other_prompts else "")
        verdict = predicted_word(best.speedup)
        priced = "llama-server's steps" if s.bench_best else "llama-bench's costs"
        spread = (f" [{best.speedup_ci_low:.3f}, {best.speedup_ci_high:.3f}]"
                  if best.speedup_ci_low is not None and best.speedup_ci_high is not None else "")
        lines.append(f"| {name} | {plain} | {best.label} | {best.speedup:.3f}x{spread} ({verdict}; "
                     f"{priced}) | {measured} | {model} | {loop_cell} | "
                     f"{_vllm_cell(vllm_bench_of(s, benches))} |")
    lines.append("")
    hosts = sorted({f"{d.host}, {d.threads} threads" for d in searches if d.host}
                   | {f"{d.host}, {d.threads} threads" for d in benches if d.host})
    lines.append("- predicted: `draftnas lookup` on each workload's search split, the median prompt (every "
                 "third prompt held out; its 95% interval over prompts where recorded); measured: `draftnas "
                 "bench` on the held-out prompts, medians [95% intervals], paired per prompt and round; "
                 "llama.cpp's tokens/s are decode only, the loop's and vLLM's include the prefill; "
                 + "; ".join(hosts))
    lines.append(f"- from {', '.join(f'`{f}`' for f in files)}")
    return lines


def _counts_source(root: Path, data: ReplayResult) -> str:
    """Whose acceptance a replay replayed: the accepts file's pair, marked a stand-in where its target is
    not the replay's; or the stated rate."""
    if data.source != "bench":
        return f"stated rate ({data.note or data.source}), a stand-in"
    accepts = Path(data.accepts).name
    pair = read_result(root, accepts).get("target") if (root / accepts).is_file() else None
    if pair is None:
        return f"recorded counts ({accepts or 'file not kept'})"
    stand_in = ", a stand-in" if pair != data.target else ""
    return f"{pair}'s counts on {data.recorded_on.split(',')[0]}{stand_in}"


def replay_table(root: Path, files: Sequence[str]) -> list[str]:
    """Replays (`bench --replay`): per target and drafter shape, the target alone and the replayed loop,
    with whose acceptance each replayed."""
    lines = ["| target | drafter | acceptance from | target alone, tokens/s | speculative, tokens/s | "
             "speedup | tokens/step |", "|---|---|---|---|---|---|---|"]
    hosts = set()
    for f in files:
        d = ReplayResult.from_dict(read_result(root, f))
        hosts.add(f"{d.host}, {d.dtype}, {d.n_prompts} prompts x {d.rounds} rounds, "
                  f"load before {d.load_average_before}")
        lines.append(f"| {d.target} | {d.drafter} ({d.draft_weights}) | {_counts_source(root, d)} | "
                     f"{_speed(d.target_tokens_per_s, d.target_tokens_per_s_interval)} | "
                     f"{_speed(d.tokens_per_s, d.tokens_per_s_interval)} | "
                     f"{_ratio(d.speedup, d.speedup_interval)} | {d.tokens_per_step:.2f} |")
    lines += ["", "- random weights of the real shapes; each replayed step drafts and verifies what the "
              "recorded step accepted; medians over prompts with 95% intervals, paired per prompt and round",
              f"- {'; '.join(sorted(hosts))}; from {', '.join(f'`{f}`' for f in files)}"]
    return lines


def batched_table(root: Path, files: Sequence[str]) -> list[str]:
    """`bench --batch-size`: per batch size, the target alone and each drafter's speedup, measured beside
    predicted, and the crossover (the first batch where speculation stops paying)."""
    (name,) = files
    d = BatchedBenchResult.from_dict(read_result(root, name))
    labels = list(d.drafters)
    head = " | ".join(f"{label}: measured / predicted" for label in labels)
    lines = [f"| batch | target alone, tokens/s | {head} |", "|---|---|" + "---|" * len(labels)]
    runs = 1
    for pt in d.points:
        cells = []
        for label in labels:
            predicted = pt.predicted_speedup.get(label)
            said = "-" if predicted is None else f"{predicted:.3f}x"
            spread = sorted((pt.speedup_runs or {}).get(label) or ())
            runs = max(runs, len(spread))
            ranged = f" ({spread[0]:.3f}-{spread[-1]:.3f})" if len(spread) > 1 else ""
            cells.append(f"{pt.speedup[label]:.3f}x{ranged} / {said}")
        lines.append(f"| {pt.batch_size} | {pt.target_tokens_per_s:.1f} | {' | '.join(cells)} |")

    def per_run(label: str) -> str:
        found = (d.measured_crossover_runs or {}).get(label) or ()
        return f" (per run: {', '.join(str(b) for b in found)})" if len(found) > 1 else ""

    crossings = "; ".join(f"{label}: measured {d.measured_crossover.get(label)}{per_run(label)}, "
                          f"predicted {d.predicted_crossover.get(label)}" for label in labels)
    acceptance = ("draftnas's replay of each prompt" if d.engine == "vllm"
                  else "the tokens per step this run measured" + (" (accepts replayed)" if d.replay else ""))
    lines += ["", "- the first batch where speculation stops paying (none: it pays at every batch run): "
              f"{crossings}", f"- {d.host}, {d.threads} threads, {d.dtype}, load before "
              f"{d.load_average_before}; "
              + ("one run per batch size" if runs == 1 else
                 f"the median of {runs} interleaved runs per batch size (their range in brackets), each "
                 "paired with the target alone's run beside it")
              + f"; predicted by {d.profile or 'nothing (none stored)'}, acceptance from "
              f"{acceptance}; drafters {', '.join(f'{k} = {v}' for k, v in d.drafters.items())}; "
              f"from `{name}`"]
    return lines + _schedule_lines(d) + _time_split_lines(d, labels) + _step_lines(d, labels)


def _schedule_lines(result: BatchedBenchResult) -> list[str]:
    """`--gamma-schedule`: at each batch, the schedule's γ there and its tokens/s over the fastest fixed-γ
    arm's there, paired per run (the median, its range over runs in brackets)."""
    from draftnas.bench.vllm_batched import schedule_readings

    out = []
    for arm in result.schedule_against or {}:
        cells = "; ".join(f"B = {r.batch_size} (γ {r.gamma}) over {r.best_fixed}: {r.ratio:.3f}x "
                          f"({r.low:.3f}-{r.high:.3f})" for r in schedule_readings(result, arm))
        fixed = ", ".join((result.schedule_against or {})[arm])
        out.append(f"- {arm} against the fastest fixed-γ arm at each batch ({fixed}), paired per run: "
                   f"{cells}")
    return out


def _step_lines(d: BatchedBenchResult, labels: Sequence[str]) -> list[str]:
    """Each step's milliseconds at each batch, measured in the runs / priced by the profile (where both were
    recorded): the target alone's decode, each drafter's draft step and verify."""
    def pair(pt: BatchPoint, arm: str, part: str) -> str:
        measured = ((pt.step_ms or {}).get(arm) or {}).get(part)
        priced = ((pt.priced_ms or {}).get(arm) or {}).get(part)
        if measured is None:
            return ""
        return f"{measured:.0f}" + ("" if priced is None else f"/{priced:.0f}")

    rows = []
    for pt in d.points:
        cells = [f"target decode {pair(pt, 'target', 'decode')}"]
        cells += [f"{label} draft {pair(pt, label, 'draft')}, verify {pair(pt, label, 'verify')}"
                  for label in labels]
        if (pt.step_ms or {}).get("target"):
            rows.append(f"B={pt.batch_size}: " + "; ".join(cells))
    return ["- ms per step of the whole batch, measured/priced: " + " · ".join(rows)] if rows else []


def _time_split_lines(d: BatchedBenchResult, labels: Sequence[str]) -> list[str]:
    """Where each drafter's batched loop spent its time at each batch (where the bench recorded it)."""
    parts = {label: "; ".join(f"B={pt.batch_size}: " + ", ".join(f"{k} {v:.0%}" for k, v in split.items())
                              + f", finished rows {(pt.idle_row_share or {}).get(label, 0.0):.0%}"
                              for pt in d.points if (split := (pt.time_split or {}).get(label)))
             for label in labels}
    return [f"- {label}'s loop, share of its time: {text}" for label, text in parts.items() if text]


def ablation_table(root: Path, files: Sequence[str]) -> list[str]:
    """`bench --ablation`: the chain from the stock drafter to the winner, each link over the one before it
    paired per prompt and round (the same table the winner's card carries)."""
    from draftnas.bench.ablation import table_lines

    (name,) = files
    data = BenchResult.from_dict(read_result(root, name))
    return [*table_lines(data), "",
            "- tokens/s: prefill included; medians over prompts "
            "with 95% intervals", f"- {_bench_line(data, name)}"]


def _plain(root: Path, name: str) -> str:
    """The fastest plain decoding measured beside a bench: a llama.cpp bench's target alone, or a
    `llama-bench` JSON's generation runs (median with its 95% interval)."""
    from draftnas.core.intervals import median_interval

    data = _load(root, name)
    if isinstance(data, list):  # llama-bench -o json: one entry per test
        gen = next(t for t in data if t.get("n_gen"))
        value, low, high = median_interval(gen["samples_ts"])
        return f"{_speed(value, (low, high))} (llama-bench, {gen['n_gen']} tokens)"
    target = BenchResult.from_dict(data).arm("target")
    return f"{_speed(target.tokens_per_s, target.tokens_per_s_interval)} (llama-server)"


def hosts_table(root: Path, files: Sequence[str]) -> list[str]:
    """Per host kind: a bench of the main job's pick in its engine (the target alone, the pick, the stock
    drafter as users run it) beside the fastest plain decoding of the same weights there. Each FILE is
    `BENCH+PLAIN`: the bench and the plain decoding's results file."""
    lines = ["| host | engine | requests | target alone, tokens/s | best found | stock drafter "
             "| fastest plain decoding there, tokens/s |", "|---|---|---|---|---|---|---|"]
    for spec in files:
        bench_name, _, plain_name = spec.partition("+")
        data = BenchResult.from_dict(read_result(root, bench_name))
        target, best, stock = data.arm("target"), data.arm("draftnas"), arm_of(data, "reference")
        engine = LLAMA_CPP if data.engine == LLAMA_CPP else f"draftnas's loop ({data.dtype})"
        host = data.host.split(", avx")[0]
        alone = _speed(target.tokens_per_s, target.tokens_per_s_interval)
        users = "-" if stock is None else _ratio(stock.speedup, stock.speedup_interval)
        found = _ratio(best.speedup, best.speedup_interval)
        requests = "/".join(sorted({p.domain for p in data.prompts}))
        lines.append(f"| {host} | {engine} | {requests}, {data.n_prompts} prompts | {alone} "
                     f"| {found} "
                     f"| {users} | {_plain(root, plain_name) if plain_name else '-'} |")
    lines += ["", "- best found and stock drafter: speedup over the target alone in the same engine and run, "
              "medians over prompts [95% intervals]; llama.cpp's server times decode only, draftnas's loop "
              "each request with its prefill, llama-bench 64 generated tokens after no prompt",
              f"- from {', '.join(f'`{n}`' for n in dict.fromkeys(f for s in files for f in s.split('+')))}"]
    return lines
