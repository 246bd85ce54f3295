#!/usr/bin/env bash
# Prepare, on a machine that reaches PyPI, what a GPU box without registry access needs to
# run scripts/gpu_measure.sh: a wheelhouse of what its preinstalled Python (3.12 with torch,
# transformers, accelerate, safetensors, numpy, rich, typer, matplotlib) lacks, the embedded
# SmolLM2-135M GGUF split into parts of at most 60 MB (transfers are capped at 64 MiB a
# call), and healed drafters packed as plan + changed tensors (scripts/drafter_delta.py).
# Everything goes under .whl/gpu/ (git-ignored), one folder per transfer:
#   .whl/gpu/wheels  .whl/gpu/gguf-wheel  .whl/gpu/smollm2.partNN  .whl/gpu/drafters/NAME
#
#   bash scripts/gpu_prepare.sh [DRAFTER_FOLDER ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=.whl/gpu
mkdir -p "$OUT/wheels"
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$OUT/wheels" scipy gguf pytest pluggy iniconfig
mkdir -p "$OUT/gguf-wheel"  # the bench phase needs only gguf: a transfer of its own size
cp "$OUT"/wheels/gguf-*.whl "$OUT/gguf-wheel/"
GGUF=$("$PY" -c 'from draftnas.sources import EMBEDDED, locate_embedded_gguf; print(locate_embedded_gguf(EMBEDDED["smollm2-135m"]))')
rm -rf "$OUT"/smollm2.part*
for i in $(seq 0 9); do
    chunk="$OUT/smollm2.part$i"
    dd if="$GGUF" of="$chunk" bs=1M skip=$((i * 60)) count=60 status=none
    [ -s "$chunk" ] || { rm -f "$chunk"; break; }
done
sha256sum "$GGUF" | awk '{print $1}' > "$OUT/smollm2.sha256"
for folder in "$@"; do
    "$PY" scripts/drafter_delta.py pack "$folder" smollm2-135m "$OUT/drafters/$(basename "$folder")"
done
du -sh "$OUT"/* "$OUT"/drafters/* 2>/dev/null
