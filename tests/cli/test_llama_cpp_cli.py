"""`--engine llama.cpp` and `--format gguf`: a user's mistake is one line, exit 2, nothing written; where a
llama.cpp build exists (`draftnas engines --build`) a written drafter loads and drafts in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.test_llama_cpp import _tokenizer_gguf


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "draftnas", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def one_line(out: subprocess.CompletedProcess[str], needle: str) -> None:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            [
                "search",
                "--target",
                "qwen2.5-coder-1.5b",
                "--engine",
                "llama.cpp",
                "--space",
                "qwen2.5-coder-1.5b",
            ],
            "llama.cpp loads only drafters with the target's full vocabulary",
        ),
        (
            [
                "search",
                "--target",
                "qwen2.5-coder-1.5b",
                "--engine",
                "llama.cpp",
                "--llama-cpp",
                "{dir}/nothing",
            ],
            "--llama-cpp {dir}/nothing: no llama-bench in it",
        ),
        (
            ["search", "--target", "qwen2.5-coder-1.5b", "--space", "qwen2.5-coder-1.5b-llama-cpp"],
            "--engine is static, but search space 'qwen2.5-coder-1.5b-llama-cpp' offers GGUF weights (Q8_0, "
            "Q4_0), which run in llama.cpp only: give llama.cpp",
        ),
        (
            [
                "export",
                "--out",
                "{dir}/out",
                "--plan",
                "{dir}/plan.json",
                "--format",
                "gguf",
                "--quant",
                "Q3_0",
            ],
            "--quant 'Q3_0' is not a llama.cpp quant type",
        ),
        (
            ["export", "--out", "{dir}/out", "--plan", "{dir}/plan.json", "--quant", "Q8_0"],
            "--quant is the GGUF's type: set --format gguf",
        ),
        (["profile", "--engine", "llama.cpp", "--model", "{dir}/missing.gguf"], "does not exist"),
    ],
)
def test_llama_cpp_mistakes_are_one_line_and_write_nothing(tmp_path, args, needle):
    out = run(tmp_path, *(a.format(dir=tmp_path) for a in args), env={"DRAFTNAS_LLAMA_CPP": ""})
    one_line(out, needle.format(dir=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_drafter_with_another_vocabulary_is_refused_before_llama_cpp_runs(tmp_path):
    other = _tokenizer_gguf(tmp_path / "other.gguf", [f"t{i}" for i in range(512)])
    out = run(
        tmp_path,
        "bench",
        "-t",
        "qwen2.5-coder-1.5b",
        "-d",
        str(other),
        "--engine",
        "llama.cpp",
        "--no-hf",
        env={"DRAFTNAS_LLAMA_CPP": str(tmp_path / "no-build")},
    )
    one_line(out, f"drafter {other} cannot draft for")
    assert "512 tokens against the target's 151936" in out.stderr


def test_missing_or_broken_build_is_one_line(tmp_path):
    from tests.models.test_llama_cpp import fake_build

    broken = fake_build(tmp_path / "broken", version_exit=1)
    out = run(
        tmp_path,
        "bench",
        "-t",
        "qwen2.5-coder-1.5b",
        "-d",
        "qwen2.5-coder-0.5b",
        "--engine",
        "llama.cpp",
        "--llama-cpp",
        str(broken),
    )
    one_line(out, "is broken: llama-bench --version exited 1")
    out = run(tmp_path, "engines", "--json", env={"DRAFTNAS_LLAMA_CPP": str(tmp_path / "none")})
    rows = {r["engine"]: r for r in __import__("json").loads(out.stdout)}
    assert out.returncode == 0 and set(rows) == {"static", "hf", "llama.cpp", "vllm"}
    assert not rows["llama.cpp"]["ready"] and "no llama-bench" in rows["llama.cpp"]["where"]
