"""CLI behaviour through a real subprocess: exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "draftnas", *args],
                          capture_output=True, text=True, timeout=120)


def test_predict_json_issue_example():
    out = run("predict", "--acceptance", "0.8", "--gamma", "4", "--draft-ms", "2",
              "--target-ms", "20", "--verify-ms", "22", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert round(data["tokens_per_step"], 4) == 3.3616
    assert data["speedup"] == pytest.approx(2.24107, rel=1e-5)


def test_predict_picks_best_gamma():
    out = run("predict", "-a", "0.8", "--draft-ms", "2", "--target-ms", "20",
              "--verify-ms", "22", "--json")
    assert json.loads(out.stdout)["gamma"] == 6


@pytest.mark.parametrize("args,needle", [
    (["predict", "-a", "1.5", "--draft-ms", "1", "--target-ms", "3"],
     "--acceptance must be in [0, 1], got 1.5"),
    (["predict", "-a", "0.5", "-g", "-1", "--draft-ms", "1", "--target-ms", "3"],
     "--gamma must be in [0, 64]"),
    (["inspect", "/does/not/exist.gguf"], "GGUF file not found"),
    (["inspect", "lama-65b"], "llama-65b"),
    (["bench", "-t", "smollm2-135m", "-d", "x", "--batch-size", "1,two"], "'two' is not a whole number"),
    (["bench", "-t", "smollm2-135m", "-d", "x", "--batch-size", "0,2"], "--batch-size must be in [1, 1024]"),
    (["bench", "-t", "smollm2-135m", "-d", "x", "--batch-size", "1,2", "--temperature", "0.5"],
     "--batch-size runs greedy decoding only"),
])
def test_bad_input_one_line_exit_2(args, needle):
    out = run(*args)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("args,needle", [
    (["search", "--target", "smollm2-135m", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["search", "--target", "smollm2-135m", "--calibration", "{dir}/corrupt.json"],
     "corrupt.json: not a readable calibration"),
    (["bench", "-t", "smollm2-135m", "-d", "x", "--rounds", "0"], "--rounds must be in [1, 100]"),
    (["bench", "-t", "smollm2-135m", "-d", "x", "--predictions", "{dir}/corrupt.json"],
     "not a search's predictions"),
    (["bench", "-t", "smollm2-135m", "-d", "smollm2-135m", "--replay", "{dir}/corrupt.json"],
     "--replay '{dir}/corrupt.json' is not JSON"),
    (["bench", "-t", "smollm2-135m", "-d", "qwen2.5-coder-0.5b", "--replay", "alpha=0.5"],
     "more than the target smollm2-135m's vocabulary"),
    (["bench", "-t", "smollm2-135m", "-d", "smollm2-135m,head=9", "--replay", "alpha=0.5", "--device", "cpu",
      "--draft-weights", "int4", "--reference", "x"], "--replay replays one drafter's greedy counts"),
    (["bench", "-t", "smollm2-135m", "-d", "smollm2-135m", "--replay-drafter", "reference"],
     "--replay-drafter names a trace of --replay's file"),
    (["search", "--target", "smollm2-135m", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["search", "--target", "qwen2.5-coder-1.5b", "--batch", "1000000"],
     "--batch of 1000000 sequences of"),
    (["distill", "train", "{dir}/data", "--out", "{dir}/run", "--lr", "nan"],
     "--lr must be a number, got nan"),
    (["distill", "export", "{dir}/run", "{dir}/out", "--gguf", "Q9_9"],
     "--gguf 'Q9_9' is not a llama.cpp quant type"),
    (["bench", "-t", "smollm2-135m", "-d", "lookup:n=4,m=4"],
     "--draft lookup:n=4,m=4 is a lookup drafter: in draftnas's loop give lookup settings as --lookup"),
    (["bench", "-t", "smollm2-135m", "-d", "lookup:n=2,m=4+smollm2-135m", "--engine", "vllm"],
     "a hybrid drafter does not run in vllm (it runs in static, llama.cpp)"),
    (["bench", "-t", "smollm2-135m", "-d", "smollm2-135m", "-r", "head:{dir}/head"],
     "--reference head:{dir}/head: in draftnas's loop a head is the benched drafter (--draft); references "
     "are model drafters"),
    (["bench", "-t", "smollm2-135m", "-d", "head:{dir}/head", "--batch-size", "1,2"],
     "a head is benched one request at a time in draftnas's loop (leave out --batch-size"),
])
def test_bad_calibration_threads_rounds_or_predictions_are_one_line_and_write_nothing(tmp_path, args, needle):
    (tmp_path / "corrupt.json").write_text('{"format": 1, "host"')
    out = subprocess.run([sys.executable, "-m", "draftnas", *(a.format(dir=tmp_path) for a in args)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and needle.format(dir=tmp_path) in lines[0], out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.json"]  # no runs/, nothing else


def test_e2e_refuses_an_unknown_tuned_domain_before_writing_anything(tmp_path):
    out = run("e2e", "--tuned-domain", "poetry", "--out", str(tmp_path / "run"))
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    allowed = "(allowed: chat, translation, code, math, or none)"
    assert f"--tuned-domain 'poetry' is not a domain {allowed}" in lines[0]
    assert not (tmp_path / "run").exists()


def test_targets_json_lists_llama_65b():
    data = {a["name"]: a for a in json.loads(run("targets", "--json").stdout)}
    assert data["llama-65b"]["num_hidden_layers"] == 80
    assert data["llama-65b"]["hidden_size"] == 8192
    assert data["smollm2-135m"]["embedded_weights"] is True


def test_cli_import_and_the_torch_free_commands_do_not_load_torch():
    code = "import sys, draftnas.cli, draftnas.core.throughput; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False"
    for args in (["targets", "--json"], ["predict", "-a", "0.7", "--draft-ms", "2", "--target-ms", "20"]):
        command = ("import sys, runpy; sys.argv = ['draftnas', *sys.argv[1:]]\n"
                   "try:\n    runpy.run_module('draftnas', run_name='__main__')\n"
                   "except SystemExit:\n    pass\n"
                   "print('torch loaded' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
        ran = subprocess.run([sys.executable, "-c", command, *args], capture_output=True, text=True)
        assert ran.stderr.strip().endswith("no torch"), (args, ran.stderr[-500:])


def test_inspect_registry_shape_without_weights():
    data = json.loads(run("inspect", "llama-65b", "--json").stdout)
    assert data["weights_here"] is False and data["parameters"] > 65e9


def test_one_json_convention_for_every_command():
    """--json is a flag that prints JSON; a file is only ever written by --out-json PATH."""
    import typer

    from draftnas.cli import app

    group = typer.main.get_command(app)  # typer's own click group: read its commands duck-typed
    with_json = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if "--json" in getattr(param, "opts", []):
                assert getattr(param, "is_flag", False), f"{name}: --json takes a value"
                with_json.append(name)
            if "--out-json" in getattr(param, "opts", []):
                assert not getattr(param, "is_flag", False), f"{name}: --out-json needs a path"
    assert {"bench", "search", "e2e", "profile", "targets"} <= set(with_json)


@pytest.mark.parametrize("command", ["export", "bench", "search", "profile", "heal", "e2e"])
def test_help_reads_as_sentences(command):
    text = run(command, "--help").stdout
    assert "<bool>" not in text  # flags are flags
    assert not re.search(r" \.(\s|$)", text) and "Usage:" in text  # no "Trial number ." left
    if command == "export":
        from draftnas.export.records import (
            DEFAULT_EXPORT_HEAL_STEPS,
            EXPORT_TEACHER_TOPK,
            EXPORT_WRITTEN_PROMPTS,
        )

        assert "(default: the best)" in text and "--heal-steps" in text
        flat = " ".join(text.replace("│", " ").split())
        assert (f"Default: {DEFAULT_EXPORT_HEAL_STEPS} (toward the target's top-{EXPORT_TEACHER_TOPK}, "
                f"on the workload's prompts and {EXPORT_WRITTEN_PROMPTS} more") in flat


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal where CUDA is absent")
@pytest.mark.parametrize("args", [
    ["trace", "-t", "smollm2-135m", "-o", "{tmp}/traces.safetensors"],
    ["heal", "--plan", "{tmp}/plan.json", "--out", "{tmp}/healed"],
    ["search", "-t", "smollm2-135m", "--trials", "1", "--run-dir", "{tmp}/runs"],
    ["export", "--plan", "{tmp}/plan.json", "--out", "{tmp}/exported"],
    ["e2e", "--out", "{tmp}/e2e"],
])
def test_device_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, args):
    """Every stage takes --device cuda; where torch sees no GPU it is refused before any work."""
    out = run(*(a.format(tmp=tmp_path) for a in args), "--device", "cuda")
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "--device cuda asked for" in lines[0] and "use cpu" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change,flags,needle", [
    ({"weights": ["dense", "int8"]}, ["--profile", "h100-bf16-eager"],
     "priced on cuda (profile h100-bf16-eager (NVIDIA H100 80GB HBM3, measured, bf16)): int8 weights: int8 "
     "multiplies on the CPU only; on CUDA draftnas runs int4 or dense layers"),
    ({"weights": ["dense", "int4"]}, ["--profile", "h100-sxm", "--dtype", "fp16"],
     "int4 weights on CUDA multiply bf16 activations only, not fp16: use --dtype bf16"),
    ({"weights": ["dense", ["int8", "int4"]]}, [],
     "weights[1]: ['int8', 'int4'] lists 2 formats: a per-layer format lists one for each of attn, mlp, "
     "head"),
    ({"vocab": {"sizes": ["full", 200000]}}, [],
     "vocab.sizes: 200000 rows but base qwen2.5-coder-0.5b's vocabulary has 151936"),
])
def test_a_space_with_formats_or_heads_it_cannot_have_is_one_line_and_writes_nothing(tmp_path, change, flags,
                                                                                      needle):
    import yaml

    from draftnas.search.spaces import shipped_spaces

    space = {**yaml.safe_load(shipped_spaces()["qwen2.5-coder-1.5b"].read_text()), **change}
    folder = tmp_path / "work"
    folder.mkdir()
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    out = subprocess.run([sys.executable, "-m", "draftnas", "search", "--target", "qwen2.5-coder-1.5b",
                          "--space", str(tmp_path / "space.yaml"), "--acceptance-prior", "0.7", *flags],
                         capture_output=True, text=True, timeout=300, cwd=folder)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
    assert list(folder.iterdir()) == []  # no runs/, nothing else


def test_int4_weights_on_cuda_outside_bf16_and_int8_on_cuda_are_one_line():
    for weights, needle in (("int4", "int4 weights on CUDA multiply bf16 activations only, not fp32"),
                            ("int8", "int8 multiplies on the CPU only")):
        out = run("bench", "-t", "smollm2-135m", "-d", "x", "--device", "cuda", "--draft-weights", weights)
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert needle in lines[0], lines[0]
