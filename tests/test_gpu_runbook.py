"""The GPU runbook's dry run: every phase on this CPU with tiny sizes, resumable, ending in one
summary JSON with the repeated benches as median, min and max, the replays and the weight formats; its plan
fits one loan and one command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def test_the_dry_run_walks_every_phase_and_a_second_call_resumes(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    first = subprocess.run(["bash", "scripts/gpu_measure.sh", "every"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=3600)  # a hang guard, not a speed goal
    assert first.returncode == 0, first.stdout + first.stderr
    phases = [line for line in first.stdout.splitlines() if line.startswith("[gpu] ") and " exit " in line]
    assert len(phases) == 16 and all(": exit 0 in " in line for line in phases), phases
    names = [line.split()[1].rstrip(":") for line in phases]
    assert names[:7] == ["setup", "batch-calibration", "replay-batched", "replay-qwen", "int4-cuda",
                         "replay-paper", "search-cuda"]
    assert names[-1] == "summary"  # every phase: the plan's, the extras, then the summary
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    bf16 = summary["benches"]["bench-bf16-smollm2-135m"]["speedup"]
    assert len(bf16["runs"]) == 3 and bf16["min"] <= bf16["median"] <= bf16["max"]
    assert [p["batch_size"] for p in summary["batched"]["points"]] == [1, 2]
    assert summary["profile-graph"]["mode"] == "static" and "gemma" in summary
    searched = summary["search_cuda"]["arms"]  # the search's prediction beside the bench of its export
    assert set(searched) == {"target", "draftnas"}
    assert all(r["measured_tokens_per_s"] > 0 for r in searched.values())
    assert (tmp_path / "out" / summary["search_cuda"]["winner"]).is_dir()  # exported in OUT, not the checkout
    assert set(summary["e2e"]["drafters"]) >= {"winner", "first-k"}
    replays = summary["replays"]  # the replay phases need no weights: each names its acceptance's source
    assert {"smollm2-135m-reference", "smollm2-135m-draftnas", "smollm2-135m-draftnas-int4",
            "paper-smollm2-135m-smollm2-135m"} <= set(replays)
    assert replays["smollm2-135m-reference"]["source"] == "bench"
    assert replays["smollm2-135m-draftnas-int4"]["draft_weights"] == "int4"  # the weights its shape names
    assert replays["smollm2-135m-draftnas-int4"]["dtype"] == "bf16"  # int4 keeps bf16 activations on any CPU
    assert summary["int4"]["smollm2-135m"]["decode_step_ms"]["int4"] > 0
    assert all(r["exact"] for r in replays.values())
    assert replays["paper-smollm2-135m-smollm2-135m"]["source"] == "rate"
    assert [p["batch_size"] for p in summary["replay_batched"]["points"]] == [1, 2]
    # the batched replay is priced by the batch-calibration's stored timings, not a profile
    batch = summary["batch_calibration"]
    assert batch["timed_batches"] == [2] and "calibration" in summary["replay_batched"]["profile"]
    assert all(p["time_split"] for p in summary["replay_batched"]["points"])
    pack = tmp_path / "back" / "out.tgz"
    pack.parent.mkdir()
    again = subprocess.run(["bash", "scripts/gpu_measure.sh", "tests", "batched"], cwd=ROOT,
                           env={**env, "PACK": str(pack)}, capture_output=True, text=True,
                           timeout=900)  # a hang guard: on the Zen 3 host this resume ran past 120 s
    assert again.returncode == 0 and again.stdout.count("done already") == 2, again.stdout
    import tarfile

    with tarfile.open(pack) as packed:  # everything OUT holds, in one file
        names = set(packed.getnames())
    assert {"out/summary.json", "out/phases.txt", "out/done/batched"} <= names


def test_the_plan_fits_one_loan_with_its_start_and_transfers():
    out = subprocess.run(["bash", "scripts/gpu_measure.sh", "budget"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stdout + out.stderr
    planned = int(out.stdout.split(" s of device time planned")[0].rsplit(" ", 1)[1])
    assert planned <= 720 and "start 120 s, transfers 30 s" in out.stdout  # of a 15-min loan, room to retry
    phases = int(out.stdout.split("its phases ")[1].split(" s")[0])
    assert phases <= 600  # they run in one command
