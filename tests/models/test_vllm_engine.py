"""vLLM in an environment of its own: found with its version checked or one line naming the install command,
and, where it is installed (CI installs it), the families' vLLM settings run in it losslessly with its
acceptance counters read back. Elsewhere the real-engine test skips, saying how to install it."""

from __future__ import annotations

import json
import stat

import pytest

from draftnas.models.vllm_engine import INSTALL_HINT, VllmError, check_version, find_vllm, vllm_root
from tests.helpers import installed_vllm, needs_vllm


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


@needs_vllm
def test_the_families_vllm_settings_run_lossless_in_vllm_with_counters():
    """SmolLM2-135M in vLLM (fp32, greedy): alone, with the lookup family's config and with the model
    family's (the target as its own drafter, so every draft is accepted): the same tokens each time, and
    vLLM's counters add up."""
    from transformers import AutoTokenizer

    from draftnas.drafter.families import parse_drafter
    from draftnas.models.sources import ensure_local_folder
    from draftnas.models.vllm_engine import run_vllm

    vllm = installed_vllm()
    assert vllm is not None
    folder = str(ensure_local_folder("smollm2-135m")[1])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"
    prompt = list(tokenizer(text)["input_ids"])
    job = {"model": folder, "prompts": [prompt], "max_tokens": 24, "rounds": 1, "max_model_len": 512,
           "kv_cache_gb": 1, "ignore_eos": True}
    alone = run_vllm(vllm, job | {"speculative_config": None})
    lookup = run_vllm(vllm, job | {"speculative_config": parse_drafter("lookup:n=2,m=4").settings("vllm", 0)})
    model = run_vllm(vllm, job | {"speculative_config": parse_drafter(folder).settings("vllm", 3,
                                                                                        draft_folder=folder)})
    tokens = alone["rounds"][0][0]["tokens"][0]
    assert len(tokens) == 24 and alone["vllm"] == vllm.version
    assert lookup["rounds"][0][0]["tokens"][0] == tokens == model["rounds"][0][0]["tokens"][0]
    c = model["counters"]
    assert c["num_drafts"] > 0 and c["num_accepted_tokens"] == c["num_draft_tokens"] == 3 * c["num_drafts"]
    assert sum(c["accepted_per_pos"]) == c["num_accepted_tokens"] and len(c["accepted_per_pos"]) == 3
    assert lookup["counters"]["num_drafts"] > 0  # the prompt repeats itself: lookup finds matches
