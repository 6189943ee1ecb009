#!/usr/bin/env bash
# `make lock`: requirements/lock/ from what `make newest` tested. `make newest` (tools/test_pythons.sh with NEWEST=1)
# sets up a venv from the loose requirements on every supported Python (setup.py's PYTHONS), runs the slice of the
# suite that `make test-pythons` runs on it, and when the slice passes records the versions it ran with in
# work_dirs/newest/py3.X.txt. This script resolves the set-up's requirements once per Python with those versions as
# constraints (uv pip compile, exact versions with every file's sha256 for Linux x86_64), so that the lock holds
# exactly what passed: it refuses when a Python has no record, or a record of other requirements than today's (run
# `make newest` again). Where every Python resolves alike, one file: requirements/lock/all.txt; else py3.X.txt each.
# tools/setup_env.sh installs the lock by default (pip, --require-hashes --no-deps).
#   bash tools/lock.sh --inputs-hash   prints the hash of the loose requirements a record must carry, and exits
# uv (UV_VERSION) is installed into work_dirs/lock-tool on first use. NEWEST_DIR: where the records are.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
UV_VERSION=0.13.9
RECORDS=${NEWEST_DIR:-work_dirs/newest}
OUT=requirements/lock
PLATFORM=x86_64-manylinux_2_28  # the wheels torch 2.14.1 publishes for Linux x86_64
# the set-up's loose requirements (tools/setup_env.sh with SOFTFREE_LOCK=none installs these, torch at its pins)
INPUTS=(requirements/build.txt requirements/mmcv.txt requirements/runtime.txt requirements/tests.txt)
log() { echo "[lock] $*" >&2; }
die() { echo "[lock] error: $*" >&2; exit 2; }
canonical() {  # NAME==VERSION lines, the name as pip compares it (any case; '-', '_' and '.' alike), sorted
  awk -F'==' '{n = tolower($1); gsub(/[-_.]+/, "-", n); split($2, v, " "); print n "==" v[1]}' | sort
}
pin_of() { sed -n "s/^$1=\${$1:-\(.*\)}\$/\1/p" tools/setup_env.sh; }  # pin_of TORCH_VERSION: setup_env's default

inputs_hash() {  # the loose requirements, the constraints and the set-up's torch pins
  { cat "${INPUTS[@]}" requirements/onnx.txt requirements/constraints.txt
    echo "torch==$(pin_of TORCH_VERSION) torchvision==$(pin_of TORCHVISION_VERSION)"; } | sha256sum | cut -c1-16
}
case "${1-}" in
  '') ;;
  --inputs-hash) inputs_hash; exit 0 ;;
  *) die "unknown argument '$1' (valid: --inputs-hash)" ;;
esac

read -r -a SUPPORTED <<< "$(sed -n "s/^PYTHONS = (\(.*\))$/\1/p" setup.py | tr -d "' " | tr ',' ' ')"
HASH=$(inputs_hash)
missing=()
for v in "${SUPPORTED[@]}"; do
  record=$RECORDS/py$v.txt
  if [ ! -f "$record" ]; then
    missing+=("Python $v: no record")
  elif [ "$(head -1 "$record")" != "# inputs $HASH" ]; then
    missing+=("Python $v: $record is of other requirements")
  fi
done
[ "${#missing[@]}" = 0 ] || die "$(IFS=';'; echo "${missing[*]}" | sed 's/;/; /g') (make newest tests the loose \
requirements on every supported Python and records what passed)"

UV=work_dirs/lock-tool/bin/uv
if [ "$("$UV" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  log "installing uv $UV_VERSION into work_dirs/lock-tool"
  python3 -m venv work_dirs/lock-tool
  work_dirs/lock-tool/bin/python -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for v in "${SUPPORTED[@]}"; do
  # pip is the installer the venv brings (tools/setup_env.sh installs --no-deps): not pinned
  "$UV" pip compile -q "${INPUTS[@]}" -c requirements/constraints.txt -c "$RECORDS/py$v.txt" --python-version "$v" \
    --python-platform "$PLATFORM" --generate-hashes --no-header --no-annotate --no-emit-package pip \
    -o "$tmp/py$v.txt" || die "Python $v: the requirements do not resolve to the recorded versions (above)"
  # the lock holds exactly what passed: every recorded package at its version, nothing else
  diff <(grep -v '^#' "$RECORDS/py$v.txt" | canonical) <(grep -E '^[A-Za-z0-9]' "$tmp/py$v.txt" | canonical) \
    > "$tmp/diff" || die "Python $v: the lock would differ from what passed (< recorded, > resolved): \
$(cat "$tmp/diff")"
done
header() {  # header PYTHONS...
  local pythons day
  pythons=$(echo "$*" | sed 's/ /, /g')
  day=$(date -u -r "$RECORDS/py$1.txt" +%F)
  echo "# The set-up's exact versions for Python $pythons on Linux x86_64, as \`make newest\` tested them on $day."
  echo "# Written by \`make lock\` (tools/lock.sh, uv $UV_VERSION); do not edit: the loose statement is" \
       "requirements/*.txt."
}
first=${SUPPORTED[0]}
same=1
for v in "${SUPPORTED[@]}"; do cmp -s "$tmp/py$first.txt" "$tmp/py$v.txt" || same=0; done
mkdir -p "$OUT"
rm -f "$OUT"/all.txt "$OUT"/py3.*.txt
if [ "$same" = 1 ]; then
  { header "${SUPPORTED[@]}"; cat "$tmp/py$first.txt"; } > "$OUT/all.txt"
  log "$OUT/all.txt: $(grep -cE '^[A-Za-z0-9]' "$OUT/all.txt") packages, alike on Python ${SUPPORTED[*]}"
else
  for v in "${SUPPORTED[@]}"; do
    { header "$v"; cat "$tmp/py$v.txt"; } > "$OUT/py$v.txt"
    log "$OUT/py$v.txt: $(grep -cE '^[A-Za-z0-9]' "$OUT/py$v.txt") packages"
  done
fi
