"""Where the main job's minutes went, read from logs of the README's first command run with stdout and
stderr to a file (not a terminal), as

    start=$(date +%s); bash scripts/setup.sh; echo SETUP_S $(( $(date +%s)-start ))
    draftnas search --target qwen2.5-coder-1.5b --trials 16 --export; echo TOTAL_S $(( $(date +%s)-start ))

under `/usr/bin/time -v`, `uptime` written first (the load before). Nothing is run: each figure is a line
the job printed (its `[draftnas 1m02s]` stage lines, the best trial, the calibration's summary) or one of
those the wrapper printed (set-up and total seconds, peak memory).

    python benchmarks/main_job_minutes.py before.log after.log --names before after --out minutes.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

STAGE = re.compile(r"^\[draftnas (?:(\d+)m)?(\d+)s\] (.*)$")
RANKED = re.compile(r"^\s+(\d+)\. trial (\d+) (?:\(([^)]*)\) )?(\S+): ([\d.]+) tokens/s, ([\d.]+)x predicted")


def seconds(minutes: str | None, secs: str) -> int:
    return int(minutes or 0) * 60 + int(secs)


def read_log(path: Path) -> dict[str, Any]:
    """One run's stages (seconds since the search started), set-up and total seconds, peak memory, load
    before, the best trial and the last ranking's top three."""
    lines = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    out: dict[str, Any] = {"log": path.name, "stage_end_s": {}}
    stages: dict[str, int] = out["stage_end_s"]
    ranking: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if "load average:" in line and "load_before" not in out:
            out["load_before"] = line.split("load average:")[1].strip()
        if m := re.match(r"^SETUP_S (\d+)", line):
            out["setup_s"] = int(m.group(1))
        if m := re.match(r"^TOTAL_S (\d+)", line):
            out["total_s"] = int(m.group(1))
        if m := re.search(r"Maximum resident set size \(kbytes\): (\d+)", line):
            out["peak_rss_gb"] = round(int(m.group(1)) / 1024 ** 2, 1)
        if m := STAGE.match(line):
            at, what = seconds(m.group(1), m.group(2)), m.group(3)
            if what.startswith("timing the target on this machine: started"):
                stages["calibration_start"] = at
            elif what.startswith("timing the target on this machine: done"):
                stages["calibration_end"] = at
            elif what.startswith("trials: started"):
                stages["trials_start"] = at
            elif what.startswith("trials: done"):
                stages["trials_end"] = at
            elif what.startswith("finished in"):
                stages.setdefault("search_end", at)
        if line.startswith("ranking after") or line.startswith("first ranking"):
            ranking = []
            for row in lines[i + 1:i + 4]:
                if r := RANKED.match(row):
                    ranking.append({"rank": int(r.group(1)), "trial": int(r.group(2)),
                                    "kind": r.group(3) or "", "candidate": r.group(4),
                                    "tokens_per_s": float(r.group(5)), "speedup": float(r.group(6))})
        if line.startswith("best: trial"):
            out["best"] = line[len("best: "):]
        if line.startswith("calibrated on this machine") and (m := re.search(r", (\d+) s\)", line)):
            out["calibration_timed_s"] = int(m.group(1))
            if d := re.search(r"target decode ([\d.]+) ms", line):
                out["target_decode_ms"] = float(d.group(1))
    out["last_ranking_top3"] = ranking
    if "total_s" in out and "setup_s" in out:
        out["search_and_export_s"] = out["total_s"] - out["setup_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path, help="logs of the README's first command, as above")
    parser.add_argument("--names", nargs="*", default=[], help="a name for each log (default: its file name)")
    parser.add_argument("--meta", type=Path, help="a JSON object of what the logs do not say (host, code)")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here too")
    args = parser.parse_args(argv)
    if args.names and len(args.names) != len(args.logs):
        parser.error(f"--names: {len(args.names)} names for {len(args.logs)} logs (allowed: one per log)")
    runs = []
    for i, path in enumerate(args.logs):
        run = read_log(path)
        run["name"] = args.names[i] if args.names else path.name
        runs.append(run)
        s = run["stage_end_s"]
        print(f"{run['name']}: total {run.get('total_s', '?')} s (set-up {run.get('setup_s', '?')} s), "
              f"calibration {s.get('calibration_start', '?')}-{s.get('calibration_end', '?')} s, "
              f"trials {s.get('trials_start', '?')}-{s.get('trials_end', '?')} s, "
              f"search ends {s.get('search_end', '?')} s; peak {run.get('peak_rss_gb', '?')} GB; "
              f"best {run.get('best', '?')}")
    if args.out:
        meta = json.loads(args.meta.read_text()) if args.meta else {}
        args.out.write_text(json.dumps({**meta, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
