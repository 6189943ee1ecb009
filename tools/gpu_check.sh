#!/usr/bin/env bash
# The GPU check, one command on any CUDA machine: `make gpu-check` (or `bash tools/gpu_check.sh`), one prepared run
# that fits 7 minutes of device time (GPU_CHECK_BUDGET, 420 s; its steps' caps add up to plan_seconds, leaving the
# rest to the set-up), one summary file:
#   0. a CUDA GPU at all? (nvidia-smi lists one) - else one line and exit status 2, at once, before any set-up;
#   1. set-up: the project's environment when it is ready; else, with GPU_CHECK_WHEELS=DIR (default
#      work_dirs/gpu_wheels when it exists: a node without a package index), a venv on the machine's own torch (its
#      packages seen after the venv's own) with the lock's packages but torch's (mmcv-lite 2.1.0, the OpenMMLab
#      packages, numpy, timm...: exact versions) from DIR in one pip call (--no-index, nothing compiled: mmcv's ops
#      are softfree_mm's stand-in for mmcv._ext on torchvision's kernels), then this package (-e, which puts the
#      stand-in in place in every process of the venv), then a check in a bare Python that mmcv.ops and the mm
#      packages import; without DIR, tools/setup_env.sh (a package index); a peer's wheel in DIR (fbi_la: fla-org's
#      flash bidirectional linear attention) is installed too when it is there;
#   2. cuda: torch sees CUDA (else the cause in one line: driver too old for the torch build, ...);
#   3. fused: the fused Triton kernels compiled on the GPU against the explicit path (pointwise and linear tests; the
#      pointwise blocks not tuned there: SOFTFREE_ATTN_TUNE=0);
#   4. bench-bf16: the kernels against SDPA at N = 1k..64k, batch 1 x 4 heads of 64, forward + backward, bf16 (fp16
#      where the GPU has no bf16), CUDA events, TFLOP/s and GB/s against the device's matrix rate and copy
#      bandwidth, the path each kernel took (fused linear / fused pointwise / its quadratic path or order);
#   5. bench-anchor: the anchors' shape, batch 8 x 16 heads of 64, N = 4k..64k: softmax, the linear-time kernels and
#      the peer peer:fbi_la where installed (else its rows are skipped, said in the log);
#   6. bench-window: Swin's window shape, 49 tokens x 4096 windows, 3 heads of 32;
#   7. detector: one Mask R-CNN training step at 800x1216, batch 2, fp32: our Swin-T / PVTv2-b2 (softmax, poly3,
#      inline) against mmdet's own in the same detector, with a torch.profiler table of each step's top operators
#      (profile_*.txt);
#   8. detector-bf16: the same step in bf16 AMP for InLine PVTv2-b2 against our softmax PVTv2-b2 without reduction,
#      XCiT-S12 + linear with the association rule and with the former factorised order (an N x N k^T v), and
#      the PVTv2-b2 pair against mmdet's;
#   and on request (GPU_CHECK_STEPS): bench-fp32, cost (what each kernel costs as images grow), warm-start (stage 1
#   against a supervised step), tests (the CUDA-only tests);
#   last: the summary in work_dirs/gpu_check/summary.txt (each step's log beside it, the tables in *.csv).
# Every step after the set-up runs under `timeout` with its own cap (CAP below) and at most what is left of the
# budget; a step cut short is a FAIL saying so, steps with no time left are SKIP, and the summary still comes.
# GPU_CHECK_STEPS (e.g. "detector tests") runs only those steps (a second run after a first one that ran out of
# time). Environment: GPU_CHECK_DIR (work_dirs/gpu_check), GPU_CHECK_BUDGET (420), GPU_CHECK_WHEELS,
# GPU_CHECK_PYTHON (the Python that holds torch, for the offline venv: python3), GPU_CHECK_TOKENS ("1024 4096 16384
# 65536"), GPU_CHECK_STEPS, and what tools/setup_env.sh reads (SOFTFREE_VENV, TORCH_INDEX_URL, MMCV_CUDA, ...).
#   bash tools/gpu_check.sh --fetch-wheels DIR [PYTHON_VERSION]   on a machine WITH a package index: the wheels (all
#   binary, no source to build) that the offline set-up installs, for the GPU node's Python (default 3.12), into DIR.
#   bash tools/gpu_check.sh --plan   prints the default run's steps, their caps and their sum (no GPU needed).
# Sourced (`source tools/gpu_check.sh`), it only defines its functions (tests/tools/test_gpu_check.py runs them on CPU).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# the default run (GPU_CHECK_STEPS unset), in order, and every step there is
PLAN="cuda fused bench-bf16 bench-anchor bench-window detector detector-bf16"
STEPS_ALL="$PLAN bench-fp32 cost warm-start tests"
# each step's cap in seconds (the default run's add up to plan_seconds: at most GPU_CHECK_BUDGET less SETUP_SECONDS)
declare -A CAP=([cuda]=15 [fused]=45 [bench-bf16]=60 [bench-anchor]=40 [bench-window]=15 [detector]=110
                [detector-bf16]=110 [bench-fp32]=90 [cost]=150 [warm-start]=90 [tests]=150)
