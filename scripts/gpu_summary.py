"""The GPU runbook's last phase: one JSON of every figure its phases wrote under OUT.

Repeated benches are reported as median, min and max with every run listed, so a run that
contradicts the others stays in view. Replays (`bench --replay`) are medians over prompts with their
intervals, each marked with the source of its acceptance (a stand-in says so in its note). Weight formats
(`benchmarks/weight_formats.py`): each shape's decode step and products, dense against int4.

    python scripts/gpu_summary.py OUT
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def summarize(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {"phases": (out / "phases.txt").read_text().splitlines()
                               if (out / "phases.txt").is_file() else []}
    for name in ("profile-graph", "profile-static"):
        path = out / f"{name}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            summary[name] = {k: data.get(k) for k in ("device_name", "mode", "dtype", "heldout_mape")}
    benches: dict[str, dict[str, list[Any]]] = {}
    for path in sorted(out.glob("bench-*.json")):
        data = json.loads(path.read_text())
        key = path.stem.rsplit("-", 1)[0]  # bench-DTYPE-DRAFTER
        arms = {a["name"]: a for a in data["arms"]}
        row = benches.setdefault(key, {"speedup": [], "exact_match_rate": [], "target_tokens_per_s": []})
        row["speedup"].append(arms["draftnas"]["speedup"])
        row["exact_match_rate"].append(arms["draftnas"].get("exact_match_rate"))
        row["target_tokens_per_s"].append(arms["target"]["tokens_per_s"])
    summary["benches"] = {k: {"speedup": _spread(v["speedup"]), "exact_match_rate": v["exact_match_rate"],
                              "target_tokens_per_s": _spread(v["target_tokens_per_s"])}
                          for k, v in benches.items()}
    if (out / "gemma.json").is_file():
        data = json.loads((out / "gemma.json").read_text())
        summary["gemma"] = {a["name"]: {"tokens_per_s": a["tokens_per_s"], "speedup": a.get("speedup"),
                                        "exact_match_rate": a.get("exact_match_rate")} for a in data["arms"]}
    if (out / "batched.json").is_file():
        data = json.loads((out / "batched.json").read_text())
        summary["batched"] = {
            "points": [{"batch_size": p["batch_size"], "target_tokens_per_s": p["target_tokens_per_s"],
                        "speedup": p["speedup"], "predicted_speedup": p["predicted_speedup"]}
                       for p in data["points"]],
            "measured_crossover": data["measured_crossover"],
            "predicted_crossover": data["predicted_crossover"], "profile": data["profile"]}
    if (out / "batch-calibration.json").is_file():  # search --batch: the break-even batch from timed batches
        data = json.loads((out / "batch-calibration.json").read_text())
        best = (data.get("ranked") or [{}])[0]  # ranked best first
        economics = best.get("economics") or {}
        summary["batch_calibration"] = {
            "target": data["info"]["target"], "candidate": (best.get("candidate") or {}).get("name"),
            "crossover_batch": economics.get("crossover_batch"),
            "timed_batches": economics.get("timed_batches"), "profile_note": data.get("profile_note")}
    replays = {}
    for path in sorted(out.glob("replay-*.json")):  # replay-batched.json is a batched result
        data = json.loads(path.read_text())
        if "points" in data:
            summary["replay_batched"] = {
                "target": data["target"], "drafters": data["drafters"], "replay": data["replay"],
                "points": [{"batch_size": p["batch_size"], "speedup": p["speedup"],
                            "speedup_runs": p.get("speedup_runs"), "time_split": p.get("time_split"),
                            "predicted_speedup": p["predicted_speedup"]} for p in data["points"]],
                "measured_crossover": data["measured_crossover"],
                "predicted_crossover": data["predicted_crossover"], "profile": data["profile"]}
            continue
        replays[path.stem.removeprefix("replay-")] = {
            k: data.get(k) for k in (
                "target", "drafter", "draft_weights", "head_rows", "source", "note", "gamma", "device",
                "dtype", "exact", "tokens_per_step", "target_tokens_per_s", "tokens_per_s", "speedup",
                "speedup_interval", "predicted_speedup", "profile")}
    if replays:
        summary["replays"] = replays
    int4 = {}
    for path in sorted(out.glob("int4-*.json")):  # benchmarks/weight_formats.py: dense against int4
        data = json.loads(path.read_text())
        int4[data["arch"]] = {k: data.get(k) for k in ("device", "gpu", "dtype", "decode_step_ms",
                                                       "over_dense_decode", "head_product_ms")}
        int4[data["arch"]]["layer_products_ms_1_row"] = data["layer_products_ms_by_rows"]["1"]
    if int4:
        summary["int4"] = int4
    if (out / "search-cuda.json").is_file() and (out / "search-cuda-bench.json").is_file():
        searched, benched = (json.loads((out / f"{n}.json").read_text())
                             for n in ("search-cuda", "search-cuda-bench"))
        summary["search_cuda"] = search_against_bench(searched, benched)
    if (out / "e2e.json").is_file():
        data = json.loads((out / "e2e.json").read_text())
        summary["e2e"] = {
            "wall_s": data["wall_s"], "target_tokens_per_s": data["target_tokens_per_s"],
            "target_predicted_tokens_per_s": data["target_predicted_tokens_per_s"],
            "drafters": {r["role"]: {g: {"predicted_speedup": r["predicted"][g]["speedup"],
                                         "measured_speedup": m["speedup"], "lossless": m["lossless"]}
                                     for g, m in r["measured"].items() if g in r["predicted"]}
                         for r in data["rows"]}}
    return summary


def search_against_bench(search: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    """The calibrated search's predicted tokens/s for the target alone and its winner beside what the
    bench of the exported winner measured (the prediction at the export's gamma, as exported)."""
    said = search["export"]["record"]["prediction"]
    arms = {a["name"]: a for a in bench["arms"]}
    predicted = {"target": said["baseline_tokens_per_s"], "draftnas": said["tokens_per_s"]}
    rows = {}
    for arm, said in predicted.items():
        measured = arms[arm]["tokens_per_s"]
        rows[arm] = {"predicted_tokens_per_s": said, "measured_tokens_per_s": measured,
                     "error_pct": 100.0 * (said - measured) / measured if measured else None}
    return {"winner": search["export"]["folder"], "dtype": search["info"]["dtype"],
            "calibration": search.get("profile_note"), "gamma": bench["gamma"], "arms": rows,
            "measured_speedup": arms["draftnas"].get("speedup")}


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python scripts/gpu_summary.py OUT (the runbook's output folder)")
    out = Path(sys.argv[1])
    summary = summarize(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
