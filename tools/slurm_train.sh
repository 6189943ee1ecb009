#!/usr/bin/env bash
# Training on a Slurm cluster: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
# Environment (as mmdet's scripts): GPUS (processes in all, default 8), GPUS_PER_NODE (the GPU GRES asked of each node:
# 8, or GPUS when fewer; 0 asks for no GPUs, for a partition without GPU GRES), TASKS_PER_NODE (GPUS_PER_NODE,
# or with GPUS_PER_NODE=0 min(GPUS, 8)), CPUS_PER_TASK (10: the most data workers of any config, 8, plus the
# process itself; the tool lowers a config's workers to CPUS_PER_TASK - 1), SRUN_ARGS (more srun options, e.g.
# "--account=A --qos=Q --time=24:00:00"), PYTHON (the interpreter, default python from PATH; tools/warm_start.py
# sets its own), MASTER_PORT (default: derived from the job id by the tool, so two jobs on one node do not collide).
# CUDA must work in the job (else each task stops with one line naming the cause); --device cpu to run on CPU.
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-10}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}
. "$ROOT/tools/_launch.sh"
slurm_requests || exit 2

export PYTHONPATH="$ROOT:${PYTHONPATH:-}"
# exec: a signal to this script (a job warned before its time limit) reaches srun, which forwards it to every task
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    "${SLURM_REQUESTS[@]}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher="slurm" "$@"
