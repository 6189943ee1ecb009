# Shared by the launchers (sourced): a free port and the device preflight (dist_*.sh), srun's requests (slurm_*.sh).

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

# tools/slurm_train.sh / slurm_test.sh: srun's requests from the environment, checked (one line naming the variable
# and what is valid, status 2). GPUS: processes in all; GPUS_PER_NODE: the GPU GRES each node is asked for (0: none,
# a CPU partition); TASKS_PER_NODE: processes per node (GPUS_PER_NODE, or with no GRES min(GPUS, 8));
# CPUS_PER_TASK. Sets the array SLURM_REQUESTS.
slurm_requests() {
    local v
    if [[ "$GPUS" =~ ^[0-9]+$ ]]; then  # the defaults that follow from GPUS
        GPUS_PER_NODE=${GPUS_PER_NODE:-$(( GPUS < 8 ? GPUS : 8 ))}
        TASKS_PER_NODE=${TASKS_PER_NODE:-$(( GPUS_PER_NODE > 0 ? GPUS_PER_NODE : (GPUS < 8 ? GPUS : 8) ))}
    fi
    for v in GPUS GPUS_PER_NODE TASKS_PER_NODE CPUS_PER_TASK; do
        if ! [[ "${!v:-}" =~ ^[0-9]+$ ]]; then
            echo "error: $v=${!v}: a whole number is expected (GPUS, TASKS_PER_NODE, CPUS_PER_TASK >= 1; GPUS_PER_NODE >= 0, 0: no GPU GRES)" >&2
            return 2
        fi
    done
    for v in GPUS TASKS_PER_NODE CPUS_PER_TASK; do
        if [ "${!v}" -lt 1 ]; then
            echo "error: $v=${!v}: at least 1 is expected (GPUS_PER_NODE=0 is the way to ask for no GPUs)" >&2
            return 2
        fi
    done
    SLURM_REQUESTS=(--ntasks="$GPUS" --ntasks-per-node="$TASKS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK")
    if [ "$GPUS_PER_NODE" -gt 0 ]; then SLURM_REQUESTS+=(--gres=gpu:"$GPUS_PER_NODE"); fi
}
