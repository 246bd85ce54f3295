"""Figure tables rendered from results files, never typed: a Markdown page marks a table with
`<!-- table: NAME FILE... -->` ... `<!-- /table -->` (FILEs relative to `benchmarks/results/`), and
`render_page` rewrites what lies between the markers from those files. `python scripts/render_tables.py`
renders every page; the docs test fails where a page differs from its rendering.

Tables (`RENDERERS`):
- `workloads FILE...`: per workload, llama.cpp's plain decode, the lookup search's pick and its predicted
  speedup, and the measured bench beside it (lookup search results `lookup.json`, benches `BenchResult`);
- `bench FILE`: every arm of one bench (tokens/s and speedup, medians with 95% intervals, paired per
  prompt and round) and its comparisons;
- `training FILE...`: training runs (`distill train` results): shape, budget, tokens/s, held-out readings.
Every table ends with the host, threads, load and the files it came from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MARK = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /table -->", re.S)


def _read(root: Path, name: str) -> dict[str, Any]:
    path = root / name
    if not path.is_file():
        raise FileNotFoundError(f"a table cites {name}, which is not in {root}")
    return dict(json.loads(path.read_text("utf-8")))


def _ratio(value: float | None, interval: Sequence[float] | None) -> str:
    if value is None:
        return "-"
    if interval and len(interval) == 2:
        return f"{value:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}]"
    return f"{value:.3f}x"


def _speed(value: float, interval: Sequence[float] | None) -> str:
    if interval and len(interval) == 2:
        return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"
    return f"{value:.2f}"


def _bench_line(data: dict[str, Any], name: str) -> str:
    load = data.get("load_average_before", "")
    return (f"{name}: {data.get('host', '')}, {data.get('threads', '')} threads, load before {load}; "
            f"{data.get('n_prompts')} prompts x {data.get('rounds')} rounds, {data.get('max_new_tokens')} "
            f"new tokens; {data.get('engine')} ({data.get('dtype')})")


def bench_table(root: Path, files: Sequence[str]) -> list[str]:
    """Every arm of one bench and its paired comparisons."""
    (name,) = files
    data = _read(root, name)
    decode_only = data.get("engine") == "llama.cpp"
    lines = ["| arm | drafter | tokens/s | speedup over the target alone | tokens/step | lossless |",
             "|---|---|---|---|---|---|"]
    for arm in data["arms"]:
        lossless = "-" if arm.get("lossless") is None else "yes" if arm["lossless"] else \
            f"no ({arm.get('exact_match_rate', 0):.0%} of outputs exact)"
        tps = arm.get("tokens_per_step")
        lines.append(f"| {arm['name']} | {arm.get('drafter') or '-'} | "
                     f"{_speed(arm['tokens_per_s'], arm.get('tokens_per_s_interval'))} | "
                     f"{_ratio(arm.get('speedup'), arm.get('speedup_interval'))} | "
                     f"{'-' if tps is None else f'{tps:.2f}'} | {lossless} |")
    lines.append("")
    for c in data.get("comparisons", []):
        lines.append(f"- {c['numerator']} / {c['denominator']}: {_ratio(c['ratio'], c['interval'])}, "
                     f"{c['verdict']} (paired per prompt and round)")
    timing = "decode only (the server's timings)" if decode_only else "prefill included"
    lines += [f"- tokens/s: {timing}; medians over prompts with 95% intervals",
              f"- {_bench_line(data, name)}"]
    return lines


def _arm(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((a for a in data["arms"] if a["name"] == name), None)


def _loop_cell(bench: dict[str, Any] | None) -> str:
    """draftnas's loop on a workload: its fastest arm over the target alone, beside the model drafter's."""
    if bench is None:
        return "not benched"
    arms = [a for a in bench["arms"] if a.get("speedup") is not None and a.get("engine") != "hf"]
    best = max(arms, key=lambda a: a["speedup"])
    model = _arm(bench, "draftnas")
    cell = (f"{best['name']} at {best['tokens_per_s']:.2f} tokens/s, "
            f"{_ratio(best['speedup'], best.get('speedup_interval'))}")
    if model is not None and best["name"] != "draftnas":
        cell += f"; the model drafter {_ratio(model['speedup'], model.get('speedup_interval'))}"
        paired = next((c for c in bench.get("comparisons", [])
                       if c["numerator"] == best["name"] and c["denominator"] == "draftnas"), None)
        if paired is not None:
            cell += f"; {best['name']} ÷ model drafter {_ratio(paired['ratio'], paired['interval'])}"
    return cell


def _exact(arm: dict[str, Any]) -> str:
    rate = arm.get("exact_match_rate")
    return "" if rate is None else ", every output the target's" if rate >= 1 else \
        f", {rate:.0%} of outputs the target's"


def workloads_table(root: Path, files: Sequence[str]) -> list[str]:
    """Per workload: llama.cpp's plain tokens/s, the lookup search's pick (predicted) and its bench in
    llama.cpp (measured), and draftnas's loop's fastest arm where benched; a bench belongs to the search
    whose held-out prompts it ran."""
    loaded = [_read(root, f) for f in files]
    searches = [d for d in loaded if "prices" in d]
    benches = [d for d in loaded if "arms" in d]
    lines = ["| workload | llama.cpp alone, tokens/s | lookup in llama.cpp | predicted | measured | "
             "draftnas's loop, fastest arm over its target alone |", "|---|---|---|---|---|---|"]
    for s in searches:
        best = s["prices"][0]
        held = set(s["heldout_prompts"]) or set(s["searched_prompts"])  # --no-held-out: a bench's own prompts
        mine = [b for b in benches if {p["prompt_id"] for p in b["prompts"]} <= held]
        name = s["workload"] if s["heldout_prompts"] else \
            f"{s['searched_prompts'][0].rsplit('-', 1)[0]}, priced on the bench's own prompts"
        llama = next((b for b in mine if b.get("engine") == "llama.cpp"), None)
        loop = next((b for b in mine if b.get("engine") != "llama.cpp"), None)
        plain, measured = f"{1000 / s['decode_ms']:.1f} (llama-bench)", "not benched"
        if llama is not None:
            target, arm = _arm(llama, "target"), _arm(llama, "draftnas")
            plain = _speed(target["tokens_per_s"], target.get("tokens_per_s_interval")) if target else plain
            if arm is not None:
                measured = _ratio(arm.get("speedup"), arm.get("speedup_interval")) + _exact(arm)
        verdict = "pays" if best["speedup"] > 1.02 else "level" if best["speedup"] >= 0.98 else "does not pay"
        lines.append(f"| {name} | {plain} | {best['label']} | {best['speedup']:.3f}x ({verdict}) | "
                     f"{measured} | {_loop_cell(loop)} |")
    lines.append("")
    hosts = sorted({f"{s['host']}, {s['threads']} threads" for s in searches})
    lines.append("- predicted: `draftnas lookup` on each workload's search split, the median prompt (every "
                 "third prompt held out); measured: `draftnas bench` on the held-out prompts, medians [95% "
                 "intervals], paired per prompt and round; llama.cpp's tokens/s are decode only, the loop's "
                 "include the prefill; " + "; ".join(hosts))
    lines.append(f"- from {', '.join(f'`{f}`' for f in files)}")
    return lines


def training_table(root: Path, files: Sequence[str]) -> list[str]:
    """Training runs: base, layers, budget, speed and the held-out readings before and after."""
    lines = ["| run | base, layers | head rows | trained tokens | tokens/s | held-out top-1 | tokens/step |",
             "|---|---|---|---|---|---|---|"]
    hosts = set()
    for f in files:
        d = _read(root, f)
        first, last = d["readings"][0], d["readings"][-1]
        hosts.add(str(d["host"]))
        speed = d["trained_tokens"] / max(d["train_s"], 1e-9)  # train_s: the run's, over its resumes
        lines.append(f"| {Path(f).name.split('.')[0]} | {d['base']}, {','.join(map(str, d['layers']))} | "
                     f"{d['head_rows']} | {d['trained_tokens']:,} | {speed:,.0f} | "
                     f"{first['top1_agreement']:.3f} -> {last['top1_agreement']:.3f} | "
                     f"{first['tokens_per_step']:.3f} -> {last['tokens_per_step']:.3f} |")
    lines += ["", f"- {'; '.join(sorted(hosts))}; from {', '.join(f'`{f}`' for f in files)}"]
    return lines


RENDERERS: dict[str, Callable[[Path, Sequence[str]], list[str]]] = {
    "bench": bench_table, "workloads": workloads_table, "training": training_table}


def render_page(text: str, root: Path) -> str:
    """`text` with every marked table rendered from the files under `root` it names."""
    def one(match: re.Match[str]) -> str:
        kind, *files = match["spec"].split()
        if kind not in RENDERERS:
            raise ValueError(f"unknown table {kind!r} (known: {', '.join(RENDERERS)})")
        body = "\n".join(RENDERERS[kind](root, files))
        return f"<!-- table: {match['spec']} -->\n{body}\n<!-- /table -->"
    return MARK.sub(one, text)


def cited_files(text: str) -> list[str]:
    """The results files a page's tables are rendered from."""
    return [f for m in MARK.finditer(text) for f in m["spec"].split()[1:]]
