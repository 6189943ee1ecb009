"""What of the warm-start chain runs, and running it: plan, probe, execute (``tools/warm_start.py``).

- :func:`plan`: the chain's runs (:func:`softfree_mm.engine.chain.chain`), each with its config as the run reads it
  (the recipe's options, ``--recipe`` / ``--iters`` / ``--batch-scale linear`` included) and the record of the run
  this command would make, chained top-down (:mod:`softfree_mm.engine.chain_identity`).
- :func:`probe`: decided from the end: the last run that is done and is this chain's; only what comes after it runs
  (a stopped one resumes, a missing one starts). Each run looked at must be this command's run (its identity, or
  one adopted from its checkpoint's saved config); another is one line naming the keys that differ, before any
  process starts. Records chain, so a finished main job is this chain's only when every run above it is.
- :func:`check_launch`: each stage that runs sees the scale's batch (world size x per-GPU batch), or the user chose
  ``--batch-scale linear|keep``.
- :func:`execute`: the runs, one process each, under the chain's lock (:mod:`softfree_mm.engine.chain_release` holds
  the lock and the release); what the tool prints before: :mod:`softfree_mm.engine.chain_report`.
"""
import os
import os.path as osp
import shlex
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from . import chain_identity
from . import run_identity as identity
from . import warm_start as ws
from .chain import Stage, chain
from .errors import UsageError

@dataclass
class Request:
    """What the user asked for (tools/warm_start.py's options)."""

    config: str
    work_root: str = 'work_dirs'
    release: Optional[str] = None
    iters: Optional[int] = None
    recipe: Optional[str] = None
    options: Dict[str, List[str]] = field(default_factory=dict)  # 'stage1', 'stage2', 'main': --cfg-options
    launcher: str = 'none'
    gpus: Optional[int] = None
    nnodes: int = 1
    partition: Optional[str] = None
    job_name: str = 'warm_start'
    train_args: str = ''
    batch_scale: Optional[str] = None
    stage_gpus: Dict[str, int] = field(default_factory=dict)  # --gpus ROLE=N: a stage's own count per node
    cpus_per_task: Optional[int] = None  # slurm: CPUS_PER_TASK (default: tools/slurm_train.sh's)
    srun_args: str = ''  # slurm: more srun options (SRUN_ARGS), e.g. --account, --qos

    def gpus_of(self, role: Optional[str] = None) -> Optional[int]:
        """--gpus of a stage ('stage1', 'stage2', 'main'): its own count, else the common one (None: the default)."""
        return self.stage_gpus.get(role) or self.gpus

    def world_size(self, role: Optional[str] = None) -> int:
        """Processes of a run: one; --gpus (pytorch, this node); --gpus (8) x --nnodes (slurm)."""
        if self.launcher == 'pytorch':
            return self.gpus_of(role) or 1
        if self.launcher == 'slurm':
            return (self.gpus_of(role) or 8) * self.nnodes
        return 1

    def wants_cpu(self) -> bool:
        """The runs were asked to run on CPU (--train-args "--device cpu", or SOFTFREE_MM_DEVICE=cpu)."""
        args = shlex.split(self.train_args)
        return ('--device=cpu' in args or any(a == '--device' and b == 'cpu' for a, b in zip(args, args[1:]))
                or os.environ.get('SOFTFREE_MM_DEVICE') == 'cpu')


@dataclass
class Plan:
    request: Request
    root: str
    runs: List[Stage]
    cfgs: list
    records: List[Dict]  # each run's record as this command would make it (run_identity.record)
    release: str  # the chain's release as the user or the config names it (a URL, a file, a work dir)
    recipe: Optional[str] = None
    scale: Optional[str] = None


@dataclass
class RunState:
    """'done' | 'partial' | 'missing', its last checkpoint, (unit, count reached, count it ends at)."""

    state: str
    checkpoint: Optional[str] = None
    at: tuple = ()
    adopted: Optional[str] = None  # made before identities: the checkpoint whose saved config was this run's
    note: str = ''  # shown after its state (the libraries that changed since it was made)


@dataclass
class Probe:
    states: List[Optional[RunState]]  # None: not looked at (a later run is done)
    first: int  # the first run that runs; len(runs): none


# ---------------------------------------------------------------------------------------------------- plan
def run_config(stage: Stage, reads: Optional[str] = None, extra=()):
    """The stage's config with its options, as its run reads them (``tools/train.py --cfg-options``)."""
    import argparse

    from .cfg_options import CfgOptions

    from .chain import load_config
    cfg = load_config(stage.config)
    opts = [f'{stage.read_key}={reads or stage.reads}', *stage.options, *extra]
    p = argparse.ArgumentParser()
    p.add_argument('--o', nargs='+', action=CfgOptions)
    try:
        cfg.merge_from_dict(p.parse_args(['--o', *opts]).o)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        from .errors import short_error
        given = ' '.join(stage.options + list(extra)) or '(none)'
        raise UsageError(f'{stage.name}: its options do not fit {osp.basename(stage.config)} ({short_error(e, 200)}); '
                         f'options given: {given}') from None
    return cfg


