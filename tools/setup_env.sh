#!/usr/bin/env bash
# One-time set-up of the environment the README's commands use; later calls return at once (stamp file).
#   - a virtual environment ($SOFTFREE_VENV, default .venv);
#   - torch 2.14.1 / torchvision 0.29.1 when the Python has no torch (an existing torch is respected: the venv
#     then sees the system site-packages);
#   - mmcv 2.1.0 with compiled ops: a matching prebuilt wheel from $SOFTFREE_WHEELS (default ../shared/wheels) when
#     present, else built from source (CPU ops; CUDA ops where nvcc and a GPU exist), with the C++20 rewrite that
#     torch 2.14's headers need (mmcv's setup.py pins -std=c++17);
#   - mmengine, mmdet, mmsegmentation, mmpretrain, timm and the rest (requirements/), then this package (-e).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
VENV=${SOFTFREE_VENV:-$ROOT/.venv}
WHEELS=${SOFTFREE_WHEELS:-$ROOT/../shared/wheels}
TORCH_VERSION=${TORCH_VERSION:-2.14.1}
TORCHVISION_VERSION=${TORCHVISION_VERSION:-0.29.1}
STAMP="$VENV/.softfree_mm_setup_done"
HASH=$(cat setup.py requirements/*.txt tools/setup_env.sh | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  exit 0
fi
log() { echo "[setup_env] $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
    log "reusing the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check)

"${PIP[@]}" -q -r requirements/build.txt
if ! "$PY" -c 'import torch, torchvision' >/dev/null 2>&1; then
  log "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  "${PIP[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
"${PIP[@]}" -q "mmengine==0.10.7"

if ! "$PY" -c 'import mmcv; assert mmcv.__version__ == "2.1.0"; from mmcv.ops import nms, roi_align' >/dev/null 2>&1; then
  have_torch=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
  if [ -d "$WHEELS" ] && ls "$WHEELS"/mmcv-2.1.0-*.whl >/dev/null 2>&1 && [ "$have_torch" = "2.14.1" ]; then
    log "mmcv 2.1.0 from the prebuilt wheel in $WHEELS (built against torch 2.14.1)"
    "${PIP[@]}" --no-deps --no-index --find-links "$WHEELS" "mmcv==2.1.0"
  else
    log "building mmcv 2.1.0 with ops from source (about 25 minutes on 2 cores, once)"
    WRAP=$(mktemp -d)
    # torch >= 2.14 headers need C++20; mmcv's setup.py pins -std=c++14/17 for g++ and nvcc
    for tool in c++ nvcc; do
      real=$(command -v "$tool" || true)
      [ "$tool" = nvcc ] && [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ] && real="$CUDA_HOME/bin/nvcc"
      [ -n "$real" ] || continue
      cat > "$WRAP/$tool" <<WRAPPER
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  case "\$a" in -std=c++14|-std=c++17) args+=(-std=c++20) ;; *) args+=("\$a") ;; esac
done
exec "$real" "\${args[@]}"
WRAPPER
      chmod +x "$WRAP/$tool"
    done
    export CXX="$WRAP/c++" MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
    if [ -x "$WRAP/nvcc" ] && "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
      export FORCE_CUDA=1 PYTORCH_NVCC="$WRAP/nvcc"
      log "CUDA found: building CUDA ops too"
    fi
    "${PIP[@]}" --no-build-isolation --no-binary mmcv "mmcv==2.1.0"
  fi
fi
"$PY" -c 'from mmcv.ops import nms, roi_align' || { log "mmcv ops did not import"; exit 1; }

"${PIP[@]}" -q -r requirements/runtime.txt -r requirements/tests.txt
"${PIP[@]}" -q --no-build-isolation --no-deps -e .
if "$PY" -c 'import transformers' >/dev/null 2>&1; then
  log "warning: transformers is installed; it switches on mmpretrain's multimodal code, which fails to import"
fi
"$PY" -c 'import softfree_mm, mmdet.models, mmseg.models, mmpretrain.models' 
echo "$HASH" > "$STAMP"
log "environment ready: $VENV"
