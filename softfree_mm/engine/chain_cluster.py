"""The warm-start chain on a cluster: several nodes that follow node 0, and the chain as one Slurm job that survives
its time limit (``tools/warm_start.py``; the chain itself is :mod:`softfree_mm.engine.chain_run`).

- :class:`Nodes`: with ``--launcher pytorch`` on several nodes one copy of the tool runs on each. Node rank 0 alone
  takes the chain's lock, looks at the work dirs, writes its decision (``WORK_ROOT/warm_start_<stage 1>.nodes.json``:
  which run starts, which resume, the release file) and after each run its verdict on what the run left; the other
  nodes wait at a barrier (a TCP store on MASTER_ADDR, port CHAIN_PORT, default PORT + 1) and follow, never their own
  look at a shared file system that may cache.
- :class:`Requeue`: inside a job of ``--submit``, the signal Slurm sends before the time limit goes to the running
  stage (which saves a checkpoint at the end of its iteration and stops: CheckpointOnSignalHook), then the job
  requeues itself; the requeued job runs the same command, which resumes where it stopped.
- :func:`submit_command`: the ``sbatch`` line of ``--submit``.
"""
import json
import os
import os.path as osp
import shlex
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from typing import Dict, List, Optional

from .errors import UsageError

DECISION = 'warm_start_{}.nodes.json'
WAIT = timedelta(days=7)  # a follower waits this long for node 0 (which may itself wait for the lock, --wait)


def node_env() -> Dict[str, str]:
    """NNODES, NODE_RANK, MASTER_ADDR and the chain's port, as tools/dist_train.sh reads them; checked."""
    env = {k: os.environ.get(k, d) for k, d in (('NNODES', '1'), ('NODE_RANK', '0'), ('MASTER_ADDR', '127.0.0.1'))}
    for k in ('NNODES', 'NODE_RANK'):
        if not env[k].isdigit():
            raise UsageError(f'{k}={env[k]!r}: a whole number is expected (NNODES >= 1, 0 <= NODE_RANK < NNODES)')
    if not 0 <= int(env['NODE_RANK']) < max(1, int(env['NNODES'])):
        raise UsageError(f"NODE_RANK={env['NODE_RANK']} with NNODES={env['NNODES']}: node ranks are 0 to NNODES - 1")
    port = os.environ.get('CHAIN_PORT') or str(int(os.environ.get('PORT') or 29500) + 1)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f'CHAIN_PORT={port!r}: a TCP port (1-65535) is expected; PORT + 1 by default')
    env['CHAIN_PORT'] = port
    return env


class Nodes:
    """One copy of the tool among NNODES: node 0 decides and judges, the others follow (see the module's text)."""

    def __init__(self, work_root: str, stage1_name: str, env: Optional[Dict[str, str]] = None, say=print):
        env = env or node_env()
        self.count, self.rank = int(env['NNODES']), int(env['NODE_RANK'])
        self.leader = self.rank == 0
        self.decided = False
        self.where = f"{env['MASTER_ADDR']}:{env['CHAIN_PORT']}"
        self.path = osp.join(work_root, DECISION.format(stage1_name))
        if not self.leader:  # connecting waits for node 0's store
            say(f'[warm-start] node {self.rank} of {self.count}: waiting for node 0 to decide what runs ({self.where})')
        from torch.distributed import TCPStore
        self.store = TCPStore(env['MASTER_ADDR'], int(env['CHAIN_PORT']), world_size=None, is_master=self.leader,
                              timeout=WAIT, wait_for_workers=False)

    def refuse(self, message: str) -> None:
        """Node 0 stopped before deciding (a refusal, a lock held): the others stop with its line, not after a week."""
        self.store.set('decision', f'error:{message}')

    # ----------------------------------------------------------------------------------------------- node 0
    def decide(self, first: int, states: List[Optional[str]], release: Optional[str]) -> Dict:
        """Node 0: its decision, in the work root (for the record and for the others), then the barrier's key."""
        decision = dict(nonce=uuid.uuid4().hex, first=first, states=states, release=release, nnodes=self.count,
                        written=time.strftime('%Y-%m-%d %H:%M:%S'))
        os.makedirs(osp.dirname(self.path) or '.', exist_ok=True)
        tmp = f'{self.path}.part'
        with open(tmp, 'w') as f:
            json.dump(decision, f, indent=1)
        os.replace(tmp, self.path)
        self.store.set('decision', decision['nonce'])
        self.decided = True
        return decision

    def publish(self, i: int, verdict: str) -> None:
        """Node 0, after run ``i``: '' (done: go on) or why the chain stops."""
        self.store.set(f'run{i}', verdict or 'ok')

    def finish(self, timeout_s: float = 120.0) -> None:
        """Node 0 keeps the store up until every other node has read its last verdict (or ``timeout_s``)."""
        end = time.time() + timeout_s
        while self.store.add('left', 0) < self.count - 1 and time.time() < end:
            time.sleep(0.2)

    # ------------------------------------------------------------------------------------------- the others
    def receive(self) -> Dict:
        """A follower: node 0's decision, read from the work root once node 0 has passed the barrier (the file is
        read again until it is the one node 0 announced: a shared file system may serve an older copy)."""
        nonce = self._get('decision')
        if nonce.startswith('error:'):
            raise UsageError(f'node 0 stopped before any run: {nonce[len("error:"):]}')
        end = time.time() + 300
        while True:
            try:
                with open(self.path) as f:
                    decision = json.load(f)
                if decision.get('nonce') == nonce:
                    return decision
            except (OSError, ValueError):
                pass
            if time.time() > end:
                raise UsageError(f'{self.path}: node 0 announced its decision {nonce}, and this node still reads '
                                 'another (or none) after 300 s: is WORK_ROOT on a file system every node shares?')
            time.sleep(0.5)

    def follow(self, i: int) -> str:
        """A follower, after run ``i``: '' when node 0 found it done, else why the chain stops."""
        verdict = self._get(f'run{i}')
        return '' if verdict == 'ok' else verdict

    def _get(self, key: str) -> str:
        try:
            return self.store.get(key).decode()
        except Exception as e:  # noqa: BLE001  (DistNetworkError, a timeout: node 0's process is gone)
            raise UsageError(f'node 0 ({self.where}) went away before saying {key}: it stopped; its output says '
                             f'why ({type(e).__name__})') from None

    def leave(self) -> None:
        """A follower tells node 0 it has read what it needed (node 0 may then end, and its store with it)."""
        if not self.leader:
            try:
                self.store.add('left', 1)
            except Exception:  # noqa: BLE001  (node 0 is gone already: nothing waits for this)
                pass


