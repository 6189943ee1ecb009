#!/usr/bin/env bash
# The GPU check, one command on any CUDA machine: `make gpu-check` (or `bash tools/gpu_check.sh`), at most 8 minutes
# (see the budget below):
#   0. a CUDA GPU at all? (nvidia-smi lists one) - else one line and exit status 2, at once, before any set-up;
#   1. set-up (tools/setup_env.sh; mmcv's CPU ops are enough: nms / roi_align run on torchvision's CUDA kernels);
#   2. torch sees CUDA (else the cause in one line: driver too old for the torch build, ...);
#   3. the CUDA-only tests (tests/test_cuda.py: torchvision route vs mmcv, fp16 overflow stops, bf16, memory);
#   4. the kernel benchmark on CUDA (forward + backward, N = 1k to 16k) in fp32 and bf16 (fp16 where the GPU has
#      no bf16);
#   5. 20 iterations of the main demo (configs/demo/maskrcnn_xcit_s12_poly3_demo.py) with --amp, and its COCO
#      evaluation;
#   6. a one-screen summary, also in work_dirs/gpu_check/summary.txt (each step's log beside it).
# At most 8 minutes (GPU_CHECK_BUDGET, seconds, counted from the start): every step after the set-up runs under
# `timeout` with its own cap and at most what is left of the budget; a step cut short is a FAIL saying so, steps with
# no time left are SKIP, and the summary still comes. The set-up itself is never cut short (a half-installed
# environment would cost the next run more): a first set-up that takes long leaves less time to the rest, and a
# second run (the environment is then reused in seconds) does all steps.
# Environment: GPU_CHECK_DIR (default work_dirs/gpu_check), GPU_CHECK_ITERS (20), GPU_CHECK_BUDGET (480), and what
# tools/setup_env.sh reads (SOFTFREE_VENV, TORCH_INDEX_URL, MMCV_CUDA, ...).
# Sourced (`source tools/gpu_check.sh`), it only defines its functions (tests/test_gpu_check.py runs them on CPU).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# begin OUT_DIR: the summary file, the clock and the budget
begin() {
    OUT=$1
    mkdir -p "$OUT"
    SUMMARY="$OUT/summary.txt"
    : > "$SUMMARY"
    START=$(date +%s)
    BUDGET=${GPU_CHECK_BUDGET:-480}
    FAILED=0
}

# step NAME CAP COMMAND...: runs it with its output in $OUT/NAME.log under `timeout` (CAP seconds, or what is left of
# the budget when that is less; CAP 0: no limit, for the set-up), records PASS / FAIL / SKIP and the seconds it took
step() {
    local name=$1 cap=$2
    shift 2
    local t0=$SECONDS left=$(( BUDGET - ($(date +%s) - START) )) limit rc
    if [ "$cap" != 0 ] && [ "$left" -le 0 ]; then
        printf '%-10s SKIP %5ss  no time left of the %ss budget\n' "$name" 0 "$BUDGET" >> "$SUMMARY"
        FAILED=1
        return 1
    fi
    echo "gpu-check: $name ..." >&2
    if [ "$cap" = 0 ]; then
        "$@" > "$OUT/$name.log" 2>&1
        rc=$?
    else
        limit=$(( cap < left ? cap : left ))
        timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
        rc=$?
    fi
    if [ "$rc" = 0 ]; then
        printf '%-10s PASS %5ss  %s\n' "$name" $((SECONDS - t0)) "$(detail "$name")" >> "$SUMMARY"
        return 0
    fi
    if [ "$cap" != 0 ] && { [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then
        printf '%-10s FAIL %5ss  stopped after %ss (step cap %ss, %ss left of the %ss budget) (log: %s)\n' "$name" \
            $((SECONDS - t0)) "$limit" "$cap" "$left" "$BUDGET" "$OUT/$name.log" >> "$SUMMARY"
    else
        printf '%-10s FAIL %5ss  %s (log: %s)\n' "$name" $((SECONDS - t0)) \
            "$(grep -E '^error:|Error|FAILED' "$OUT/$name.log" | tail -n 1 | cut -c1-120)" "$OUT/$name.log" >> "$SUMMARY"
    fi
    FAILED=1
    return 1
}

# one line of what a passing step found
detail() {
    case $1 in
        cuda) tail -n 1 "$OUT/cuda.log" ;;
        tests) grep -E '[0-9]+ passed' "$OUT/tests.log" | tail -n 1 ;;
        bench-*) grep -E '^\| (softmax|poly|soft) \| 16384 \| fwdbwd ' "$OUT/$1.log" | awk -F'|' '{printf "%s%sms ", $2, $5}' ;;
        demo) grep -E 'Iter\(train\) \[ *'"$ITERS"'/' "$OUT/demo.log" | tail -n 1 | grep -oE 'loss: [0-9.]+|time: [0-9.]+' | tr '\n' ' ' ;;
        eval) grep -E '^metrics:' "$OUT/eval.log" | cut -c1-110 ;;
        *) echo ;;
    esac
}