def _declared(request: Request, stage1_cfg, what: str):
    """(recipe name, scale name) the stage configs take, checked; UsageError when ``what`` needs them."""
    declared = stage1_cfg.get('warm_start') or {}
    if declared.get('recipe') in ws.RECIPES and declared.get('scale') in ws.SCALES:
        return request.recipe or declared['recipe'], declared['scale']
    if what:
        raise UsageError(f'{what}: the stage configs take no recipe base (configs/_base_/transfer/recipe_*.py), '
                         "so their scale is not known; set the stages' keys with --stage1-options and "
                         '--stage2-options')
    return None, None


def _recipe_options(request: Request, runs: List[Stage], recipe: str, scale: str) -> Dict[str, List[str]]:
    """The options --recipe, --iters and --batch-scale linear give each stage (none when none is asked for)."""
    linear = request.batch_scale == 'linear'
    if not (request.recipe or request.iters or linear):
        return {}
    out = {}
    for stage in runs[:2]:
        s = ws.SCALES[scale]
        total = request.iters or s.iters
        if linear:
            batch = request.world_size(stage.role) * int(run_config(stage).train_dataloader.batch_size)
            s = ws.at_batch(s, batch, 'linear')
            total = max(2, round(total * ws.SCALES[scale].batch / batch))
        make = ws.recipe_options if request.recipe or linear else ws.length_options
        out[stage.role] = make(ws.RECIPES[recipe], s, total)[stage.role]
        if request.recipe:
            out[stage.role].append(f'warm_start.recipe={recipe}')
    return out


def head_reads_release(cfg) -> bool:
    """Whether stage 2 reads the release (its head is the release's classifier, ReleaseHead)."""
    head = cfg.model.get('head')
    init = (head.get('init_cfg') or {}) if isinstance(head, dict) else {}
    return init.get('type') == 'ReleaseHead'


def _finish_configs(runs: List[Stage], release: str):
    """Each run's config; stage 2 reads the release for its head when its head is the release's."""
    cfgs = []
    for r in runs:
        cfg = run_config(r)
        if r.role == 'stage2' and head_reads_release(cfg):
            cfg = run_config(r, extra=[f'model.head.init_cfg.checkpoint={release}'])
        cfgs.append(cfg)
    return cfgs


def plan(request: Request, root: str) -> Plan:
    """The chain's runs with their configs and records (nothing on disk is read but configs, the starts' recorded
    hashes and a start's run_identity.json)."""
    if request.recipe is not None and request.recipe not in ws.RECIPES:
        raise UsageError(f'--recipe {request.recipe!r} is no recipe; known: {", ".join(ws.RECIPES)}')
    if request.batch_scale is not None and request.batch_scale not in ws.BATCH_RULES:
        raise UsageError(f'--batch-scale {request.batch_scale!r}: known rules are {", ".join(ws.BATCH_RULES)}')
    options = {k: list(v) for k, v in request.options.items()}
    runs = chain(request.config, request.work_root, root, options)
    if request.release:
        runs[0].reads = request.release
    release = runs[0].reads
    what = ('--iters' if request.iters else '--recipe' if request.recipe else
            '--batch-scale linear' if request.batch_scale == 'linear' else '')
    recipe, scale = _declared(request, run_config(runs[0]), what)
    for role, extra in (_recipe_options(request, runs, recipe, scale) if recipe else {}).items():
        stage = next(r for r in runs if r.role == role)
        stage.options[:0] = extra
    cfgs = _finish_configs(runs, release)
    return Plan(request, root, runs, cfgs, chain_identity.records(runs, cfgs, request), release, recipe, scale)


# --------------------------------------------------------------------------------------------------- probe
def target(cfg):
    """('iter' | 'epoch', the count the run ends at)."""
    loop = cfg.get('train_cfg', {}) or {}
    if loop.get('max_iters') is not None:
        return 'iter', int(loop['max_iters'])
    return 'epoch', int(loop.get('max_epochs') or 0)


def progress(path: str, unit: str) -> Optional[int]:
    """The count a checkpoint reached: from its name (iter_N.pth, epoch_N.pth), else from its meta read with
    ``weights_only=True`` (nothing is executed)."""
    from ..models.converters.loading import CHECKPOINT_NAME
    m = CHECKPOINT_NAME.match(osp.basename(path))
    if m and m.group(1) == unit:
        return int(m.group(2))
    from .checkpoints import read_meta
    try:
        at = read_meta(path).get(unit)
    except Exception:  # noqa: BLE001  (a checkpoint that is not mmengine's: its count is not known)
        return None
    return int(at) if at is not None else None