DEFAULT_BUDGET=420
SETUP_SECONDS=25  # what the run leaves the set-up: a ready environment's check (the offline set-up takes longer)
FIXED_TOKENS="4096 16384 65536"  # the anchors' sizes (bench-anchor)
# what the offline set-up installs with --no-deps from the wheel folder: the lock the set-up installs for the node's
# Python (requirements/lock/: py3.X.txt, else all.txt) less torch, torchvision, triton and CUDA's libraries (the
# machine's own), each at its exact version: mmcv-lite, the OpenMMLab packages, numpy, opencv, timm and the rest
offline_reqs() {  # offline_reqs PYTHON_VERSION: NAME==VERSION a line
    local lock=$ROOT/requirements/lock/py$1.txt
    [ -f "$lock" ] || lock=$ROOT/requirements/lock/all.txt
    "${GPU_CHECK_PYTHON:-python3}" "$ROOT/tools/lockfile.py" select "$lock" --not-from-lock torch \
        | sed -n 's/^\([A-Za-z0-9][^ ;]*==[^ ;\\]*\).*/\1/p'
}
# requirements/mmcv.txt's pin: mmcv's Python without its compiled mmcv._ext; one universal wheel, named here for the
# set-up's error when the folder lacks it
OFFLINE_MMCV='mmcv-lite==2.1.0'
MMCV_LITE_WHEEL=mmcv_lite-2.1.0-py2.py3-none-any.whl
# the offline set-up's check, in a bare Python (softfree_mm not imported): mmcv.ops must find mmcv._ext through the
# .pth that the package's install wrote, as mmdet's own imports in every later step do
MM_READY='import sys, torch, mmcv
from mmcv.ops import nms, roi_align
import mmdet.models, mmseg.models, mmpretrain.models
assert "softfree_mm" not in sys.modules, "softfree_mm was imported: this check would not see a missing .pth"
print(f"torch {torch.__version__}, mmcv {mmcv.__version__}: mmcv.ops and the mm packages import without softfree_mm")'

# begin OUT_DIR: the summary file, the clock and the budget
begin() {
    OUT=$1
    mkdir -p "$OUT"
    SUMMARY="$OUT/summary.txt"
    : > "$SUMMARY"
    START=$(date +%s)
    BUDGET=${GPU_CHECK_BUDGET:-$DEFAULT_BUDGET}
    FAILED=0
}

wanted() {  # wanted NAME: the step is in GPU_CHECK_STEPS (the default run's PLAN when unset)
    case " ${GPU_CHECK_STEPS:-$PLAN} " in *" $1 "*) return 0 ;; *) return 1 ;; esac
}

plan_seconds() {  # the default run's caps added up
    local s total=0
    for s in $PLAN; do total=$(( total + CAP[$s] )); done
    echo "$total"
}

