#!/usr/bin/env bash
# One-time set-up of the environment the README's commands use; later calls return at once (a stamp file holding a
# hash of this script, the requirements and the options below: change one and the set-up runs again).
#   - a virtual environment ($SOFTFREE_VENV, default .venv) on $PYTHON: a CPython of those setup.py's PYTHONS
#     names (default: the existing environment's own, else python3); another interpreter than an existing
#     environment's is one line saying how to set up beside it, an unsupported one one line naming the supported;
#   - torch $TORCH_VERSION / torchvision $TORCHVISION_VERSION when the Python has no torch (an existing torch is
#     respected: the venv then sees the system site-packages); with TORCH_INDEX_URL, the build of that index
#     replaces a torch of another CUDA (clusters whose driver is older than the default wheel's CUDA 13 needs):
#       TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 bash tools/setup_env.sh
#   - mmcv 2.1.0 without a compiler (the default): mmcv-lite 2.1.0 (mmcv's Python, no compiled ops), whose
#     mmcv._ext softfree_mm serves from torchvision's kernels on every device (softfree_mm/mmcv_ext/, put in place
#     in every process of the venv by softfree_mm-mmcv-ext.pth, which the package's install writes);
#   - opt-in, MMCV_COMPILED=1: mmcv 2.1.0 built from source with its own CPU ops (a C++ compiler, about 25 minutes
#     on 2 cores), with the C++20 rewrite torch 2.14's headers need (mmcv's setup.py pins -std=c++17);
#   - opt-in, MMCV_CUDA=1 (implies MMCV_COMPILED=1): mmcv's own CUDA ops compiled too (nvcc of torch's CUDA major
#     and gcc >= 10 checked, an explicit TORCH_CUDA_ARCH_LIST (default: this node's GPUs), MAX_JOBS capped by CPUs
#     and memory, no cached wheel reused, and a check that runs nms and roi_align on the GPU);
#   - mmengine, mmdet, mmsegmentation, mmpretrain, timm and the rest (requirements/), then this package (-e).
# What is installed is the lock by default (requirements/lock/: every package at the exact version CI tested, with
# hashes; py3.X.txt for this Python where the Pythons' resolutions differ, else all.txt; written by `make lock`), in one
# pip call (--require-hashes --no-deps), checked against the venv afterwards (tools/lockfile.py). Where a path brings
# a package from elsewhere, only that is not from the lock: an existing torch or TORCH_INDEX_URL (torch, torchvision,
# triton and CUDA's libraries), a compiled mmcv (mmcv-lite). SOFTFREE_LOCK=none installs the loose requirements
# instead (the newest they allow: `make newest`), SOFTFREE_LOCK=FILE another lock. The lock is for Linux x86_64;
# elsewhere the loose requirements are installed. Every call also makes ~/.cache/mim (mim's first process creates it
# without exist_ok: mim processes started side by side in a new home folder would race).
# An installed mmcv 2.1.0 with compiled ops whose nms / roi_align run is kept (a compiled _ext is always preferred
# to the stand-in). Every pip call takes requirements/constraints.txt ($SOFTFREE_CONSTRAINTS: setuptools < 82).
#   bash tools/setup_env.sh --print-mmcv-plan     prints what the mmcv step will install with these variables, exits
#   bash tools/setup_env.sh --check-mmcv-source  runs the mmcv source install to its metadata step (pip --dry-run) in
#   a scratch venv with the same pip calls, then exits: seconds, no compile (the test suite runs it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${SOFTFREE_VENV:-$ROOT/.venv}
TORCH_VERSION=${TORCH_VERSION:-2.14.1}
TORCHVISION_VERSION=${TORCHVISION_VERSION:-0.29.1}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
MMCV_CUDA=${MMCV_CUDA:-0}
CONSTRAINTS=${SOFTFREE_CONSTRAINTS:-$ROOT/requirements/constraints.txt}
log() { echo "[setup_env] $*" >&2; }
die() { echo "[setup_env] error: $*" >&2; exit 2; }
MODE=setup
case "${1-}" in
  '') ;;
  --check-mmcv-source) MODE=check-mmcv-source ;;
  --print-mmcv-plan) MODE=print-mmcv-plan ;;
  *) die "unknown argument '$1' (valid: --print-mmcv-plan, --check-mmcv-source)" ;;
