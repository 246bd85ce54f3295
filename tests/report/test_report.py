"""`draftnas report`: Markdown + PNG plots rebuilt from a study's storage alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.report.study import write_report
from draftnas.search.evaluate import PriorEvaluator
from draftnas.search.loop import run_search
from tests.helpers import FakeMeasured, StubLatency, smol_options

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_of_an_assumed_acceptance_study_says_so(tmp_path):
    run_search(smol_options(tmp_path, n_trials=10, prior=0.7), StubLatency(), PriorEvaluator(0.7))
    files = write_report("t", str(tmp_path / "study.db"), tmp_path / "out")
    md = Path(files.markdown).read_text()
    assert files.acceptance_assumed and "Acceptance is ASSUMED, not measured" in md
    assert "| # | trial | candidate |" in md and md.count("\n| ") >= files.n_ranked + 1
    names = sorted(Path(p).name for p in files.plots)
    assert names == ["latency_vs_depth.png", "pareto.png", "speedup_vs_batch.png", "speedup_vs_gamma.png"]
    for p in files.plots:
        data = Path(p).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
        assert f"![{Path(p).name}]({Path(p).name})" in md


def test_report_of_a_measured_study_and_cli(tmp_path):
    run_search(smol_options(tmp_path, n_trials=8, sampler="random"), StubLatency(), FakeMeasured())
    out = subprocess.run([sys.executable, "-m", "draftnas", "report", "--study", "t", "--storage",
                          str(tmp_path / "study.db"), "--out", str(tmp_path / "rep"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["acceptance_assumed"] is False and len(data["plots"]) == 4  # speedup vs batch too
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "ASSUMED" not in md and "acceptance measured on target traces" in md


def test_report_of_a_missing_study_names_the_ones_there(tmp_path):
    run_search(smol_options(tmp_path, n_trials=1, prior=0.7), StubLatency(), PriorEvaluator(0.7))
    with pytest.raises(InvalidInputError, match=r"no study 'nope' .*studies there: t\)"):
        write_report("nope", str(tmp_path / "study.db"), tmp_path / "out")