plan() {  # the default run: each step and its cap, their sum against the budget
    local s
    for s in $PLAN; do printf '%-14s %4ss\n' "$s" "${CAP[$s]}"; done
    echo "steps: $(plan_seconds)s of the ${GPU_CHECK_BUDGET:-$DEFAULT_BUDGET}s budget (set-up: the rest, ${SETUP_SECONDS}s or more)"
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
        bench-anchor) grep -E '^\| [^|]+ \| 16384 \| fwdbwd ' "$OUT/$1.log" \
                     | awk -F'|' '{printf "%s%sms x%s (%s) ", $2, $5, $6, $(NF-1)}' ;;
        bench-window) grep -E '^\| [^|]+ \| 49 \| fwdbwd ' "$OUT/$1.log" \
                     | awk -F'|' '{printf "%s%sms x%s (%s) ", $2, $5, $6, $(NF-1)}' ;;
        warm-start) grep -oE '^transfer_[a-z0-9_]+\.py: stage 1 [0-9.]+ s/step, the classifier [0-9.]+ s/step' \
                        "$OUT/warm-start.log" | tr '\n' ' ' ;;
        bench-*) grep -E '^\| (softmax|poly|relu|sigmoid|linear) \| 16384 \| fwdbwd ' "$OUT/$1.log" \
                     | awk -F'|' '{printf "%s%sms x%s (%s) ", $2, $5, $6, $(NF-1)}' ;;
        detector*) grep -E '^\| [a-z0-9_]+:[a-z0-9_+]+ ' "$OUT/$1.log" | awk -F'|' '{printf "%s%s img/s ", $2, $7}' ;;
        *) echo ;;
    esac
}