def probe_of(decision: Dict):
    """The probe a follower runs on: node 0's, from its decision (states as node 0 saw them)."""
    from .chain_run import Probe, RunState
    states = [RunState(s) if s else None for s in decision['states']]
    return Probe(states, int(decision['first']))


# ----------------------------------------------------------------------------------------------- Slurm job
class Requeue:
    """Inside a job of ``--submit``: ``sig`` (the one sbatch's --signal sends before the time limit) is forwarded to
    the running stage, which saves and stops; then the job requeues itself (``scontrol requeue``)."""

    def __init__(self, sig: str = 'USR1'):
        self.job = os.environ.get('SLURM_JOB_ID')
        self.signum = getattr(signal, f'SIG{sig}')
        self.name = sig
        self.requested = False
        self.child: Optional[subprocess.Popen] = None
        signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum, frame):
        self.requested = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(self.signum)  # srun forwards it to every task of the stage

    def launch(self, cmd, env) -> int:
        """A stage's process, with the signal forwarded to it (SIG<name> in its environment: it saves and stops)."""
        env = dict(os.environ, **env, SOFTFREE_MM_CHECKPOINT_SIGNAL=self.name)
        self.child = subprocess.Popen(cmd, cwd=os.getcwd(), env=env)
        while True:
            try:
                return self.child.wait()
            except InterruptedError:  # pragma: no cover  (Python retries wait() itself since 3.5)
                continue

    def requeue(self, say, where: str) -> int:
        say(f'[warm-start] SIG{self.name} before the time limit ({where}): requeueing job {self.job}; the requeued '
            'job runs this command again and resumes where the chain stopped', file=sys.stderr)
        proc = subprocess.run(['scontrol', 'requeue', str(self.job)], capture_output=True, text=True)
        if proc.returncode:
            say(f'[warm-start] scontrol requeue {self.job} failed: {proc.stderr.strip()}; submit the same command '
                'again to resume', file=sys.stderr)
            return proc.returncode
        return 0


def submit_command(argv: List[str], request, work_root: str, python: str, tool: str, time_limit: Optional[str],
                   signal_before: int, sbatch_args: str) -> List[str]:
    """The sbatch line that runs ``tool argv`` (the command without --submit, with --in-job) as one job: nodes, tasks
    and CPUs for the largest stage, --time, --requeue, the signal ``signal_before`` seconds before the limit (to the
    batch shell, which is this tool), its output appended to WORK_ROOT/logs/<job name>.<job id>.out."""
    per_node = max([request.gpus_of(role) or 8 for role in ('stage1', 'stage2', 'main')])
    out = osp.join(osp.abspath(work_root), 'logs', f'{request.job_name}.%j.out')
    cmd = ['sbatch', '--parsable', f'--partition={request.partition}', f'--job-name={request.job_name}',
           f'--nodes={request.nnodes}', f'--ntasks-per-node={per_node}', '--requeue', '--open-mode=append',
           f'--signal=B:USR1@{signal_before}', f'--output={out}']
    # the stages' srun ask CPUS_PER_TASK (tools/slurm_train.sh: 10 by default): the job must hold as many
    cmd.append(f"--cpus-per-task={request.cpus_per_task or os.environ.get('CPUS_PER_TASK') or 10}")
    if not request.wants_cpu():
        cmd.append(f'--gres=gpu:{per_node}')
    if time_limit:
        cmd.append(f'--time={time_limit}')
    cmd += shlex.split(sbatch_args)
    inner = ' '.join(shlex.quote(x) for x in [python, tool, *argv, '--in-job'])
    cmd.append(f'--wrap=cd {shlex.quote(os.getcwd())} && exec {inner}')
    return cmd
