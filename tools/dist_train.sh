#!/usr/bin/env bash
# Distributed training with torchrun: bash tools/dist_train.sh CONFIG GPUS [train.py options]
# Multi-node: NNODES=2 NODE_RANK=0|1 MASTER_ADDR=host PORT=29500 bash tools/dist_train.sh CONFIG 8
# CUDA must work (else one line naming the cause, exit status 2, before torchrun starts); to run the processes on
# CPU (gloo) on purpose add --device cpu: GPUS is then the number of processes. PORT: a free one by default on one
# node (two jobs on a node must not share it), 29500 across nodes.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG GPUS [train.py options]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}
. "$ROOT/tools/_launch.sh"
if [ -z "${PORT:-}" ]; then
    if [ "$NNODES" = 1 ]; then PORT=$(free_port); else PORT=29500; fi
fi
device_preflight "$@" || exit 2

PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/train.py" \
    "$CONFIG" \
    --launcher pytorch "$@"
