#!/usr/bin/env bash
# Distributed evaluation with torchrun: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py options]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as for dist_train.sh; --device cpu as for dist_train.sh.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [test.py options]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
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
    "$ROOT/tools/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "$@"
