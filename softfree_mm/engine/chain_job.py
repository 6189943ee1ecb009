"""The warm-start chain on Slurm through submitit (``tools/warm_start.py --submit``): one job per stage, each after the
one before it (``afterok``), requeued at its time limit until it is done.

**Why a job per stage**: each stage holds the nodes x GPUs it asks for (``--gpus stage1=8 main=16``) and nothing
while it waits; Slurm (submitit's tasks, one srun task per GPU) starts a stage's ranks; a requeue restarts one stage,
never the chain. The plan is made once, by the tool on the submitting node (the release is fetched there, the run
identities computed there), and pickled into each job; nothing in a job plans again.

**In a job** (:class:`StageJob`, every task): rank 0 checks the plan against the work dirs (the stage before is done
and is this chain's run, this stage's work dir holds this run or nothing; it takes the chain's lock for the job's
life, writes the run's identity and finds the checkpoint it resumes from) and sends its decision to the other ranks
through the process group the training then uses (ranks never look for themselves). Every task then trains in its
own process (tools/train.py's main, launcher pytorch, submitit's distributed environment).

**The signal**: submitit's own, USR2, ``--signal-before`` seconds before the time limit, sent by Slurm to every task
of the job (``sbatch --signal=USR2@S``). During training :class:`CheckpointOnSignalHook` takes it on every rank; the
ranks agree at the end of the iteration (an all-reduce), save one checkpoint and stop (an epoch-based stage too, and
its resume goes on mid-epoch). Then submitit's handler runs: on rank 0 it calls :meth:`StageJob.checkpoint` and
requeues the job (``scontrol requeue``); the requeued job resumes from that checkpoint. A signal before training has
begun goes to submitit's handler directly.

**The bound on requeues**: :meth:`StageJob.checkpoint` requeues only when the stage has a newer checkpoint than the one
this job started from; an allotment without progress (too little time for even one iteration after start-up) stops
the stage with one line. Submitit's own count of time-outs is set out of the way (:data:`MAX_TIMEOUTS`): a 36-epoch
stage may need many allotments. A preemption (``scontrol requeue`` by the cluster) restarts the job, which resumes
from the newest checkpoint.

**One chain at a time**: every job of a chain has the chain's name (:func:`chain_job_name`) and Slurm's ``singleton``
dependency: a second submission of the same chain waits for the first's jobs, then finds their runs (done: nothing
runs; another recipe: one line, and its later stages are cancelled, ``kill-on-invalid-dep``). A local invocation
running the same chain holds the chain's lock: the job stops with one line.
"""
import hashlib
import os
import os.path as osp
import re
import shlex
import signal
import sys
from typing import Dict, List, Optional

import submitit

from .errors import UsageError

SIGNAL = 'USR2'  # submitit's (JobEnvironment.USR_SIG): Slurm sends it to every task of the job
MAX_TIMEOUTS = 10 ** 6  # submitit's count of time-outs; the bound is progress (StageJob.checkpoint)
FOLDER = osp.join('logs', 'submitit')  # in the work root: the jobs' pickles and each task's output
_LOCK: Dict[str, object] = {}  # rank 0 keeps the chain's lock file open for the job's life


def seconds(time_limit: str) -> int:
    """A Slurm time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds; anything else is one UsageError."""
    m = re.fullmatch(r'(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?', str(time_limit).strip())
    if not m or str(time_limit).strip() in ('', 'UNLIMITED'):
        raise UsageError(f'--time {time_limit!r}: a Slurm time limit is expected (minutes, M:S, H:M:S, D-H, '
                         'D-H:M or D-H:M:S)')
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        parts = [int(a), int(b or 0), int(c or 0)]
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if c is not None:  # H:M:S
        return int(a) * 3600 + int(b) * 60 + int(c)
    return int(a) * 60 + int(b or 0)  # M or M:S


def sbatch_options(text: str) -> Dict[str, object]:
    """'--account=a --qos q --exclusive' -> {'account': 'a', 'qos': 'q', 'exclusive': True} (submitit's
    additional_parameters); anything that is no long option is one UsageError."""
    out, words = {}, shlex.split(text or '')
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith('--') or len(w) < 3:
            raise UsageError(f'--sbatch-args: {w!r} is no long sbatch option (--name=value or --name value)')
        name, eq, value = w[2:].partition('=')
        if not eq and i + 1 < len(words) and not words[i + 1].startswith('-'):
            value, eq, i = words[i + 1], '=', i + 1
        out[name.replace('-', '_')] = value if eq else True
        i += 1
    return out


def chain_job_name(plan) -> str:
    """The name every job of this chain has (Slurm's singleton dependency acts on it): the user's --job-name, stage
    1's name and the work root (two work roots are two chains)."""
    root = osp.abspath(plan.request.work_root)
    return f'{plan.request.job_name}.{plan.runs[0].name}.{hashlib.sha256(root.encode()).hexdigest()[:8]}'


