#!/usr/bin/env bash
# Prepare here (a machine that reaches PyPI) what the GPU machine needs to run scripts/gpu_measure.sh.
# That machine reaches no registry: it has Python 3.12 with the packages listed in
# scripts/gpu_preinstalled.txt, and takes at most 64 MiB per transfer. Everything goes under
# .whl/gpu/ (git-ignored), one folder per transfer:
#   wheels      every wheel draftnas's GPU phases import that the machine lacks (optuna and its
#               dependencies, scipy, gguf, pytest), for CPython 3.12 on manylinux x86_64
#   smollm2.NN  the embedded SmolLM2-135M GGUF in parts of at most 60 MB, with its sha256
#   gemma3.NN   the embedded Gemma-3-270M GGUF, likewise
#   drafters/X  each drafter folder given, packed as plan + changed tensors (scripts/drafter_delta.py)
#
#   bash scripts/gpu_prepare.sh [wheels] [models] [DRAFTER_FOLDER ...]   (no argument: wheels models)
#   bash scripts/gpu_prepare.sh wheels DIR    only the wheelhouse, into DIR
#   (GPU_PYTHON_VERSION=3.11 builds it for another Python, as tests/test_gpu_wheelhouse.py does)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=.whl/gpu
PART_MB=${PART_MB:-60}  # smaller parts leave room for the wheels in one transfer

wheels() {  # wheels DIR: the wheelhouse, minus what the GPU machine has installed already
    local dir=$1
    mkdir -p "$dir"
    local ver=${GPU_PYTHON_VERSION:-3.12}  # the GPU machine's Python (a test builds one for its own)
    "$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$ver" \
        --implementation cp --abi "cp${ver//./}" \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$dir" "optuna>=4.0" "scipy>=1.10" "gguf>=0.10" "sqlalchemy>=2" pytest
    while read -r name; do  # what the machine has: its own builds stay in front
        [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
        norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
        find "$dir" -maxdepth 1 -iname "${norm}-*.whl" -delete
    done < scripts/gpu_preinstalled.txt
    echo "[prepare] wheelhouse $dir: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
}

split_gguf() {  # split_gguf NAME PATH: NAME.NN parts of PART_MB and NAME.sha256
    local name=$1 path=$2
    rm -rf "$OUT/$name".[0-9]*
    for i in $(seq 0 99); do
        chunk=$(printf '%s/%s.%02d' "$OUT" "$name" "$i")
        dd if="$path" of="$chunk" bs=1M skip=$((i * PART_MB)) count=$PART_MB status=none
        [ -s "$chunk" ] || { rm -f "$chunk"; break; }
    done
    sha256sum "$path" | awk '{print $1}' > "$OUT/$name.sha256"
}

models() {
    for pair in smollm2:smollm2-135m gemma3:gemma-3-270m; do
        path=$("$PY" -c "from draftnas.models.records import EMBEDDED
from draftnas.models.sources import locate_embedded_gguf
print(locate_embedded_gguf(EMBEDDED['${pair#*:}']))")
        split_gguf "${pair%%:*}" "$path"
    done
}

if [ "${1:-}" = wheels ] && [ $# -eq 2 ]; then
    wheels "$2"
    exit 0
fi
[ $# -gt 0 ] || set -- wheels models
for arg in "$@"; do
    case $arg in
    wheels) wheels "$OUT/wheels" ;;
    models) models ;;
    *) [ -d "$arg" ] || { echo "[prepare] $arg: not a phase (wheels, models) nor a drafter folder" >&2; exit 2; }
       "$PY" scripts/drafter_delta.py pack "$arg" smollm2-135m "$OUT/drafters/$(basename "$arg")" ;;
    esac
done
du -sh "$OUT"/* 2>/dev/null
