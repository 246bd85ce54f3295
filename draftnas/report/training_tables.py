"""The training figure tables of the docs: training runs, their fitted curves and the healing recipes
compared, each rendered from the results files it names (`report.pages`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from draftnas.drafter.training.distill_records import CurveCheck, TrainingCurve
from draftnas.report.tables import read_result


def _hosts(labels: Sequence[str]) -> str:
    """Host labels ("CPU, N threads, load A B C") said once per host, the loads of its runs after it."""
    loads: dict[str, list[str]] = {}
    for label in labels:
        host, _, load = label.partition(", load ")
        loads.setdefault(host, [])
        if load:
            loads[host].append(load)
    return "; ".join(host + (f", load {' / '.join(v)}" if v else "") for host, v in loads.items())


def _run_name(name: str) -> str:
    """A results file's run name: its file name without `.train.json` or `.json`."""
    return Path(name).name.removesuffix(".json").removesuffix(".train")


def curves_table(root: Path, files: Sequence[str]) -> list[str]:
    """`distill curve` results: per shape, the fitted log-linear curve and its check at the largest budget
    (a fit made without that budget, against the reading there)."""
    lines = ["| shape | base, layers | fit: tokens/step | slope, 95% | largest budget | predicted there "
             "| measured | error on the gain over 1 |",
             "|---|---|---|---|---|---|---|---|"]
    hosts = set()
    for f in files:
        for c in read_result(root, f)["curves"]:
            hosts.add(str(c.get("host", "")))
            curve = TrainingCurve.from_dict(c)
            check = c["check"]
            interval = curve.slope_interval()
            slope = "-" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]" + \
                ("" if curve.measurable_slope else ": no measurable slope")
            lines.append(f"| {c['label']} | {c['base']}, {','.join(map(str, c['layers']))} | "
                         f"{c['intercept']:.3f} + {c['slope']:.4f} ln T (from {c['fitted_from']:,}) | "
                         f"{slope} | {check['tokens']:,} | {check['predicted']:.3f} | "
                         f"{check['measured']:.3f} | {CurveCheck.from_dict(check).error:+.1%} |")
    lines += ["", f"- tokens per step at each run's γ on held-out prompts; the check's error is on the gain "
              f"over one token per step; {_hosts(sorted(hosts))}; from {', '.join(f'`{f}`' for f in files)}"]
    return lines


def training_table(root: Path, files: Sequence[str]) -> list[str]:
    """Training runs: base, layers, budget, speed and the held-out readings before and after."""
    lines = ["| run | base, layers | head rows | trained tokens | tokens/s | held-out top-1 | tokens/step |",
             "|---|---|---|---|---|---|---|"]
    hosts = set()
    for f in files:
        d = read_result(root, f)
        first, last = d["readings"][0], d["readings"][-1]
        hosts.add(str(d["host"]))
        speed = d["trained_tokens"] / max(d["train_s"], 1e-9)  # train_s: the run's, over its resumes
        lines.append(f"| {_run_name(f)} | {d['base']}, {','.join(map(str, d['layers']))} | "
                     f"{d['head_rows']} | {d['trained_tokens']:,} | {speed:,.0f} | "
                     f"{first['top1_agreement']:.3f} -> {last['top1_agreement']:.3f} | "
                     f"{first['tokens_per_step']:.3f} -> {last['tokens_per_step']:.3f} |")
    lines += ["", f"- {_hosts(sorted(hosts))}; from {', '.join(f'`{f}`' for f in files)}"]
    return lines


def heal_recipes_table(root: Path, files: Sequence[str]) -> list[str]:
    """`benchmarks/export_heal_data.py`: one drafter healed by each recipe (written prompts, teacher, steps)
    from the same pruned weights, read on the same held-out prompts."""
    lines = ["| written prompts | teacher | steps | training sequences | making the data | training "
             "| held-out top-1 | tokens/step, γ = 4 |", "|---|---|---|---|---|---|---|---|"]
    (name,) = files
    d = read_result(root, name)
    for r in d["rows"]:
        teacher = f"top-{r['teacher_topk']}" if r["teacher_topk"] else "live target"
        lines.append(f"| {r['written_prompts']} | {teacher} | {r['steps']} | {r['train_sequences']} | "
                     f"{r['data_s']:.0f} s | {r['train_s']:.0f} s | {r['top1_before']:.3f} -> "
                     f"{r['top1_after']:.3f} | {r['tokens_per_step_g4_after']:.3f} |")
    host = d["host"]
    lines += ["", f"- {d['plan']} from {d['target']}, {r['heldout_sequences']} held-out sequences "
                  f"({r['heldout_positions']} positions); {host['cpu']}, {host['threads']} threads, load "
                  f"{host['load_average']}; from `{name}`"]
    return lines