def run_state(p: Plan, i: int) -> RunState:
    """Run ``i``'s state; a work dir that holds another run is a UsageError (one line naming what differs)."""
    from softfree_mm.models.converters import checkpoints_in
    stage = p.runs[i]
    found = checkpoints_in(stage.work_dir) if osp.isdir(stage.work_dir) else []
    if not found:
        return RunState('missing')
    held = chain_identity.held(stage, p.cfgs[i], p.records[i], found[0], chain_identity.upstream(p.runs, i))
    unit, end = target(p.cfgs[i])
    at = progress(found[0], unit)
    state = 'done' if at is not None and at >= end else 'partial'
    changed = identity.version_changes(held.versions)
    return RunState(state, found[0], (unit, at, end), held.adopted_from,
                    f' (made with other libraries, then -> now: {changed})' if changed else '')


def probe(p: Plan) -> Probe:
    """From the end: the first run (last first) that is done ends the search, and what follows it runs; one that
    stopped runs (resumed) with what follows it; the runs before are not looked at."""
    states: List[Optional[RunState]] = [None] * len(p.runs)
    for i in reversed(range(len(p.runs))):
        states[i] = run_state(p, i)
        if states[i].state == 'done':
            return Probe(states, i + 1)
        if states[i].state == 'partial':
            return Probe(states, i)
    return Probe(states, 0)


def reads_release(p: Plan, pr: Probe) -> bool:
    """Whether a run that runs reads the release: stage 1 (its teacher), stage 2 when its head is the release's."""
    return any(r.role == 'stage1' or (r.role == 'stage2' and head_reads_release(c))
               for r, c in zip(p.runs[pr.first:], p.cfgs[pr.first:]))


def check_launch(p: Plan, pr: Probe) -> None:
    """Each stage that runs: world size x per-GPU batch against the scale's batch, unless --batch-scale says what
    to do (the main job keeps mmdet / mmseg's own auto_scale_lr convention)."""
    if p.scale is None or p.request.batch_scale is not None:
        return
    want = ws.SCALES[p.scale].batch
    for r, c in zip(p.runs[pr.first:], p.cfgs[pr.first:]):
        world, per_gpu = p.request.world_size(r.role), int(c.train_dataloader.batch_size)
        if r.role != 'main' and world * per_gpu != want:
            n = want // per_gpu if want % per_gpu == 0 else None
            launch = (f'launch {n} processes (--launcher pytorch --gpus {n}, or slurm with --gpus x --nnodes = {n})'
                      if n else f'launch processes x train_dataloader.batch_size = {want}')
            raise UsageError(
                f'{r.name} would run {world} x {per_gpu} = {world * per_gpu} images a step, the {p.recipe} recipe at '
                f'the {p.scale} scale counts its lr and iterations for {want}: {launch}, or choose --batch-scale '
                f'linear (lr x {world * per_gpu}/{want}, iterations x {want}/{world * per_gpu}) or --batch-scale keep '
                '(the recipe\'s lr and iterations as they are)')


# ------------------------------------------------------------------------------------------------- execute
def train_args(p: Plan, i: int, resume: bool, release: Optional[str] = None) -> List[str]:
    """tools/train.py's options of run ``i`` after its config and work dir: --train-args, --resume, its start and
    options as --cfg-options. A resumed run whose start is gone reads its own work dir (the resumed checkpoint
    replaces those weights anyway)."""
    from softfree_mm.models.converters import checkpoints_in
    r, req = p.runs[i], p.request
    reads = release if (r.role == 'stage1' and release) else r.reads
    if resume and r.role != 'stage1' and not (osp.isdir(reads) and checkpoints_in(reads)):
        reads = r.work_dir
    head = ([f'model.head.init_cfg.checkpoint={release or p.release}']
            if r.role == 'stage2' and head_reads_release(p.cfgs[i]) else [])
    opts = ['--cfg-options', f'{r.read_key}={reads}', *r.options, *head]
    return [*shlex.split(req.train_args), *(['--resume'] if resume else []), *opts]


