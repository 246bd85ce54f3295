"""The GPU runbook's dry run: every phase on this CPU with tiny sizes, resumable, ending in one
summary JSON with the repeated benches as median, min and max."""

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
    first = subprocess.run(["bash", "scripts/gpu_measure.sh", "all"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=3600)  # a hang guard, not a speed goal
    assert first.returncode == 0, first.stdout + first.stderr
    phases = [line for line in first.stdout.splitlines() if line.startswith("[gpu] ")]
    assert len(phases) == 11 and all(": exit 0 in " in line for line in phases), phases
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
    again = subprocess.run(["bash", "scripts/gpu_measure.sh", "tests", "batched"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.count("done already") == 2, again.stdout
