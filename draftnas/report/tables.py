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
        lossless = "-" if arm.get("lossless") is None else "yes" if arm["lossless"] else "no"
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


def workloads_table(root: Path, files: Sequence[str]) -> list[str]:
    """Per workload: llama.cpp's plain tokens/s, the lookup search's pick (predicted) and the bench's
    measured speedups (the lookup arm, and the hybrid where benched)."""
    loaded = [_read(root, f) for f in files]
    searches = [d for d in loaded if "prices" in d]
    benches = [d for d in loaded if "arms" in d]
    lines = ["| workload | llama.cpp alone, tokens/s | lookup setting | predicted | measured | "
             "hybrid with the 0.5B, measured |", "|---|---|---|---|---|---|"]
    for s in searches:
        best = s["prices"][0]
        held = set(s["heldout_prompts"])
        bench = next((b for b in benches if {p["prompt_id"] for p in b["prompts"]} <= held), None)
        plain = f"{1000 / s['decode_ms']:.1f} (llama-bench)"
        measured = hybrid = "not benched"
        if bench is not None:
            target, mine = _arm(bench, "target"), _arm(bench, "draftnas")
            plain = _speed(target["tokens_per_s"], target.get("tokens_per_s_interval")) if target else plain
            measured = _ratio(mine.get("speedup"), mine.get("speedup_interval")) if mine else measured
            mixed = next((a for a in bench["arms"] if "+" in (a.get("drafter") or "")), None)
            hybrid = _ratio(mixed.get("speedup"), mixed.get("speedup_interval")) if mixed else "-"
        verdict = "pays" if best["speedup"] > 1 else "does not pay"
        lines.append(f"| {s['workload']} | {plain} | {best['label']} | {best['speedup']:.3f}x ({verdict}) | "
                     f"{measured} | {hybrid} |")
    lines.append("")
    hosts = sorted({f"{s['host']}, {s['threads']} threads" for s in searches})
    lines.append("- predicted: `draftnas lookup` on each workload's search split (every third prompt held "
                 "out); measured: `draftnas bench --engine llama.cpp` on the held-out prompts (decode only); "
                 + "; ".join(hosts))
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