esac
# the interpreter: the supported ones are setup.py's PYTHONS (its python_requires and classifiers come from there)
SUPPORTED=$(sed -n "s/^PYTHONS = (\(.*\))$/\1/p" setup.py | tr -d "' " | tr ',' ' ')
RANGE="${SUPPORTED%% *} to ${SUPPORTED##* }"
PYTHON_ASKED=${PYTHON:+1}
if [ -z "$PYTHON_ASKED" ]; then
  PYTHON=python3
  [ -x "$VENV/bin/python" ] && PYTHON="$VENV/bin/python"  # an existing environment keeps its interpreter
fi
py_id() {  # py_id PYTHON: "CPython 3.12.1" (empty when it does not run)
  "$1" -c 'import platform, sys; print(platform.python_implementation(), "%d.%d.%d" % sys.version_info[:3])' \
    2>/dev/null || true
}
PY_ID=$(py_id "$PYTHON")
[ -n "$PY_ID" ] || die "PYTHON=$PYTHON does not run; set PYTHON to a CPython $RANGE (e.g. PYTHON=python3.12)"
PY_VERSION=${PY_ID#* }
PY_MINOR=${PY_VERSION%.*}
case "${PY_ID%% *}: $SUPPORTED " in
  "CPython: "*"$PY_MINOR "*) ;;
  *) die "$PY_ID ($PYTHON) is not supported: softfree_mm runs on CPython $RANGE; set PYTHON to one of them, e.g. \
PYTHON=python${SUPPORTED##* } make setup" ;;
esac
if [ -n "$PYTHON_ASKED" ] && [ -x "$VENV/bin/python" ]; then
  HAVE=$(py_id "$VENV/bin/python")
  [ "$HAVE" = "$PY_ID" ] || die "$VENV is ${HAVE:-a broken environment}, PYTHON=$PYTHON is $PY_ID: remove it \
(rm -rf $VENV) to set up again with $PY_ID, or set up beside it: make setup test VENV=.venv-$PY_MINOR PYTHON=$PYTHON"
fi
# the lock for this Python (requirements/lock/), 'none' for the loose requirements
case "${SOFTFREE_LOCK-}" in
  none) LOCK= ;;
  '') LOCK=requirements/lock/py$PY_MINOR.txt
      [ -f "$LOCK" ] || LOCK=requirements/lock/all.txt
      [ -f "$LOCK" ] || die "no lock for Python $PY_MINOR in requirements/lock/: run make newest and make lock, or set \
SOFTFREE_LOCK=none to install the loose requirements" ;;
  *) LOCK=$SOFTFREE_LOCK
     [ -f "$LOCK" ] || die "SOFTFREE_LOCK: no such file '$LOCK' (none installs the loose requirements)" ;;
esac
if [ -n "$LOCK" ] && [ "$(uname -sm)" != "Linux x86_64" ]; then
  log "the lock is for Linux x86_64, this is $(uname -sm): installing the loose requirements (SOFTFREE_LOCK=none)"
  LOCK=
fi
[ "$MMCV_CUDA" = 0 ] || [ "$MMCV_CUDA" = 1 ] || die "MMCV_CUDA must be 0 or 1, got '$MMCV_CUDA'"
case "${MMCV_COMPILED-}" in
  '') MMCV_COMPILED=$MMCV_CUDA ;;  # CUDA ops are compiled ops
  0|1) [ "$MMCV_CUDA$MMCV_COMPILED" != 10 ] || die "MMCV_CUDA=1 compiles mmcv's ops: it cannot go with MMCV_COMPILED=0" ;;
  *) die "MMCV_COMPILED must be 0 or 1, got '$MMCV_COMPILED'" ;;
