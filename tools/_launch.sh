# Shared by tools/dist_train.sh and tools/dist_test.sh (sourced): a free port, and the device preflight.

# the user asked for CPU: --device cpu / --device=cpu among the tool's options, or SOFTFREE_MM_DEVICE=cpu
wants_cpu() {
    [ "${SOFTFREE_MM_DEVICE:-}" = cpu ] && return 0
    local prev=""
    for a in "$@"; do
        [ "$a" = "--device=cpu" ] && return 0
        [ "$prev" = "--device" ] && [ "$a" = cpu ] && return 0
        prev=$a
    done
    return 1
}

# a TCP port free on this machine now (single-node runs: two jobs on one node must not share 29500)
free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# before torchrun starts N processes: CUDA must work unless CPU was asked for (one line, exit status 2).
# softfree_mm/engine/device.py runs as a script: it needs torch only (importing the package loads the mm stack)
device_preflight() {
    wants_cpu "$@" && return 0
    local script
    script=$(PYTHONPATH="$ROOT:${PYTHONPATH:-}" "$PYTHON" -c 'import importlib.util, os
spec = importlib.util.find_spec("softfree_mm")
print(os.path.join(os.path.dirname(spec.origin), "engine", "device.py"))') || return 2
    "$PYTHON" "$script" --launcher pytorch "$@" >/dev/null
}
