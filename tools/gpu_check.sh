#!/usr/bin/env bash
# The GPU check, one command on any CUDA machine: `make gpu-check` (or `bash tools/gpu_check.sh`), at most 9 minutes
# (GPU_CHECK_BUDGET), one summary file:
#   0. a CUDA GPU at all? (nvidia-smi lists one) - else one line and exit status 2, at once, before any set-up;
#   1. set-up: the project's environment when it is ready; else, with GPU_CHECK_WHEELS=DIR (default
#      work_dirs/gpu_wheels when it exists: a node without a package index), a venv on the machine's own torch
#      (its packages seen after the venv's own), the OpenMMLab wheels from DIR (--no-index) and mmcv 2.1.0 built from its source in
#      DIR with CPU ops on all cores but two, in the background while the steps that need no mmcv run (on CUDA,
#      nms / roi_align go to torchvision's kernels); without DIR, tools/setup_env.sh (a package index);
#   2. torch sees CUDA (else the cause in one line: driver too old for the torch build, ...);
#   3. the kernels against SDPA at N = 1k..64k, forward + backward, bf16 then fp32 (fp16 where the GPU has no bf16),
#      CUDA events, peak memory, TFLOP/s and GB/s against the device's measured matrix rate and copy bandwidth (each
#      fused variant checks itself against the explicit path on first use; a failure is listed in the summary);
#   4. (mmcv ready) one Mask R-CNN training step at 800x1216, batch 2: our Swin-T / PVTv2-b2 with softmax, poly3 and
#      inline against mmdet's own SwinTransformer / PyramidVisionTransformerV2 in the same detector;
#   5. the fused Triton kernels compiled on the GPU against the explicit path (tests/attention/test_attention_fused.py);
#   6. the CUDA-only tests (tests/test_cuda.py);
#   7. the summary in work_dirs/gpu_check/summary.txt (each step's log beside it, the tables in *.csv).
# Every step after the set-up runs under `timeout` with its own cap and at most what is left of the budget; a step
# cut short is a FAIL saying so, steps with no time left are SKIP, and the summary still comes. GPU_CHECK_STEPS
# (e.g. "detector tests") runs only those steps (a second run after a first one that ran out of time).
# Environment: GPU_CHECK_DIR (work_dirs/gpu_check), GPU_CHECK_BUDGET (540), GPU_CHECK_WHEELS, GPU_CHECK_PYTHON (the
# Python that holds torch, for the offline venv: python3), GPU_CHECK_TOKENS ("1024 4096 16384 65536"),
# GPU_CHECK_STEPS, and what tools/setup_env.sh reads (SOFTFREE_VENV, TORCH_INDEX_URL, MMCV_CUDA, ...).
#   bash tools/gpu_check.sh --fetch-wheels DIR [PYTHON_VERSION]   on a machine WITH a package index: the wheels (and
#   mmcv's source) that the offline set-up installs, for the GPU node's Python (default 3.12), into DIR (~10 MB).
# Sourced (`source tools/gpu_check.sh`), it only defines its functions (tests/tools/test_gpu_check.py runs them on CPU).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEPS_ALL="cuda fused bench-bf16 bench-fp32 detector tests"
# installed with --no-deps from the wheel folder, in this order: mmengine's, mmdet's, mmseg's and mmpretrain's
# requirements that a CUDA image with torch, numpy, scipy, matplotlib, opencv and timm usually lacks, then the
# OpenMMLab packages themselves (mmcv from source, separately)
OFFLINE_BASE=('setuptools<82' addict termcolor yapf platformdirs pycocotools shapely terminaltables prettytable wcwidth
    ftfy mat4py modelindex ordered-set importlib-metadata 'mmengine==0.10.7')
OFFLINE_MM=('mmdet==3.3.0' 'mmsegmentation==1.2.2' 'mmpretrain==1.2.0')

# begin OUT_DIR: the summary file, the clock and the budget
begin() {
    OUT=$1
    mkdir -p "$OUT"
    SUMMARY="$OUT/summary.txt"
    : > "$SUMMARY"
    START=$(date +%s)
    BUDGET=${GPU_CHECK_BUDGET:-540}
    FAILED=0
}