def parameters(plan, i: int, time_s: int, signal_before: int, sbatch_args: str,
               after: Optional[str]) -> Dict[str, object]:
    """submitit's SlurmExecutor parameters of stage ``i``'s job."""
    req, role = plan.request, plan.runs[i].role
    per_node = req.gpus_of(role) or 8
    extra: Dict[str, object] = dict(requeue=True, kill_on_invalid_dep='yes',
                                    dependency=f'afterok:{after},singleton' if after else 'singleton')
    if not req.wants_cpu():  # a CPU partition refuses a GPU request
        extra['gres'] = f'gpu:{per_node}'
    extra.update(sbatch_options(sbatch_args))
    setup = [f'cd {shlex.quote(os.getcwd())}',
             f'export PYTHONPATH={shlex.quote(plan.root)}${{PYTHONPATH:+:$PYTHONPATH}}']
    return dict(partition=req.partition, nodes=req.nnodes, ntasks_per_node=per_node,
                cpus_per_task=req.cpus_per_task or int(os.environ.get('CPUS_PER_TASK') or 10),
                time=max(1, -(-time_s // 60)), signal_delay_s=signal_before, job_name=chain_job_name(plan),
                stderr_to_stdout=True, srun_args=shlex.split(req.srun_args), setup=setup,
                additional_parameters=extra)


def submit(plan, probe, release: Optional[str], time_s: int, signal_before: int, sbatch_args: str,
           say=print) -> List[str]:
    """A job per stage that runs, each after the one before it; returns their ids."""
    folder = osp.join(osp.abspath(plan.request.work_root), FOLDER)
    try:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_TIMEOUTS)
    except RuntimeError as e:  # no srun here
        raise UsageError(f'--submit: {e} (run it where Slurm\'s commands are)') from None
    jobs: List[str] = []
    for i in range(probe.first, len(plan.runs)):
        executor.update_parameters(**parameters(plan, i, time_s, signal_before, sbatch_args,
                                                jobs[-1] if jobs else None))
        try:
            job = executor.submit(StageJob(plan, i, release))
        except Exception as e:  # noqa: BLE001  (sbatch refused: a partition, an account, a GRES)
            from .errors import short_error
            raise UsageError(f'sbatch refused the job of {plan.runs[i].name}: {short_error(e, 400)}'
                             + (f' (jobs submitted before it: {", ".join(jobs)}; scancel them)' if jobs else '')) \
                from None
        jobs.append(str(job.job_id))
        say(f'[warm-start] {i + 1}/{len(plan.runs)} {plan.runs[i].name}: job {job.job_id}'
            + (f' (after {jobs[-2]})' if len(jobs) > 1 else '') + f'; output {folder}/{job.job_id}_0_log.out')
    return jobs


# ---------------------------------------------------------------------------------------------- in the job
def check(plan, i: int) -> Dict:
    """Rank 0, at the job's start: what stage ``i`` does ('start', 'resume' from a checkpoint, 'done'), checked
    against the work dirs; another run there, or the stage before not done, is a UsageError."""
    from softfree_mm.models.converters import checkpoints_in

    from . import run_identity as identity
    from .chain_release import lock_path, take_lock
    from .chain_run import progress, run_state
    r = plan.runs[i]
    path = lock_path(plan.request.work_root, plan.runs[0].name)
    if path not in _LOCK:  # a local invocation of this chain: one line; kept for this process's life
        os.makedirs(osp.dirname(path) or '.', exist_ok=True)
        f = open(path, 'a+')
        take_lock(f, path)
        _LOCK[path] = f
    if i > 0:
        before = run_state(plan, i - 1)  # another run there: one line naming what differs
        if before.state != 'done':
            raise UsageError(f'{plan.runs[i - 1].name} is not done ({before.state}) in {plan.runs[i - 1].work_dir}: '
                             f'{r.name} cannot start')
    st = run_state(plan, i)
    if st.state == 'done':
        return dict(action='done', checkpoint=st.checkpoint, at=progress(st.checkpoint, 'iter') or 0)
    if st.state == 'missing' or identity.read(r.work_dir) is None:
        identity.write(r.work_dir, plan.records[i])
    if st.state == 'missing':
        return dict(action='start', checkpoint=None, at=0)
    found = checkpoints_in(r.work_dir)
    return dict(action='resume', checkpoint=found[0], at=progress(found[0], 'iter') or 0)


def _agree(decide, rank: int, world: int, backend: str):
    """Rank 0's ``decide()`` on every rank, through the default process group (the one the training then uses); a
    UsageError on rank 0 comes back as ('refused', its line)."""
    def safe():
        try:
            return decide()
        except UsageError as e:
            return dict(action='refused', line=str(e))
    if world == 1:
        return safe()
    import torch
    import torch.distributed as dist
    if backend == 'nccl':
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
    try:
        dist.init_process_group(backend, init_method='env://')
    except Exception as e:  # noqa: BLE001  (a busy port, an unreachable rank 0)
        from .errors import short_error
        raise UsageError(f'the ranks of this job could not meet at {os.environ.get("MASTER_ADDR")}:'
                         f'{os.environ.get("MASTER_PORT")} ({short_error(e, 200)}); set MASTER_PORT to a free port '
                         'in the job\'s environment') from None
    box = [safe() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class StageJob(submitit.helpers.Checkpointable):
    """One stage of the chain as a submitit job (see the module's text)."""

    def __init__(self, plan, i: int, release: Optional[str]):
        self.plan, self.i, self.release = plan, i, release
        self.started_at: Optional[int] = None  # the iteration this allotment started from (rank 0)

    def __call__(self):
        from .hooks.signal_checkpoint import ENV, STOPPED
        env = submitit.JobEnvironment()
        rank, world = env.global_rank, env.num_tasks
        r = self.plan.runs[self.i]
        cpus = os.environ.get('SLURM_CPUS_PER_TASK', '')
        if cpus.isdigit() and 'OMP_NUM_THREADS' not in os.environ:  # the task's CPUs, not the node's
            import torch
            os.environ['OMP_NUM_THREADS'] = cpus
            torch.set_num_threads(int(cpus))
        if world > 1:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        say = (lambda s: print(s, flush=True)) if rank == 0 else (lambda s: None)
        try:
            decision = _agree(lambda: check(self.plan, self.i), rank, world, self._backend())
        except UsageError as e:
            print(f'error: {e}', file=sys.stderr, flush=True)
            sys.exit(2)
        if decision['action'] == 'refused':
            say(f'error: {decision["line"]}')
            sys.exit(2)
        if decision['action'] == 'done':
            say(f'[warm-start] {r.name}: done already ({decision["checkpoint"]}); nothing to run')
            return 'done'
        self.started_at = decision['at']
        say(f'[warm-start] {r.name}: ' + ('starts' if decision['action'] == 'start' else
                                          f'resumes from {decision["checkpoint"]} (iteration {decision["at"]})')
            + f'; {world} task(s), job {env.job_id}')
        os.environ[ENV] = SIGNAL
        status = self._train(decision, world)
        if STOPPED:  # the signal: saved and stopped; submitit's handler requeues the job (rank 0)
            signum = STOPPED['signal']
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, None)
            return 'stopped'
        if status:
            sys.exit(status)
        if rank == 0:
            from .chain_run import run_state
            st = run_state(self.plan, self.i)
            if st.state != 'done':
                print(f'error: {r.name} ended without its last checkpoint in {r.work_dir} ({st.state})',
                      file=sys.stderr, flush=True)
                sys.exit(2)
            say(f'[warm-start] {r.name}: done ({st.checkpoint})')
        return 'done'

    def _backend(self) -> str:
        import torch
        return 'nccl' if torch.cuda.is_available() and not self.plan.request.wants_cpu() else 'gloo'

    def _train(self, decision: Dict, world: int) -> int:
        """tools/train.py's main in this process, with the stage's options and the decision's start."""
        from .chain_run import train_args
        from .train_cli import main
        r = self.plan.runs[self.i]
        argv = [r.config, '--work-dir', r.work_dir, *train_args(self.plan, self.i, False, self.release),
                '--launcher', 'pytorch' if world > 1 else 'none']
        if decision['action'] == 'resume':
            argv += ['--resume', decision['checkpoint']]
        return main(argv)

    def checkpoint(self, *args, **kwargs):
        """Rank 0, on the signal (submitit's handler): requeue when the stage has a checkpoint newer than the one this
        allotment started from; else one line, and the stage stops."""
        from softfree_mm.models.converters import checkpoints_in

        from .chain_run import progress
        r = self.plan.runs[self.i]
        found = checkpoints_in(r.work_dir) if osp.isdir(r.work_dir) else []
        now = (progress(found[0], 'iter') or 0) if found else 0
        if self.started_at is not None and now > self.started_at:
            return super().checkpoint(*args, **kwargs)
        at = self.started_at or 0
        print(f'error: {r.name} made no progress in this allotment (it started at iteration {at} and has no newer '
              'checkpoint when the time-limit signal came): not requeued; give the job more time (--time) or warn '
              'it later (--signal-before), then submit the same command again', file=sys.stderr, flush=True)
        return None


def partition_time(partition: str) -> str:
    """The time limit a job on ``partition`` gets without --time (its DefaultTime, else its MaxTime); one UsageError
    when Slurm cannot say or the partition has none."""
    import subprocess
    try:
        out = subprocess.run(['scontrol', 'show', 'partition', '-o', partition], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f'--submit: scontrol could not say the partition\'s time limit ({e}); give --time') from None
    fields = dict(kv.split('=', 1) for kv in out.stdout.split() if '=' in kv)
    for key in ('DefaultTime', 'MaxTime'):
        value = fields.get(key, '')
        if value and value not in ('NONE', 'UNLIMITED', 'INFINITE'):
            return value
    raise UsageError(f'--submit: partition {partition!r} has no default time limit'
                     + (f' ({" ".join(out.stderr.split())})' if out.returncode else '')
                     + ': give --time (the jobs are warned --signal-before seconds before it)')