finish() {
    local total=$(( $(date +%s) - START ))
    {
        echo "---"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/gpu: /'
        [ -x "$PY" ] && "$PY" -c 'import torch, mmcv; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), mmcv {mmcv.__version__}")' 2>/dev/null
        echo "total: ${total}s; $( [ $FAILED = 0 ] && echo 'all steps passed' || echo 'FAILED steps above' )"
    } >> "$SUMMARY"
    echo "=================== gpu-check summary ($OUT) ===================" >&2
    cat "$SUMMARY" >&2
    exit $FAILED
}

main() {
    cd "$ROOT"
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        echo "gpu-check: no CUDA GPU on this machine (nvidia-smi lists none); run it where nvidia-smi lists a GPU" >&2
        exit 2
    fi
    ITERS=${GPU_CHECK_ITERS:-20}
    VENV=${SOFTFREE_VENV:-$ROOT/.venv}
    PY="$VENV/bin/python"
    begin "${GPU_CHECK_DIR:-$ROOT/work_dirs/gpu_check}"
    step setup 0 bash tools/setup_env.sh || finish
    step cuda 120 "$PY" -c '
import sys, torch
sys.path.insert(0, ".")
from softfree_mm.engine.device import diagnose
problem = diagnose()
if problem:
    print(f"error: {problem}"); sys.exit(2)
p = torch.cuda.get_device_properties(0)
from softfree_mm import compat
route = "mmcv CUDA ops" if compat.mmcv_has_cuda_ops() else "torchvision route"
print(f"{torch.cuda.device_count()} x {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB), bf16 {torch.cuda.is_bf16_supported()}, nms/roi_align: {route}")
    ' || finish
    step tests 180 "$PY" -m pytest tests/test_cuda.py -q -p no:cacheprovider -rs
    HALF=$(timeout 60 "$PY" -c 'import torch; print("bf16" if torch.cuda.is_bf16_supported() else "fp16")')
    KERNELS=(softmax poly relu linear efficient taylor inline soft)
    step bench-fp32 90 "$PY" tools/benchmark.py kernels --device cuda --dtype fp32 --tokens 1024 4096 16384 --backward \
        --heads 4 --head-dim 32 --kernels "${KERNELS[@]}"
    step bench-$HALF 90 "$PY" tools/benchmark.py kernels --device cuda --dtype "$HALF" --tokens 1024 4096 16384 \
        --backward --heads 4 --head-dim 32 --kernels "${KERNELS[@]}"
    DEMO_CFG=configs/demo/maskrcnn_xcit_s12_poly3_demo.py
    if step demo 150 "$PY" tools/train.py "$DEMO_CFG" --amp --work-dir "$OUT/demo" --cfg-options \
            "train_cfg.max_iters=$ITERS" "train_cfg.val_begin=$((ITERS + 1))" "train_cfg.val_interval=$ITERS" \
            "default_hooks.checkpoint.interval=$ITERS" default_hooks.logger.interval=5 \
            model.backbone.init_cfg.type=Scratch; then  # the detector alone (make demo pretrains its backbone first)
        step eval 90 "$PY" tools/test.py "$DEMO_CFG" "$(cat "$OUT/demo/last_checkpoint")" --work-dir "$OUT/demo"
    fi
    finish
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
