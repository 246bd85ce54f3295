#!/usr/bin/env bash
# Run on a CUDA box (no registry) after scripts/gpu_prepare.sh's files arrived in .whl/gpu/.
# Writes every result under $OUT (default ./gpu-out). Phases, each bounded in time:
#   setup     install the wheels that arrived into .whl/site (no network), print the environment
#   tests     the CUDA-only tests (captured steps equal eager ones)
#   profile-eager, profile-cuda-graph
#             draftnas profile, full grid, bf16, in that mode, with its report
#   oldgraph  the graph mode this project had before (kept in .whl/gpu/old_profile.py), on a
#             tiny grid with CUDA_LAUNCH_BLOCKING=1, to see where its illegal access starts
#   bench     SmolLM2-135M (GGUF reassembled) with each packed drafter: draftnas bench in bf16
#             and in fp32 (exact check), and benchmarks/loop_engines.py in bf16
#   target65b LLaMA-65B's real shape through 2 and 4 layers (random weights), one tensor-parallel
#             rank of 4 GPUs, decode and verify at batch 1/8/32, extrapolated to 80 layers and
#             checked on the deepest stack that fits; added to the cuda-graph profile, then a
#             llama-65b search priced with it
#
#   bash scripts/gpu_measure.sh setup tests oldgraph profile-eager profile-cuda-graph bench
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/.whl/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export DRAFTNAS_CACHE="$PWD/.whl/cache"
PY=python3
run() {  # run NAME TIMEOUT CMD...: output to $OUT/NAME.log, exit status noted, never fatal
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "[gpu] $name: exit $? in $((SECONDS - started)) s" | tee -a "$OUT/phases.txt"
}
for phase in "$@"; do
case $phase in
setup)
    # whatever wheels arrived (all of them, or only gguf for the bench phase)
    find .whl/gpu -name '*.whl' -print0 | sort -zu | xargs -0 "$PY" -m pip install -q --no-index --no-deps \
        --upgrade --target .whl/site > "$OUT/setup.log" 2>&1
    { nvidia-smi; "$PY" -c 'import torch, transformers, numpy, scipy, gguf; print("torch", torch.__version__,
"cuda", torch.version.cuda, "| transformers", transformers.__version__, "| numpy", numpy.__version__,
"| scipy", scipy.__version__, "| gguf", gguf.__version__)'; } > "$OUT/env.txt" 2>&1
    "$PY" - > "$OUT/static_cache_source.txt" 2>&1 <<'EOF'
import inspect, transformers.cache_utils as c
print(inspect.getsource(c.StaticLayer.update)); print(inspect.getsource(c.StaticLayer.get_seq_length))
EOF
    cat "$OUT/env.txt" ;;
tests)
    run tests 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_decoder.py tests/test_speculative.py \
        tests/test_profile.py -k "cuda or captured" ;;
target65b)
    base="$OUT/h100-bf16-cuda-graph.json"; [ -f "$base" ] || base=draftnas/data/profiles/h100-bf16-cuda-graph.json
    run target65b 420 "$PY" -m draftnas profile --device cuda --dtype bf16 --mode cuda-graph --from "$base" \
        --target llama-65b --layers 2,4 --tp 4 --batch-sizes 1,8,32 --max-gamma 8 --context 512 \
        --out "$OUT/h100-bf16-cuda-graph-llama65b-tp4.json"
    run search65b 120 "$PY" -m draftnas search --target llama-65b --base-shape llama-7b --acceptance-prior 0.7 \
        --profile "$OUT/h100-bf16-cuda-graph-llama65b-tp4.json" --gpus 4 --trials 60 --run-dir "$OUT/runs" ;;
profile-eager|profile-cuda-graph)
    mode=${phase#profile-}
    run "$phase" 420 "$PY" -m draftnas profile --device cuda --dtype bf16 --mode "$mode" \
        --out "$OUT/h100-bf16-$mode.json" --report --report-png "$OUT/h100-bf16-$mode-report.png" ;;
oldgraph)
    run oldgraph 120 env CUDA_LAUNCH_BLOCKING=1 "$PY" - <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("old_profile", ".whl/gpu/old_profile.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_profile"] = old; spec.loader.exec_module(old)
from draftnas.registry import Architecture
arch = Architecture(name="t", family="llama", num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000)
rt = old._Runtime(old.ProfileOptions(device="cuda", dtype="bf16", mode="cuda-graph", repeats=3, warmup=1))
step = old._GraphStep(rt, rt.build(arch), arch, (1, 3, 16), 2)
layer = step.cache.layers[0]
print("cumulative_length after capture and reset:", getattr(layer, "cumulative_length", None),
      "max_cache_len:", getattr(layer, "max_cache_len", None))
for i in range(3):
    step(); import torch; torch.cuda.synchronize()
    print("replay", i, "ok; cumulative_length now", getattr(layer, "cumulative_length", None))
    step.reset()
print("no illegal access on this grid")
EOF
    ;;
bench)
    cat .whl/gpu/smollm2.part* > .whl/smollm2.gguf
    echo "sha256 $(sha256sum .whl/smollm2.gguf | awk '{print $1}') expected $(cat .whl/gpu/smollm2.sha256)" \
        | tee "$OUT/gguf.txt"
    for packed in .whl/gpu/drafters/*/; do
        name=$(basename "$packed")
        run "unpack-$name" 200 "$PY" scripts/drafter_delta.py unpack "$packed" .whl/smollm2.gguf ".whl/drafters/$name"
        bench() {  # bench DTYPE: draftnas bench on CUDA in that dtype
            run "bench-$name-$1" 200 "$PY" -m draftnas bench --target .whl/smollm2.gguf \
                --draft ".whl/drafters/$name" --device cuda --dtype "$1" --gamma 3 --per-domain 3 \
                --max-new-tokens 64 --out-json "$OUT/bench-$name-$1.json"
        }
        bench bf16
        run "engines-$name" 150 "$PY" benchmarks/loop_engines.py --target .whl/smollm2.gguf \
            --draft ".whl/drafters/$name" --device cuda --dtype bf16 --gamma 3 --per-domain 3 \
            --max-new-tokens 64 --json "$OUT/engines-$name.json"
        bench fp32
    done ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
done
