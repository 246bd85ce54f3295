"""vLLM in an environment of its own: found with its version checked, or one line naming the install command.
The engine itself runs in tests/bench/test_vllm_bench.py (where vLLM is installed; CI installs it)."""

from __future__ import annotations

import json
import stat

import pytest

from draftnas.models.vllm_engine import INSTALL_HINT, VllmError, check_version, find_vllm, vllm_root


def _fake_python(tmp_path, body: str):
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_no_install_is_one_line_naming_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTNAS_CACHE", str(tmp_path))
    monkeypatch.delenv("DRAFTNAS_VLLM_PYTHON", raising=False)
    with pytest.raises(VllmError, match=f"not installed.*`{INSTALL_HINT}`"):
        find_vllm()


def test_a_version_outside_the_supported_range_is_refused(tmp_path):
    assert check_version("0.32.0") == "0.32.0"
    with pytest.raises(VllmError, match=r"vLLM 0\.31\.0 is outside the versions draftnas drives "
                                        r"\(0\.32\.x\)"):
        check_version("0.31.0")
    with pytest.raises(VllmError, match="0.40.1 is outside"):
        find_vllm(_fake_python(tmp_path, "echo 0.40.1; echo cpu"))


def test_a_python_without_vllm_is_one_line(tmp_path):
    wanted = f"cannot import vllm \\(ModuleNotFoundError: No module named 'vllm'\\); `{INSTALL_HINT}`"
    with pytest.raises(VllmError, match=wanted):
        find_vllm(_fake_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2; exit 1"))


def test_an_install_is_found_through_its_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTNAS_CACHE", str(tmp_path))
    monkeypatch.delenv("DRAFTNAS_VLLM_PYTHON", raising=False)
    root = vllm_root("cpu")
    root.mkdir(parents=True)
    stamp = {"python": "/x/python", "version": "0.32.0", "device": "cpu"}
    (root / "installed.json").write_text(json.dumps(stamp))
    monkeypatch.setattr("draftnas.models.vllm_engine._device", lambda: "cpu")
    found = find_vllm()
    assert (str(found.python), found.version, found.device) == ("/x/python", "0.32.0", "cpu")