esac
# mmcv 2.1.0's setup.py reads __version__ from locals() after exec(), which Python 3.13 no longer fills (PEP 667)
if { [ "$MMCV_COMPILED" = 1 ] || [ "$MODE" = check-mmcv-source ]; } && [ "${PY_MINOR#3.}" -ge 13 ]; then
  die "MMCV_COMPILED=1 cannot work on Python $PY_MINOR: mmcv 2.1.0's setup.py reads its version from locals() \
after exec(), which Python 3.13 changed; build it with Python 3.11 or 3.12 (PYTHON=python3.12), or use the default \
set-up (mmcv-lite, no compiler)"
fi
if [ "$MMCV_CUDA" = 1 ]; then
  MMCV_PLAN="mmcv 2.1.0 built from source with CPU and CUDA ops (nvcc and a C++ compiler; tens of minutes)"
elif [ "$MMCV_COMPILED" = 1 ]; then
  MMCV_PLAN="mmcv 2.1.0 built from source with CPU ops (a C++ compiler; about 25 minutes on 2 cores)"
else
  MMCV_PLAN="mmcv-lite 2.1.0, its ops served from torchvision (softfree_mm/mmcv_ext; no compiler)"
fi
if [ "$MODE" = print-mmcv-plan ]; then
  echo "$MMCV_PLAN"
  exit 0