wanted() {  # wanted NAME: the step is in GPU_CHECK_STEPS (all when unset)
    case " ${GPU_CHECK_STEPS:-$STEPS_ALL} " in *" $1 "*) return 0 ;; *) return 1 ;; esac
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
        tests|fused) grep -E '[0-9]+ passed' "$OUT/$1.log" | tail -n 1 ;;
        bench-*) grep -E '^\| (softmax|poly|relu|sigmoid|linear) \| 16384 \| fwdbwd ' "$OUT/$1.log" \
                     | awk -F'|' '{printf "%s%sms x%s ", $2, $5, $6}' ;;
        detector) grep -E '^\| pvt_v2_b2:(mmdet|softmax|poly3) ' "$OUT/detector.log" | awk -F'|' '{printf "%s%s img/s ", $2, $7}' ;;
        *) echo ;;
    esac
}

finish() {
    local total=$(( $(date +%s) - START ))
    {
        echo "---"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/gpu: /'
        [ -x "${PY:-}" ] && "$PY" -c 'import torch, triton; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")' 2>/dev/null
        [ -x "${PY:-}" ] && "$PY" -c 'import mmcv, mmdet; print(f"mmcv {mmcv.__version__}, mmdet {mmdet.__version__}")' 2>/dev/null
        # a fused kernel that failed its first-use check (the benchmarks then measured the tiled path)
        grep -h 'softfree_mm: fused .* attention kernel' "$OUT"/*.log 2>/dev/null | sort -u | sed 's/^/warning: /'
        for f in "$OUT"/bench-*.log "$OUT"/detector.log; do
            [ -f "$f" ] || continue
            echo "--- $(basename "$f" .log)"
            grep -E '^(ceilings:|\| )' "$f"
        done
        echo "total: ${total}s; $( [ $FAILED = 0 ] && echo 'all steps passed' || echo 'FAILED steps above' )"
    } >> "$SUMMARY"
    echo "=================== gpu-check summary ($OUT) ===================" >&2
    cat "$SUMMARY" >&2
    exit $FAILED
}

# ------------------------------------------------------------------------------------------- offline set-up
fetch_wheels() {  # fetch_wheels DIR [PYTHON_VERSION]: the offline set-up's wheels and mmcv's source, into DIR
    local dir=$1 pyver=${2:-3.12} py=${PYTHON:-python3}
    mkdir -p "$dir"
    "$py" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: --dest "$dir" \
        --python-version "$pyver" --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
        "${OFFLINE_BASE[@]}" "${OFFLINE_MM[@]}" || return 2
    "$py" -m pip download --disable-pip-version-check --no-deps --no-binary=:all: --dest "$dir" 'mmcv==2.1.0' \
        || return 2
    echo "gpu-check: wheels for Python $pyver in $dir ($(du -sh "$dir" | cut -f1)); on the GPU node:" \
         "GPU_CHECK_WHEELS=$dir make gpu-check" >&2
}

offline_venv() {  # offline_venv BASE_PYTHON VENV: a venv that sees BASE_PYTHON's packages after its own
    # not --system-site-packages: where BASE_PYTHON is itself a venv (the GPU images' python3 is), that option would
    # show the interpreter's bare site-packages, without torch; a .pth file lists the folders BASE_PYTHON imports from
    local base=$1 venv=$2 site
    [ -x "$venv/bin/python" ] || "$base" -m venv "$venv" || return 2
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 2
    "$base" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
        > "$site/_gpu_check_base.pth" || return 2
}

offline_setup() {  # offline_setup WHEELS VENV: a venv on this machine's torch, the wheels from WHEELS, no index
    local wheels=$1 venv=$2 base=${GPU_CHECK_PYTHON:-python3}
    "$base" -c 'import torch, triton' 2>/dev/null || {
        echo "error: $base cannot import torch and triton: set GPU_CHECK_PYTHON to the Python that holds them"; return 2; }
    ls "$wheels"/mmcv-2.1.0.tar.gz >/dev/null 2>&1 || {
        echo "error: no mmcv-2.1.0.tar.gz in GPU_CHECK_WHEELS=$wheels (bash tools/gpu_check.sh --fetch-wheels DIR)"
        return 2; }
    offline_venv "$base" "$venv" || return 2
    local py="$venv/bin/python"
    "$py" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" --no-deps \
        "${OFFLINE_BASE[@]}" || return 2
    "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation -e "$ROOT" || return 2
    "$py" -c 'import torch, mmengine, softfree_mm.attention; print(f"torch {torch.__version__}, mmengine {mmengine.__version__}")'
}

mmcv_build() {  # mmcv_build WHEELS PY: mmcv 2.1.0 with CPU ops from its source in WHEELS (no index), then the mm packages
    local wheels=$1 py=$2 jobs wrap real
    jobs=$(( $(nproc) - 2 ))
    [ "$jobs" -ge 1 ] || jobs=1
    wrap=$(mktemp -d)
    real=$(command -v c++ || command -v g++ || true)
    [ -n "$real" ] || { echo "error: no C++ compiler (c++ / g++) to build mmcv's ops"; return 2; }
    # torch >= 2.14 headers need C++20; mmcv's setup.py pins -std=c++14/17
    printf '#!/usr/bin/env bash\nargs=()\nfor a in "$@"; do case "$a" in -std=c++14|-std=c++17) args+=(-std=c++20) ;; *) args+=("$a") ;; esac; done\nexec %s "${args[@]}"\n' \
        "$real" > "$wrap/c++"
    chmod +x "$wrap/c++"
    echo "building mmcv 2.1.0 with CPU ops, MAX_JOBS=$jobs"
    if ! "$py" -c 'from mmcv.ops import nms, roi_align' 2>/dev/null; then
        env MMCV_WITH_OPS=1 FORCE_CUDA=0 CUDA_VISIBLE_DEVICES= MAX_JOBS="$jobs" CXX="$wrap/c++" nice -n 10 \
            "$py" -m pip install --disable-pip-version-check --no-index --find-links "$wheels" --no-deps \
            --no-build-isolation --no-cache-dir 'mmcv==2.1.0' || return 2
    fi
    "$py" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" --no-deps \
        "${OFFLINE_MM[@]}" || return 2
    if ! "$py" -c 'import mmdet.models, mmseg.models, mmpretrain.models' 2>/dev/null \
            && "$py" -c 'import transformers' 2>/dev/null; then
        shadow_transformers "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    fi
    "$py" -c 'import softfree_mm, mmdet.models, mmseg.models, mmpretrain.models; from mmcv.ops import nms, roi_align; print("mm stack ready")'
}

shadow_transformers() {  # shadow_transformers SITE_PACKAGES
    # mmpretrain switches its multimodal code on when it finds transformers' metadata (>= 4.28), and that code fails
    # to import: a metadata-only entry in the venv's site-packages (found before the machine's) says version 0.0.0;
    # nothing is removed, `import transformers` still finds the machine's package
    mkdir -p "$1/transformers-0.0.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: transformers\nVersion: 0.0.0\n' > "$1/transformers-0.0.0.dist-info/METADATA"
    echo "mmpretrain: transformers' metadata shadowed in $1 (version 0.0.0; the package itself untouched)"
}

await_mmcv() {  # the background build's end within the budget, recorded as the step 'mmcv' (log: mmcv-build.log)
    local t0=$SECONDS rc
    while kill -0 "$MMCV_PID" 2>/dev/null && [ $(( $(date +%s) - START )) -lt "$BUDGET" ]; do sleep 2; done
    if kill -0 "$MMCV_PID" 2>/dev/null; then
        kill "$MMCV_PID" 2>/dev/null
        printf '%-10s FAIL %5ss  not built within the %ss budget (log: %s)\n' mmcv $((SECONDS - t0)) "$BUDGET" \
            "$OUT/mmcv-build.log" >> "$SUMMARY"
        FAILED=1
        return 1
    fi
    wait "$MMCV_PID"
    rc=$?
    if [ "$rc" = 0 ]; then
        printf '%-10s PASS %5ss  %s\n' mmcv $((SECONDS - t0)) "built in the background; $(tail -n 1 "$OUT/mmcv-build.log")" \
            >> "$SUMMARY"
        return 0
    fi
    printf '%-10s FAIL %5ss  %s (log: %s)\n' mmcv $((SECONDS - t0)) \
        "$(grep -E '^error:|Error' "$OUT/mmcv-build.log" | tail -n 1 | cut -c1-120)" "$OUT/mmcv-build.log" >> "$SUMMARY"
    FAILED=1
    return 1
}

# ------------------------------------------------------------------------------------------- main
main() {
    cd "$ROOT"
    if [ "${1-}" = --fetch-wheels ]; then
        [ -n "${2-}" ] || { echo "usage: bash tools/gpu_check.sh --fetch-wheels DIR [PYTHON_VERSION]" >&2; exit 2; }
        fetch_wheels "$2" "${3-}"
        exit $?
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        echo "gpu-check: no CUDA GPU on this machine (nvidia-smi lists none); run it where nvidia-smi lists a GPU" >&2
        exit 2
    fi
    VENV=${SOFTFREE_VENV:-$ROOT/.venv}
    PY="$VENV/bin/python"
    WHEELS=${GPU_CHECK_WHEELS:-}
    [ -n "$WHEELS" ] || { [ -d "$ROOT/work_dirs/gpu_wheels" ] && WHEELS=$ROOT/work_dirs/gpu_wheels; }
    TOKENS=${GPU_CHECK_TOKENS:-1024 4096 16384 65536}
    begin "${GPU_CHECK_DIR:-$ROOT/work_dirs/gpu_check}"
    MMCV_PID=
    if [ -f "$VENV/.softfree_mm_setup_done" ] && "$PY" -c 'import softfree_mm, mmdet' >/dev/null 2>&1; then
        :  # the project's environment, ready
    elif [ -n "$WHEELS" ]; then
        step setup 0 offline_setup "$WHEELS" "$VENV" || finish
        mmcv_build "$WHEELS" "$PY" > "$OUT/mmcv-build.log" 2>&1 &
        MMCV_PID=$!
    else
        step setup 0 bash tools/setup_env.sh || finish
    fi
    step cuda 60 "$PY" -c '
import sys, torch
sys.path.insert(0, ".")
if not torch.cuda.is_available():
    print(f"error: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: a driver older than this build needs, or a CPU-only torch"); sys.exit(2)
p = torch.cuda.get_device_properties(0)
print(f"{torch.cuda.device_count()} x {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB), bf16 {torch.cuda.is_bf16_supported()}")
    ' || finish
    HALF=$(timeout 60 "$PY" -c 'import torch; print("bf16" if torch.cuda.is_bf16_supported() else "fp16")')
    KERNELS=(softmax poly relu sigmoid linear inline poly:degree=1 soft:num_landmarks=64)
    # shellcheck disable=SC2086  # TOKENS: a list of numbers
    wanted bench-bf16 && step "bench-$HALF" 120 "$PY" tools/benchmark.py kernels --device cuda --dtype "$HALF" \
        --tokens $TOKENS --backward --heads 4 --head-dim 64 --ceilings --kernels "${KERNELS[@]}" \
        --csv "$OUT/kernels_$HALF.csv"
    # shellcheck disable=SC2086
    wanted bench-fp32 && step bench-fp32 90 "$PY" tools/benchmark.py kernels --device cuda --dtype fp32 \
        --tokens $TOKENS --backward --heads 4 --head-dim 64 --ceilings --kernels "${KERNELS[@]}" \
        --csv "$OUT/kernels_fp32.csv"
    if [ -n "$MMCV_PID" ]; then
        await_mmcv || finish
    fi
    wanted detector && step detector 200 "$PY" tools/benchmark.py detector --device cuda --batch 2 --size 800x1216 \
        --repeats 3 --csv "$OUT/detector.csv" --detectors swin_t:mmdet swin_t:softmax pvt_v2_b2:mmdet \
        pvt_v2_b2:softmax pvt_v2_b2:poly3 swin_t:poly3 pvt_v2_b2:inline swin_t:inline
    wanted fused && step fused 150 "$PY" -m pytest tests/attention/test_attention_fused.py -q -p no:cacheprovider -x
    wanted tests && step tests 150 "$PY" -m pytest tests/test_cuda.py -q -p no:cacheprovider -rs
    finish
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
