#!/usr/bin/env bash
# `make test-pythons`: a slice of the test suite on every other supported CPython this machine has (setup.py's
# PYTHONS but the one of the main environment, $SOFTFREE_VENV or .venv), each in an environment of its own,
# .venv-3.X, set up by tools/setup_env.sh as `PYTHON=... make setup` does. `make test` runs the whole suite on the main
# environment's Python; CI (.ci/run) runs both, so every supported Python is exercised on every change.
#   PYTHONS="python3.12 /opt/py313/bin/python3"   the interpreters to use instead of looking for them
# An interpreter is looked for as python3.X on PATH (one that runs: a pyenv shim of a version not selected does not)
# and under pyenv's versions ($PYENV_ROOT, or the folder above a .../shims entry of PATH).
# The slice is what differs between Python versions: the install and the import machinery (the .pth that serves
# mmcv._ext in every process, wheel and editable installs, mim), the set-up's own checks and its lock, the import
# graph, the kernels in their pure-torch forms, the backbones and their checkpoint conversion, the warm start's
# transfer, training with kill-and-resume, distributed training on torchrun, and the demo's chain on real mmdet /
# mmpretrain runners; about 5 minutes per interpreter here, beside the set-up's 3.
# An environment this run made is removed after its slice (each holds a ~6.4 GB torch; three side by side filled CI's
# disk): KEEP_VENVS=1 keeps them, and an environment that was there before is always kept.
# NEWEST=1 (`make newest`): the newest versions the loose requirements allow, on purpose: every supported Python, the
# main environment's too, each in .venv-newest-3.X set up from the loose requirements (SOFTFREE_LOCK=none) instead of
# the lock; where the slice passes, the versions it ran with go to work_dirs/newest/py3.X.txt, which `make lock`
# (tools/lock.sh) turns into the lock. A record of an earlier run of that Python is removed first.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SLICE=(tests/test_layering.py tests/test_mmcv_ext.py tests/tools/test_mim.py tests/tools/test_setup_env.py
       tests/tools/test_lock.py tests/tools/test_setup_source_build.py
       tests/attention/test_attention_pure_torch.py
       tests/attention/test_attention_inline.py tests/attention/test_attention_soft.py
       tests/models/test_backbones_kit.py tests/models/test_convert_checkpoint.py tests/models/test_transfer.py
       tests/engine/test_tools_resume.py tests/tools/test_tools_dist.py tests/demo/test_demo_train.py)
log() { echo "[test_pythons] $*" >&2; }
SUPPORTED=$(sed -n "s/^PYTHONS = (\(.*\))$/\1/p" setup.py | tr -d "' " | tr ',' ' ')
MAIN_VENV=${SOFTFREE_VENV:-.venv}
MAIN=$("$MAIN_VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)

minor_of() {  # minor_of PYTHON: "3.12" when it runs, else nothing
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

find_python() {  # find_python 3.X: the first interpreter of that version found, else nothing
  local v=$1 c roots=() d
  [ -n "${PYENV_ROOT:-}" ] && roots+=("$PYENV_ROOT")
  IFS=: read -r -a path_dirs <<< "$PATH"
  for d in "${path_dirs[@]}"; do
    case "$d" in */shims) roots+=("${d%/shims}") ;; esac
  done
  for c in "$(command -v "python$v" || true)" $(for d in "${roots[@]}"; do ls -d "$d/versions/$v"*/bin/"python$v" \
           2>/dev/null; done); do
    [ -n "$c" ] && [ "$(minor_of "$c")" = "$v" ] && { echo "$c"; return; }
  done
}

NEWEST=${NEWEST:-}
RECORDS=${NEWEST_DIR:-work_dirs/newest}
[ -z "$NEWEST" ] || MAIN=  # every supported Python
if [ -n "${PYTHONS:-}" ]; then
  read -r -a WANT <<< "$PYTHONS"
else
  WANT=()
  for v in $SUPPORTED; do
    [ "$v" = "$MAIN" ] && continue
    c=$(find_python "$v")
    if [ -n "$c" ]; then WANT+=("$c"); else log "Python $v: not found on this machine (python$v on PATH, pyenv)"; fi
  done
fi
[ "${#WANT[@]}" -gt 0 ] || { log "no other supported Python ($SUPPORTED but $MAIN) on this machine: nothing to run"; exit 0; }

status=0
summary=()
for python in "${WANT[@]}"; do
  v=$(minor_of "$python")
  [ -n "$v" ] || { log "error: $python does not run"; status=1; summary+=("$python: does not run"); continue; }
  venv=".venv-$v"
  lock=${SOFTFREE_LOCK-}
  if [ -n "$NEWEST" ]; then
    venv=".venv-newest-$v"; lock=none
    rm -f "$RECORDS/py$v.txt"
  fi
  made=0; [ -e "$venv" ] || made=1
  t0=$SECONDS
  log "Python $v ($python): set-up of $venv${lock:+ from the loose requirements}"
  if ! SOFTFREE_VENV="$ROOT/$venv" PYTHON="$python" SOFTFREE_LOCK="$lock" bash tools/setup_env.sh; then
    status=1; summary+=("Python $v: the set-up failed")
    [ "$made" = 1 ] && [ -z "${KEEP_VENVS:-}" ] && rm -rf "$venv"
    continue
  fi
  t1=$SECONDS
  log "Python $v: the slice (${#SLICE[@]} files)"
  if "$venv/bin/python" -m pytest "${SLICE[@]}" -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist loadfile \
       --no-loadscope-reorder ${PYTEST_ARGS:-}; then
    summary+=("Python $v: passed (set-up $((t1 - t0)) s, slice $((SECONDS - t1)) s)")
    if [ -n "$NEWEST" ]; then  # what passed: the record tools/lock.sh locks
      mkdir -p "$RECORDS"
      { echo "# inputs $(bash tools/lock.sh --inputs-hash)"; "$venv/bin/python" tools/lockfile.py installed; } \
        > "$RECORDS/py$v.txt"
      summary+=("Python $v: versions in $RECORDS/py$v.txt (make lock writes the lock from them)")
    fi
  else
    status=1; summary+=("Python $v: FAILED (set-up $((t1 - t0)) s, slice $((SECONDS - t1)) s)")
  fi
  if [ "$made" = 1 ] && [ -z "${KEEP_VENVS:-}" ]; then
    log "Python $v: removing $venv (made by this run; KEEP_VENVS=1 keeps it)"; rm -rf "$venv"
  fi
done
for line in "${summary[@]}"; do log "$line"; done
exit $status