finish() {
    local total=$(( $(date +%s) - START ))
    {
        echo "---"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/gpu: /'
        [ -x "${PY:-}" ] && "$PY" -c 'import torch, triton; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")' 2>/dev/null
        # which mmcv ops the detector ran on: the stand-in (mmcv-lite, the default) or a compiled mmcv's
        [ -x "${PY:-}" ] && "$PY" -c 'import mmcv, mmdet; from softfree_mm.compat import mmcv_ext_is_standin
ops = "ops: the mmcv._ext stand-in on torchvision" if mmcv_ext_is_standin() else "compiled ops"
print(f"mmcv {mmcv.__version__} ({ops}), mmdet {mmdet.__version__}")' 2>/dev/null
        # a fused kernel that failed its first-use check (the benchmarks then measured the tiled path)
        grep -hE 'softfree_mm: fused .*attention.*(instead|not used)' "$OUT"/*.log 2>/dev/null | sort -u \
            | sed 's/^/warning: /'
        for f in "$OUT"/bench-*.log "$OUT"/detector*.log; do
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
fetch_wheels() {  # fetch_wheels DIR [PYTHON_VERSION]: the offline set-up's wheels, binary only, into DIR
    local dir=$1 pyver=${2:-3.12} py=${PYTHON:-python3}
    [[ $pyver =~ ^[0-9]+\.[0-9]+$ ]] || {
        echo "error: PYTHON_VERSION must be the GPU node's MAJOR.MINOR, e.g. 3.12; got '$pyver'" >&2; return 2; }
    mkdir -p "$dir" || return 2
    local reqs
    mapfile -t reqs < <(GPU_CHECK_PYTHON=$py offline_reqs "$pyver")
    [ "${#reqs[@]}" -gt 0 ] || return 2
    "$py" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: --dest "$dir" \
        --python-version "$pyver" --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
        "${reqs[@]}" || return 2
    echo "gpu-check: wheels for Python $pyver in $dir ($(du -sh "$dir" | cut -f1)); on the GPU node:" \
         "GPU_CHECK_WHEELS=$dir make gpu-check" >&2
}

# missing_wheels DIR REQUIREMENT...: those with no wheel in DIR, one a line. Names compare as pip compares them (any
# case; '-', '_' and '.' alike); a pinned version must match, other specifiers are left to pip.
missing_wheels() {
    local dir=$1 req key have
    shift
    have=$(find "$dir" -maxdepth 1 -name '*.whl' -printf '%f\n' \
           | awk -F- '{n = tolower($1); gsub(/[-_.]+/, "_", n); print n "-" $2}')
    for req in "$@"; do
        key=$(printf '%s' "${req%%[<>=!~]*}" | tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/_/g')-
        if [[ $req == *==* ]]; then
            grep -qxF -- "$key${req#*==}" <<< "$have" || echo "$req"
        else
            grep -q -- "^$key" <<< "$have" || echo "$req"  # the key holds only [a-z0-9_-]
        fi
    done
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
    local wheels=$1 venv=$2 base=${GPU_CHECK_PYTHON:-python3} missing py reqs
    "$base" -c 'import torch, triton' 2>/dev/null || {
        echo "error: $base cannot import torch and triton: set GPU_CHECK_PYTHON to the Python that holds them"; return 2; }
    [ -d "$wheels" ] || { echo "error: GPU_CHECK_WHEELS=$wheels is not a folder"; return 2; }
    mapfile -t reqs < <(offline_reqs "$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')")
    [ "${#reqs[@]}" -gt 0 ] || { echo "error: no lock in $ROOT/requirements/lock/ to install"; return 2; }
    # before anything is made: a folder from an older --fetch-wheels (mmcv's source, no mmcv-lite; other versions
    # than the lock's) is one line
    missing=$(missing_wheels "$wheels" "${reqs[@]}" | sed "s/^$OFFLINE_MMCV\$/$MMCV_LITE_WHEEL/" | paste -sd, \
              | sed 's/,/, /g')
    if [ -n "$missing" ]; then
        echo "error: no $missing in GPU_CHECK_WHEELS=$wheels: fetch them where there is a package index with" \
             "bash tools/gpu_check.sh --fetch-wheels DIR $("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        return 2
    fi
    offline_venv "$base" "$venv" || return 2
    py="$venv/bin/python"
    "$py" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" --no-deps \
        "${reqs[@]}" || return 2
    # also writes softfree_mm-mmcv-ext.pth into the venv's site-packages (mmcv._ext for every process there)
    "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation -e "$ROOT" || return 2
    # a peer kernel's wheel brought along in the folder (the benchmark's peer:fbi_la): installed, else skipped there
    local peer
    for peer in "$wheels"/flash_bla-*.whl "$wheels"/fbi_la-*.whl; do
        [ -f "$peer" ] || continue
        "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps "$peer" || return 2
    done
    # transformers first: where it is absent (most images), no need to import the mm packages twice
    if "$py" -c 'import transformers' 2>/dev/null \
            && ! "$py" -c 'import mmdet.models, mmseg.models, mmpretrain.models' 2>/dev/null; then
        shadow_transformers "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    fi
    "$py" -c "$MM_READY"
}

shadow_transformers() {  # shadow_transformers SITE_PACKAGES
    # mmpretrain switches its multimodal code on when it finds transformers' metadata (>= 4.28), and that code fails
    # to import: a metadata-only entry in the venv's site-packages (found before the machine's) says version 0.0.0;
    # nothing is removed, `import transformers` still finds the machine's package
    mkdir -p "$1/transformers-0.0.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: transformers\nVersion: 0.0.0\n' > "$1/transformers-0.0.0.dist-info/METADATA"
    echo "mmpretrain: transformers' metadata shadowed in $1 (version 0.0.0; the package itself untouched)"
}

# ------------------------------------------------------------------------------------------- main
main() {
    cd "$ROOT"
    case "${1-}" in
        '') ;;
        --plan) plan; exit 0 ;;
        --fetch-wheels)
            [ -n "${2-}" ] || { echo "usage: bash tools/gpu_check.sh --fetch-wheels DIR [PYTHON_VERSION]" >&2; exit 2; }
            [ $# -le 3 ] || { echo "error: unexpected argument '$4' after --fetch-wheels DIR PYTHON_VERSION" >&2; exit 2; }
            fetch_wheels "$2" "${3-}"
            exit $? ;;
        *) echo "error: unknown argument '$1' (valid: --plan, --fetch-wheels DIR [PYTHON_VERSION], or none)" >&2
           exit 2 ;;
    esac
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
    if [ -f "$VENV/.softfree_mm_setup_done" ] && "$PY" -c 'import softfree_mm, mmdet' >/dev/null 2>&1; then
        :  # the project's environment, ready
    elif [ -n "$WHEELS" ]; then
        step setup 0 offline_setup "$WHEELS" "$VENV" || finish
    else
        step setup 0 bash tools/setup_env.sh || finish
    fi
    step cuda "${CAP[cuda]}" "$PY" -c '
import sys, torch
sys.path.insert(0, ".")
if not torch.cuda.is_available():
    print(f"error: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: a driver older than this build needs, or a CPU-only torch"); sys.exit(2)
p = torch.cuda.get_device_properties(0)
print(f"{torch.cuda.device_count()} x {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB), bf16 {torch.cuda.is_bf16_supported()}")
    ' || finish
    HALF=$(timeout 60 "$PY" -c 'import torch; print("bf16" if torch.cuda.is_bf16_supported() else "fp16")')
    KERNELS=(softmax poly relu sigmoid linear inline poly:degree=1 soft:num_landmarks=64)
    wanted fused && step fused "${CAP[fused]}" env SOFTFREE_ATTN_TUNE=0 "$PY" -m pytest \
        tests/attention/test_attention_fused.py tests/attention/test_attention_fused_linear.py -q -p no:cacheprovider -x
    # shellcheck disable=SC2086  # TOKENS: a list of numbers
    wanted bench-bf16 && step "bench-$HALF" "${CAP[bench-bf16]}" "$PY" tools/benchmark.py kernels --device cuda \
        --dtype "$HALF" --tokens $TOKENS --backward --heads 4 --head-dim 64 --ceilings --kernels "${KERNELS[@]}" \
        --csv "$OUT/kernels_$HALF.csv"
    # shellcheck disable=SC2086
    wanted bench-anchor && step bench-anchor "${CAP[bench-anchor]}" "$PY" tools/benchmark.py kernels --device cuda \
        --dtype "$HALF" --tokens $FIXED_TOKENS --backward --batch 8 --heads 16 --head-dim 64 --no-memory --repeats 3 \
        --kernels softmax linear poly:degree=1 inline peer:fbi_la --csv "$OUT/kernels_anchor_$HALF.csv"
    wanted bench-window && step bench-window "${CAP[bench-window]}" "$PY" tools/benchmark.py kernels --device cuda \
        --dtype "$HALF" --tokens 49 --backward --batch 4096 --heads 3 --head-dim 32 --no-memory --repeats 3 \
        --kernels softmax poly relu linear inline --csv "$OUT/kernels_window_$HALF.csv"
    wanted detector && step detector "${CAP[detector]}" "$PY" tools/benchmark.py detector --device cuda --batch 2 \
        --size 800x1216 --repeats 3 --csv "$OUT/detector.csv" --profile "$OUT" --detectors swin_t:mmdet \
        swin_t:softmax swin_t:inline pvt_v2_b2:mmdet pvt_v2_b2:softmax pvt_v2_b2:poly3
    wanted detector-bf16 && step detector-bf16 "${CAP[detector-bf16]}" "$PY" tools/benchmark.py detector \
        --device cuda --dtype "$HALF" --batch 2 --size 800x1216 --repeats 3 --csv "$OUT/detector_$HALF.csv" \
        --detectors pvt_v2_b2:mmdet pvt_v2_b2:softmax pvt_v2_b2:softmax+nosr pvt_v2_b2:inline \
        xcit_s12:linear+factorised xcit_s12:linear
    # shellcheck disable=SC2086
    wanted bench-fp32 && step bench-fp32 "${CAP[bench-fp32]}" "$PY" tools/benchmark.py kernels --device cuda \
        --dtype fp32 --tokens $TOKENS --backward --heads 4 --head-dim 64 --ceilings --kernels "${KERNELS[@]}" \
        --csv "$OUT/kernels_fp32.csv"
    # what each kernel costs as images grow, in bf16 (fp16 without bf16): the CPU sweep's layouts and kernels, sizes
    # a lent GPU does in its share of the budget (each case capped at 30 s), whole models left to the CPU sweep
    wanted cost && step cost "${CAP[cost]}" "$PY" tools/benchmark.py backbone --device cuda --dtype "$HALF" --layouts \
        pvt_v2_b2 pvt_v2_b2_nosr swin_t --kernels softmax poly3 linear inline --short-sides 800 1600 \
        --large-side 0 --seg-size 0 --no-models --repeats 3 --time-limit 30 --mem-limit 64 --csv "$OUT/cost_$HALF.csv"
    wanted warm-start && step warm-start "${CAP[warm-start]}" "$PY" tools/analysis/warm_start_grid.py --cost \
        configs/transfer_xcit_s12_poly3.py configs/transfer_swin_t_poly3.py --device cuda --batch 64 --steps 5 \
        --csv "$OUT/warm_start_cost.csv"
    wanted tests && step tests "${CAP[tests]}" "$PY" -m pytest tests/test_cuda.py -q -p no:cacheprovider -rs
    finish
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
