#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to try the Slurm path (tools/slurm_train.sh, tools/warm_start.py
# --launcher slurm / --submit) and to test it (tests/cluster/, run by .ci/run):
#     eval "$(bash tools/slurm_local.sh up)"     # installs slurm-wlm + munge when missing (apt, root), starts munged,
#                                                 # slurmctld and slurmd; prints `export SLURM_CONF=...`
#     bash tools/slurm_local.sh down              # stops the daemons it started, by the PIDs it kept
#     bash tools/slurm_local.sh status            # running or not, in one line
# One partition `cpu` (Default) of this node with its CPUs (no GPU GRES, no accounting: sacct does not work, scontrol
# show job gives a job's state). Idempotent: `up` with the daemons running starts nothing. Everything it writes is in
# SOFTFREE_SLURM_DIR (default /tmp/softfree_slurm): slurm.conf, the daemons' logs, state and PIDs. Where it cannot
# (no root, no apt-get, a daemon that does not start) it says why in one line and exits with status 2.
set -euo pipefail
DIR=${SOFTFREE_SLURM_DIR:-/tmp/softfree_slurm}
CONF="$DIR/slurm.conf"
DAEMONS=(munged slurmctld slurmd)

die() { echo "error: slurm_local.sh: $*" >&2; exit 2; }

alive() {  # the daemon's kept PID names a running process
    local f="$DIR/$1.pid"
    [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

install_packages() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v srun >/dev/null && return 0
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are not installed and installing them needs root (uid $(id -u)): run as root, or install slurm-wlm and munge"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get here: install slurm-wlm and munge with this system's package manager"
    echo "[slurm-local] installing slurm-wlm and munge (apt-get)" >&2
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge \
            >"$DIR/apt.log" 2>&1; then
        apt-get update >>"$DIR/apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge \
            >>"$DIR/apt.log" 2>&1 || die "apt-get could not install slurm-wlm and munge (log: $DIR/apt.log)"
    fi
}

write_conf() {
    local host cpus
    host=$(hostname -s)
    cpus=$(nproc)
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/logs"
    cat >"$CONF" <<EOF
# written by tools/slurm_local.sh: one node, one partition, no accounting
ClusterName=softfree
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.daemon.pid
SlurmdPidFile=$DIR/slurmd.daemon.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {  # start NAME COMMAND...: in the background, its PID kept
    local name=$1
    shift
    "$@" >>"$DIR/$name.out" 2>&1 &
    echo $! >"$DIR/$name.pid"
}

up() {
    mkdir -p "$DIR"
    install_packages
    if alive munged && alive slurmctld && alive slurmd; then
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "starting munged, slurmctld and slurmd needs root (uid $(id -u))"
    down quiet
    write_conf
    # munged refuses to run as root (its log folder must be its user's): as the munge user, in the foreground
    install -d -o munge -g munge -m 0755 /run/munge /var/log/munge /var/lib/munge
    [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key (reinstall munge, or create one with mungekey)"
    start munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F
    for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
    alive munged || die "munged did not start (see $DIR/munged.out)"
    start slurmctld slurmctld -D -f "$CONF"
    start slurmd slurmd -D -f "$CONF"
    for _ in $(seq 100); do
        if SLURM_CONF=$CONF sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
            echo "[slurm-local] up: partition cpu on $(hostname -s), $(nproc) CPUs; daemons' PIDs in $DIR" >&2
            echo "export SLURM_CONF=$CONF"
            return 0
        fi
        for d in slurmctld slurmd; do alive "$d" || die "$d did not start (see $DIR/$d.out and $DIR/$d.log)"; done
        sleep 0.2
    done
    die "the node did not come up within 20 s (see $DIR/slurmctld.log and $DIR/slurmd.log)"
}

down() {
    local d pid
    for d in slurmd slurmctld munged; do
        [ -s "$DIR/$d.pid" ] || continue
        pid=$(cat "$DIR/$d.pid")
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$DIR/$d.pid"
    done
    [ "${1:-}" = quiet ] || echo "[slurm-local] down (daemons stopped by PID)" >&2
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status)
        if alive munged && alive slurmctld && alive slurmd; then echo "up: SLURM_CONF=$CONF"; else echo down; exit 1; fi ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