def command(p: Plan, i: int, resume: bool, release: Optional[str] = None):
    """(argv, extra environment) of run ``i``: started as a user starts one (tools/train.py, dist_train.sh,
    slurm_train.sh) with :func:`train_args`."""
    r, req = p.runs[i], p.request
    extra = train_args(p, i, resume, release)
    tools = osp.join(p.root, 'tools')
    python = dict(PYTHON=sys.executable)  # the scripts run this tool's interpreter, not the first python on PATH
    if req.launcher == 'pytorch':
        return ['bash', osp.join(tools, 'dist_train.sh'), r.config, str(req.gpus_of(r.role) or 1), '--work-dir',
                r.work_dir, *extra], python
    if req.launcher == 'slurm':
        per_node = req.gpus_of(r.role) or 8
        # a CPU run asks for no GPU GRES (a partition without GPUs refuses --gres=gpu:N)
        env = dict(python, GPUS=str(per_node * req.nnodes), TASKS_PER_NODE=str(per_node),
                   GPUS_PER_NODE='0' if req.wants_cpu() else str(per_node))
        if req.cpus_per_task:
            env['CPUS_PER_TASK'] = str(req.cpus_per_task)
        if req.srun_args:
            env['SRUN_ARGS'] = req.srun_args
        return ['bash', osp.join(tools, 'slurm_train.sh'), req.partition, f'{req.job_name}_{r.name}', r.config,
                r.work_dir, *extra], env
    return [sys.executable, osp.join(tools, 'train.py'), r.config, '--work-dir', r.work_dir, *extra], {}


def _launch(cmd, env, keep_fds=()) -> int:
    """A stage's process; ``keep_fds`` (the chain's lock) stay open in it, so the lock is held while it runs."""
    import subprocess
    return subprocess.run(cmd, cwd=os.getcwd(), env=dict(os.environ, **env), pass_fds=tuple(keep_fds)).returncode


def stage_log(p: Plan, i: int) -> Optional[str]:
    """Where a run's output goes under Slurm (srun --output): WORK_ROOT/logs/<run>.<date-time>.log, kept there; None
    for the other launchers (their output is the tool's)."""
    if p.request.launcher != 'slurm':
        return None
    import time
    return osp.join(osp.abspath(p.request.work_root), 'logs', f'{p.runs[i].name}.{time.strftime("%Y%m%d-%H%M%S")}.log')


def execute(p: Plan, pr: Probe, release: Optional[str] = None, launch: Optional[Callable] = None, say=print,
            keep_fds=()) -> int:
    """Run what the probe left, in order: each run's identity first (run_identity.json; an adopted run's too, and
    the records again once the release is here: its hash), then its process
    (``launch(argv, env) -> exit status``; default: a subprocess that keeps ``keep_fds``, the chain's lock, open).
    Returns the first non-zero exit status, else 0; a run that ends without its last checkpoint stops the chain,
    whatever the launcher."""
    launch = launch or (lambda cmd, env: _launch(cmd, env, keep_fds))
    if release:  # fetched since the plan: its content hash is known now
        p.records = chain_identity.records(p.runs, p.cfgs, p.request)
    for st, r, rec in zip(pr.states, p.runs, p.records):
        if st is not None and st.adopted is not None:
            identity.write(r.work_dir, rec, adopted_from=st.adopted)
    n = len(p.runs)
    for i in range(pr.first, n):
        r = p.runs[i]
        resume = pr.states[i] is not None and pr.states[i].state == 'partial'
        if not resume or identity.read(r.work_dir) is None:
            identity.write(r.work_dir, p.records[i])
        cmd, env = command(p, i, resume, release)
        log = stage_log(p, i)
        if log:
            os.makedirs(osp.dirname(log), exist_ok=True)
            env['SRUN_ARGS'] = f'{env.get("SRUN_ARGS", os.environ.get("SRUN_ARGS", ""))} --output={log}'.strip()
        say(f'[warm-start] {i + 1}/{n} {r.name}: {" ".join(shlex.quote(x) for x in cmd)}')
        if log:
            say(f'[warm-start] {i + 1}/{n} {r.name}: log {log}')
        status = launch(cmd, env)
        if status:
            say(f'[warm-start] {r.name} stopped with exit status {status}; the same command resumes the chain',
                file=sys.stderr)
            return status
        st = run_state(p, i)
        if st.state != 'done':
            raise UsageError(f'{r.name} ended without its last checkpoint in {r.work_dir} ({st.state}): the chain '
                             'stops')
    say(f'[warm-start] {p.request.config}: every run of the chain is done')
    return 0


def release_for(p: Plan, pr: Probe, fetch_it: bool) -> Optional[str]:
    """The release file of the runs that run (None when none reads it, or, without ``fetch_it``, when it is not here
    yet), checked against stage 1's teacher when stage 1 runs: another architecture is one line before any run."""
    from .chain import check_release
    from .chain_release import fetch, local_release
    if not reads_release(p, pr):
        return None
    work_root = p.request.work_root
    local = fetch(p.release, work_root) if fetch_it else local_release(p.release, work_root)
    if local is not None and pr.first == 0:
        check_release(run_config(p.runs[0], reads=local))
    return local