fi
[ -f "$CONSTRAINTS" ] || die "SOFTFREE_CONSTRAINTS: no such file '$CONSTRAINTS'"
STAMP="$VENV/.softfree_mm_setup_done"
HASH=$({ cat setup.py requirements/*.txt tools/setup_env.sh tools/lockfile.py "$CONSTRAINTS" ${LOCK:+"$LOCK"}
         echo "$PY_ID $TORCH_VERSION $TORCHVISION_VERSION $TORCH_INDEX_URL $MMCV_CUDA $MMCV_COMPILED lock=$LOCK"; } \
       | sha256sum | cut -c1-16)
# mim's cache folder, before any mim process can start in this home folder (mim's import makes it without exist_ok)
mkdir -p ~/.cache/mim 2>/dev/null || true

if [ "$MODE" = setup ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  exit 0
fi
CONSTRAINTS=$(cd "$(dirname "$CONSTRAINTS")" && pwd)/$(basename "$CONSTRAINTS")
export PIP_CONSTRAINT="$CONSTRAINTS"  # also for build environments pip makes on its own
pip_in() { "$1" -m pip install --disable-pip-version-check -c "$CONSTRAINTS" "${@:2}"; }  # pip_in PYTHON ARGS...
# mmcv from source, the one command both the set-up and --check-mmcv-source run (the check adds --dry-run)
MMCV_SOURCE=(--no-build-isolation --no-binary mmcv --no-cache-dir "mmcv==2.1.0")
build_mmcv() {  # build_mmcv [PIP ARGS...]: mmcv from source into $PY's environment (the check adds --dry-run)
  local wrap real tool
  wrap=$(mktemp -d)
  # torch >= 2.14 headers need C++20; mmcv's setup.py pins -std=c++14/17 for g++ and nvcc
  for tool in c++ nvcc; do
    real=$(command -v "$tool" || true)
    [ "$tool" = nvcc ] && [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ] && real="$CUDA_HOME/bin/nvcc"
    [ -n "$real" ] || continue
    cat > "$wrap/$tool" <<WRAPPER
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  case "\$a" in -std=c++14|-std=c++17) args+=(-std=c++20) ;; *) args+=("\$a") ;; esac
done
exec "$real" "\${args[@]}"
WRAPPER
    chmod +x "$wrap/$tool"
  done
  local cpus mem_gib per_job build_env=()
  cpus=$(nproc)
  mem_gib=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 8)
  if [ "$MMCV_CUDA" = 1 ]; then
    [ -x "$wrap/nvcc" ] || die "MMCV_CUDA=1 needs nvcc: set CUDA_HOME to a CUDA toolkit of torch's CUDA major"
    local torch_cuda nvcc_cuda gcc_major
    torch_cuda=$("$PY" -c 'import torch; print(torch.version.cuda or "")')
    [ -n "$torch_cuda" ] || die "MMCV_CUDA=1: this torch is a CPU-only build (set TORCH_INDEX_URL to a CUDA one)"
    nvcc_cuda=$("$wrap/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
    [ "${nvcc_cuda%%.*}" = "${torch_cuda%%.*}" ] || \
      die "MMCV_CUDA=1: nvcc is CUDA $nvcc_cuda, torch is built for CUDA $torch_cuda: the majors must match"
    gcc_major=$(c++ -dumpversion | cut -d. -f1)
    [ "$gcc_major" -ge 10 ] || die "MMCV_CUDA=1: the C++20 rewrite needs gcc >= 10, c++ is $(c++ -dumpversion)"
    if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
      TORCH_CUDA_ARCH_LIST=$("$PY" -c 'import torch
caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
print(";".join(f"{a}.{b}" for a, b in caps))' 2>/dev/null || true)
      [ -n "$TORCH_CUDA_ARCH_LIST" ] || \
        die "MMCV_CUDA=1: no GPU visible to pick the architectures: set TORCH_CUDA_ARCH_LIST, e.g. '8.0;9.0'"
    fi
    per_job=4  # GiB an nvcc job can take
    build_env=(TORCH_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST" FORCE_CUDA=1 PYTORCH_NVCC="$wrap/nvcc")
    log "building mmcv 2.1.0 with CUDA ops (nvcc $nvcc_cuda, archs $TORCH_CUDA_ARCH_LIST)"
  else
    per_job=2
    build_env=(FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=)  # CPU ops only, also on a GPU node (mmcv asks torch for CUDA)
    log "building mmcv 2.1.0 with CPU ops from source${*:+ ($*)} (about 25 minutes on 2 cores, once)"
  fi
  local jobs=$(( mem_gib / per_job ))
  [ "$jobs" -ge 1 ] || jobs=1
  [ "$jobs" -le "$cpus" ] || jobs=$cpus
  jobs=${MAX_JOBS:-$jobs}
  log "MAX_JOBS=$jobs ($cpus CPUs, $mem_gib GiB available)"
  "$PY" -m pip uninstall -y -q mmcv mmcv-lite >/dev/null 2>&1 || true  # an mmcv without the ops asked for
  ( export "${build_env[@]}" CXX="$wrap/c++" MMCV_WITH_OPS=1 MAX_JOBS="$jobs"
    pip_in "$PY" "${MMCV_SOURCE[@]}" "$@" )
}

if [ "$MODE" = check-mmcv-source ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  "$PYTHON" -m venv "$scratch/venv"
  SPY="$scratch/venv/bin/python"
  pip_in "$SPY" -q -r requirements/build.txt
  # what the torch step would add (resolved, not downloaded), setuptools put in as it would be: torch requires
  # setuptools>=77.0.3, and only the constraints keep that below 82
  pip_in "$SPY" -q --dry-run --ignore-installed --report "$scratch/torch.json" \
    "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
  st=$("$SPY" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(next((i["metadata"]["version"] for i in r["install"] if i["metadata"]["name"].lower() == "setuptools"), ""))' \
       "$scratch/torch.json")
  [ -z "$st" ] || "$SPY" -m pip install -q --disable-pip-version-check --no-deps "setuptools==$st"
  echo "[setup_env] setuptools $("$SPY" -c 'import setuptools; print(setuptools.__version__)') at the mmcv step" >&2
  PY=$SPY build_mmcv -q --dry-run --no-deps
  echo "[setup_env] mmcv 2.1.0 source: metadata prepared" >&2
  exit 0
fi
case "${SOFTFREE_NEED_MIB-0}" in
  ''|*[!0-9]*) die "SOFTFREE_NEED_MIB must be a whole number of MiB (0 skips the disk check), got '$SOFTFREE_NEED_MIB'" ;;
esac

# free disk before anything is written: a set-up that runs out half-way leaves a broken venv and pip's bare OSError.
# Measured on a fresh venv: torch 2.14.1's CUDA build with its nvidia libraries and triton 5.2 GiB, the rest 1.0 GiB.
free_mib() {  # MiB free on the filesystem that holds $1 (its nearest existing parent)
  local d=$1
  while [ ! -e "$d" ]; do d=$(dirname "$d"); done
  df -Pk "$d" | awk 'NR == 2 {print int($4 / 1024)}'
}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  need_mib=${SOFTFREE_NEED_MIB:-512}; what="updates to an existing environment"
elif [ -n "$TORCH_INDEX_URL" ] || ! "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
  need_mib=${SOFTFREE_NEED_MIB:-6656}; what="torch $TORCH_VERSION (5.2 GiB with its CUDA libraries), mm packages, mmcv"
else
  need_mib=${SOFTFREE_NEED_MIB:-1536}; what="mm packages and mmcv (torch is reused)"
fi
for where in "$VENV" "${TMPDIR:-/tmp}"; do
  have_mib=$(free_mib "$where" 2>/dev/null || true)
  case "$have_mib" in ''|*[!0-9]*) continue ;; esac  # no df reading: nothing to check against
  [ "$have_mib" -ge "$need_mib" ] || die "$have_mib MiB free on the disk of $where; the set-up ($what) needs about \
$need_mib MiB: free some space, or point SOFTFREE_VENV / TMPDIR at a larger disk (SOFTFREE_NEED_MIB=0 skips this check)"
  [ "$where" != "$VENV" ] || need_mib=512  # pip's temporary files (an mmcv build from source) go to TMPDIR
done

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
    log "reusing the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
PIP=(pip_in "$PY")
# the groups of the lock (tools/lockfile.py GROUPS) this path installs from elsewhere
NOT_FROM_LOCK=()
if [ -n "$TORCH_INDEX_URL" ] || grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null; then
  NOT_FROM_LOCK+=(torch)
fi

[ -n "$LOCK" ] || "${PIP[@]}" -q -r requirements/build.txt
if [ -n "$TORCH_INDEX_URL" ]; then
  # the index's build tag (cu126, cpu...) against the installed torch's
  want=$(basename "${TORCH_INDEX_URL%/}")
  have=$("$PY" -c 'import torch; c = torch.version.cuda; print("cu" + c.replace(".", "") if c else "cpu")' \
         2>/dev/null || echo none)
  if [ "$have" != "$want" ]; then
    log "torch $TORCH_VERSION / torchvision $TORCHVISION_VERSION from $TORCH_INDEX_URL (installed: $have)"
    "$PY" -m pip uninstall -y -q torch torchvision >/dev/null 2>&1 || true
    "${PIP[@]}" --no-cache-dir "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" \
      --index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple
  fi
elif [ -z "$LOCK" ] && ! "$PY" -c 'import torch, torchvision' >/dev/null 2>&1; then
  log "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  "${PIP[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
[ -n "$LOCK" ] || "${PIP[@]}" -q "mmengine==0.10.7"

# a check that really runs nms and roi_align (an ABI mismatch of a compiled mmcv shows here, not at import); on CUDA
# with MMCV_CUDA=1. In a bare Python: the stand-in must be in place without importing softfree_mm.
OPS_RUN='import sys, torch; from mmcv.ops import nms, roi_align
dev = sys.argv[1]
b = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]], device=dev)
keep = nms(b, torch.tensor([0.9, 0.8, 0.7], device=dev), 0.5)[1]
assert keep.tolist() == [0, 2], keep
out = roi_align(torch.arange(64.0, device=dev).view(1, 1, 8, 8), torch.tensor([[0, 0, 0, 4, 4.]], device=dev),
                (2, 2), 1.0, 2, "avg", True)
assert out.device.type == dev and out.shape == (1, 1, 2, 2), out
assert "softfree_mm" not in sys.modules
print(f"mmcv nms and roi_align ran on {dev}")'
# an installed mmcv 2.1.0 with compiled ops (mmcv/_ext*.so) is kept when its ops run (and, with MMCV_CUDA=1, were
# compiled with CUDA)
COMPILED_OK='import importlib.util, mmcv; assert mmcv.__version__ == "2.1.0"
assert importlib.util.find_spec("mmcv._ext").origin.endswith(".so")'
if [ "$MMCV_CUDA" = 1 ]; then
  COMPILED_OK="$COMPILED_OK"'
from mmcv.ops import get_compiling_cuda_version as v; assert v() not in ("not available", "")'
fi

MMCV_STEP=lite
if "$PY" -c "$COMPILED_OK" >/dev/null 2>&1 && "$PY" -c "$OPS_RUN" cpu >/dev/null 2>&1; then
  MMCV_STEP=keep
elif [ "$MMCV_COMPILED" = 1 ]; then
  MMCV_STEP=build
fi
[ "$MMCV_STEP" = lite ] || NOT_FROM_LOCK+=(mmcv)
if [ "$MMCV_STEP" = lite ]; then
  "$PY" -m pip uninstall -y -q mmcv >/dev/null 2>&1 || true  # a compiled mmcv whose ops do not run, or another one
fi
if [ -n "$LOCK" ]; then
  log "installing $LOCK${NOT_FROM_LOCK[*]:+ (not from it: ${NOT_FROM_LOCK[*]})}"
  selected=$(mktemp)
  "$PY" tools/lockfile.py select "$LOCK" --not-from-lock "${NOT_FROM_LOCK[@]}" > "$selected"
  "${PIP[@]}" -q --require-hashes --no-deps -r "$selected" || { rm -f "$selected"; die "installing $LOCK failed"; }
  rm -f "$selected"
fi
case "$MMCV_STEP" in
  keep) log "keeping the installed mmcv 2.1.0 with compiled ops" ;;
  build) build_mmcv ;;
  lite) log "$MMCV_PLAN"
        [ -n "$LOCK" ] || "${PIP[@]}" -q -r requirements/mmcv.txt ;;
esac

[ -n "$LOCK" ] || "${PIP[@]}" -q -r requirements/runtime.txt -r requirements/tests.txt
"${PIP[@]}" -q --no-build-isolation --no-deps -e .  # also writes softfree_mm-mmcv-ext.pth into site-packages
if [ -n "$LOCK" ]; then  # exactly the lock, but for the groups this path installs from elsewhere
  diff=$("$PY" tools/lockfile.py check "$LOCK" --not-from-lock "${NOT_FROM_LOCK[@]}" 2>/dev/null || true)
  extra=$(grep -E ' installed, not in the lock$' <<< "$diff" || true)
  [ -z "$extra" ] || log "installed beside the lock (not the set-up's): $(paste -sd, <<< "$extra" | sed 's/,/, /g')"
  diff=$(grep -vE ' installed, not in the lock$' <<< "$diff" || true)
  [ -z "$diff" ] || die "$VENV differs from $LOCK: $(paste -sd, <<< "$diff" | sed 's/,/, /g')"
fi
if "$PY" -c 'import transformers' >/dev/null 2>&1; then
  log "warning: transformers is installed; it switches on mmpretrain's multimodal code, which fails to import"
fi
"$PY" -c "$OPS_RUN" cpu >/dev/null || die "mmcv's nms / roi_align do not run (python -c 'from mmcv.ops import nms')"
if [ "$MMCV_CUDA" = 1 ]; then
  "$PY" -c "$OPS_RUN" cuda || die "MMCV_CUDA=1: mmcv's CUDA ops do not run on the GPU"
fi
"$PY" -c 'import mmdet.models, mmseg.models, mmpretrain.models, softfree_mm'
"$PY" -c 'import json, sys; print(json.dumps(dict(lock=sys.argv[1] or None, not_from_lock=sys.argv[2:])))' \
  "$LOCK" "${NOT_FROM_LOCK[@]}" > "$VENV/.softfree_mm_lock"  # what tests/tools/test_lock.py compares
echo "$HASH" > "$STAMP"
log "environment ready: $VENV"
