"""The GPU machine's situation on CPU: no registry, only what it has installed plus the wheelhouse
`scripts/gpu_prepare.sh` fills. A fresh virtualenv sees this environment's packages minus every
distribution the wheelhouse is meant to bring (and draftnas, which the GPU scripts import from the
working tree), installs the wheelhouse with --no-index, then runs the entry points of the bench,
profile and search phases."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _top_levels(dist: md.Distribution) -> set[str]:
    return {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}


def _machine_view(dest: Path, brought: set[str]) -> Path:
    """A folder of links to every entry of this environment's site-packages except the files of the
    distributions in `brought` (and draftnas's): what the GPU machine has installed."""
    site = Path(sysconfig.get_paths()["purelib"])
    hidden: set[str] = set()
    for dist in md.distributions():
        name = _norm(dist.metadata["Name"] or "")
        if name in brought or name == "draftnas":
            hidden |= _top_levels(dist)
    dest.mkdir()
    for entry in site.iterdir():
        if entry.name not in hidden and not entry.name.startswith("__editable__") and entry.suffix != ".pth":
            (dest / entry.name).symlink_to(entry)
    return dest


def test_the_gpu_phases_run_from_the_machines_packages_and_the_wheelhouse_alone(tmp_path):
    wheels = tmp_path / "wheels"
    env = {**os.environ, "GPU_PYTHON_VERSION": f"{sys.version_info.major}.{sys.version_info.minor}",
           "PYTHON": sys.executable}
    made = subprocess.run(["bash", "scripts/gpu_prepare.sh", "wheels", str(wheels)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if made.returncode != 0 and "Could not find a version" in made.stderr + made.stdout:
        pytest.skip("no package index reachable to fill the wheelhouse")
    assert made.returncode == 0, made.stderr
    brought = {_norm(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
    assert {"optuna", "scipy", "gguf", "sqlalchemy"} <= brought
    preinstalled = {_norm(line) for line in (ROOT / "scripts/gpu_preinstalled.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#")}
    assert not brought & preinstalled  # the machine's own builds (torch, numpy, ...) are never shadowed

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    venv_site = Path(subprocess.run([python, "-c", where], capture_output=True, text=True,
                                    check=True).stdout.strip())
    view = _machine_view(tmp_path / "machine", brought)
    (venv_site / "machine.pth").write_text(f"{view}\n")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                    str(site), *map(str, wheels.glob("*.whl"))], check=True, timeout=300)
    run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_env |= {"PYTHONPATH": f"{site}:{ROOT}", "HF_HUB_OFFLINE": "1"}

    def draftnas(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, "-m", "draftnas", *args], cwd=tmp_path, env=run_env,
                              capture_output=True, text=True, timeout=600)

    search = draftnas("search", "--target", "llama-65b", "--base-shape", "llama-7b", "--acceptance-prior",
                      "0.7", "--trials", "6", "--run-dir", str(tmp_path / "runs"))
    assert search.returncode == 0, search.stderr[-2000:]
    profile = draftnas("profile", "--device", "cpu", "--mode", "static", "--target", "smollm2-135m",
                       "--layers", "1,2", "--batch-sizes", "1", "--max-gamma", "1", "--context", "16",
                       "--repeats", "3", "--out", str(tmp_path / "p.json"))
    assert profile.returncode == 0, profile.stderr[-2000:]
    bench = draftnas("bench", "--target", "smollm2-135m", "--draft", "smollm2-135m", "--engine", "static",
                     "--gamma", "2", "--max-new-tokens", "4", "--per-domain", "1", "--prompts", "chat",
                     "--no-hf", "--no-hf-routed", "--json")
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert '"draftnas"' in bench.stdout
