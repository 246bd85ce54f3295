"""A non-editable install finds its package data: the wheel, installed into a fresh virtualenv, lists
the targets and runs a latency-only search from the shipped profiles and search spaces."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_the_installed_wheel_finds_its_profiles_and_search_spaces(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(wheels)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies come from this interpreter's site-packages (appended after the venv's own, so
    # the wheel's draftnas is the one imported; .pth files there, an editable draftnas's included,
    # are not read)
    (Path(purelib) / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    wheel = next(wheels.glob("draftnas-*.whl"))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "-q", str(wheel)], capture_output=True, text=True)
    if install.returncode != 0:  # a pip without --python: unpack the wheel as an installer would
        import zipfile

        zipfile.ZipFile(wheel).extractall(purelib)
    work = tmp_path / "elsewhere"  # not the checkout: nothing found by walking up from it
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DRAFTNAS_PROFILES")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-m", "draftnas", *args], capture_output=True, text=True,
                              cwd=work, env=env)

    where = subprocess.run([str(python), "-c", "import draftnas; print(draftnas.__file__)"],
                           capture_output=True, text=True, cwd=work, env=env).stdout
    assert where.startswith(purelib), where  # the installed copy, not the checkout
    targets = run("targets", "--json")
    assert targets.returncode == 0, targets.stderr[-2000:]
    assert "llama-65b" in {a["name"] for a in json.loads(targets.stdout)}
    search = run("search", "--target", "llama-65b", "--base-shape", "llama-7b", "--acceptance-prior", "0.7",
                 "--trials", "20", "--json")
    assert search.returncode == 0, search.stderr[-3000:]
    result = json.loads(search.stdout)
    assert result["ranked"] and result["counts"].get("COMPLETE", 0) + result["counts"].get("PRUNED", 0) == 20
