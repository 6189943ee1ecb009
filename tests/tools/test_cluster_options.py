"""The cluster path's options, what the launchers are given, the jobs --submit makes and the chain's lock (issues 50
and 69); the runs themselves against a real Slurm are tests/cluster/ (`make test-cluster`, .ci/run).

Guards: the Slurm scripts' variables are checked in one line naming the variable and what is valid; the chain gives
each stage its scripts' interpreter (PYTHON = the tool's), asks a CPU partition for no GRES, passes CPUs per task and
srun options, and gives a stage its own --gpus (its world size in its run identity); a stage that ends without its last
checkpoint stops the chain under every launcher. --submit: each stage's job holds its own stage's GPUs, runs after the
one before it and is a singleton of the chain's name, is warned with submitit's USR2 and requeues; a job checks the
plan against the work dirs on rank 0 and the other ranks take rank 0's decision; it requeues only after progress.
The lock: held while a stage runs even when the tool is killed; a file system without locks is one line naming it.
Options: no abbreviations, values that start with '-', a time limit the warning fits in, a chain over several nodes
without Slurm refused before any launch; bad options, configs and indices are one line, exit status 2.
"""
import errno
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch

from softfree_mm.engine import chain_job, chain_release, chain_run
from softfree_mm.engine import run_identity as identity
from softfree_mm.engine.errors import UsageError

from tests.helpers import ROOT, load_tool, main_as_command

CONFIG = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')


@pytest.mark.parametrize('env,named', [
    ({'GPUS': 'abc'}, 'GPUS=abc: a whole number is expected'),
    ({'GPUS': '2', 'CPUS_PER_TASK': '0'}, 'CPUS_PER_TASK=0: at least 1 is expected'),
    ({'GPUS': '2', 'GPUS_PER_NODE': '-1'}, 'GPUS_PER_NODE=-1: a whole number is expected'),
    ({'GPUS': '2', 'GPUS_PER_NODE': '0', 'TASKS_PER_NODE': 'x'}, 'TASKS_PER_NODE=x: a whole number is expected'),
])
@pytest.mark.parametrize('script', ['slurm_train.sh', 'slurm_test.sh'])
def test_the_slurm_scripts_check_their_variables_in_one_line(script, env, named):
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', script), 'p', 'j', 'c', 'w'], capture_output=True,
                          text=True, env=dict(os.environ, **env), timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f'error: {named}'), proc.stderr


def _plan(tmp_path, **kw):
    return chain_run.plan(chain_run.Request(CONFIG, str(tmp_path / 'w'), **kw), ROOT)


def test_each_stage_is_given_the_tools_interpreter_its_gpus_and_no_gres_on_cpu(tmp_path):
    p = _plan(tmp_path, launcher='slurm', partition='cpu', gpus=4, nnodes=2, stage_gpus={'stage2': 2},
              train_args='--device cpu', cpus_per_task=3, srun_args='--account=a --qos=q', batch_scale='keep')
    cmd, env = chain_run.command(p, 0, False)
    assert cmd[1].endswith('tools/slurm_train.sh') and cmd[2] == 'cpu'
    assert env == dict(PYTHON=sys.executable, GPUS='8', TASKS_PER_NODE='4', GPUS_PER_NODE='0', CPUS_PER_TASK='3',
                       SRUN_ARGS='--account=a --qos=q')
    _, env2 = chain_run.command(p, 1, False)
    assert (env2['GPUS'], env2['TASKS_PER_NODE']) == ('4', '2')
    assert [rec['world_size'] for rec in p.records] == [8, 4, 8]
    gpu = _plan(tmp_path, launcher='slurm', partition='gpu', gpus=8, batch_scale='keep')
    assert chain_run.command(gpu, 0, False)[1]['GPUS_PER_NODE'] == '8'  # GPU nodes: today's request
    torchrun = _plan(tmp_path, launcher='pytorch', gpus=8)
    cmd, env = chain_run.command(torchrun, 0, False)
    assert cmd[1].endswith('tools/dist_train.sh') and cmd[3] == '8' and env == dict(PYTHON=sys.executable)


@pytest.mark.parametrize('launcher', ['none', 'pytorch', 'slurm'])
def test_a_stage_that_ends_without_its_last_checkpoint_stops_the_chain_under_every_launcher(launcher, tmp_path):
    """The process exits 0 and leaves stage 1 half done: the next stage (a multi-node job on a cluster) is not
    started."""
    p = _plan(tmp_path, launcher=launcher, partition='cpu', gpus=8, batch_scale='keep')
    started = []

    def launch(cmd, env):
        started.append(cmd)
        torch.save({'meta': {'iter': 5}, 'state_dict': {}}, osp.join(p.runs[0].work_dir, 'iter_5.pth'))
        return 0
    with pytest.raises(UsageError, match=r'^transfer_xcit_s12_poly3 ended without its last checkpoint in .* '
                                         r'\(partial\): the chain stops$'):
        chain_run.execute(p, chain_run.probe(p), launch=launch, say=lambda *a, **k: None)
    assert len(started) == 1


# ----------------------------------------------------------------------------------------- --submit's jobs
def _script(p, i, after=None, sbatch_args='--account=a --qos q'):
    """The sbatch script submitit writes for stage ``i``'s job."""
    from submitit.slurm.slurm import _make_sbatch_string
    params = chain_job.parameters(p, i, 2 * 86400, 600, sbatch_args, after)
    return _make_sbatch_string(command='python -m submitit.core._submit F', folder='F', **params)


def test_each_stage_is_its_own_job_with_its_own_gpus_after_the_one_before_and_one_chain_at_a_time(tmp_path):
    p = _plan(tmp_path, launcher='slurm', partition='gpu', gpus=8, nnodes=2, stage_gpus={'stage2': 4, 'main': 2},
              batch_scale='keep')
    scripts = [_script(p, i, after=str(100 + i) if i else None) for i in range(3)]
    for i, (script, per_node) in enumerate(zip(scripts, (8, 4, 2))):
        lines = script.splitlines()
        for want in (f'--ntasks-per-node={per_node}', f'--gres=gpu:{per_node}', '--nodes=2', '--partition=gpu',
                     '--signal=USR2@600', '--time=2880', '--requeue', '--kill-on-invalid-dep=yes', '--account=a',
                     '--qos=q', f'--job-name={chain_job.chain_job_name(p)}', '--cpus-per-task=10'):
            assert f'#SBATCH {want}' in lines, (i, want, script)
        dependency = f'#SBATCH --dependency=afterok:{100 + i - 1 + 1 - 1},singleton' if i else \
            '#SBATCH --dependency=singleton'
        assert (dependency if not i else f'#SBATCH --dependency=afterok:{100 + i},singleton') in lines, script
    cpu = _plan(tmp_path, launcher='slurm', partition='cpu', gpus=2, train_args='--device cpu', batch_scale='keep')
    assert '--gres' not in _script(cpu, 0)
    other_root = chain_run.plan(chain_run.Request(CONFIG, str(tmp_path / 'elsewhere'), launcher='slurm',
                                                  partition='gpu', gpus=8, batch_scale='keep'), ROOT)
    assert chain_job.chain_job_name(other_root) != chain_job.chain_job_name(p)  # two work roots: two chains


@pytest.mark.parametrize('text,want', [('30', 1800), ('5:30', 330), ('2:00:00', 7200), ('1-12', 129600),
                                       ('2-00:00:00', 172800)])
def test_slurm_time_limits_are_read_in_every_form(text, want):
    assert chain_job.seconds(text) == want


# -------------------------------------------------------------------------------------------- in the job
CLS = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_t12_poly3_demo.py')


def _stage_plan(tmp_path, iters=6):
    return chain_run.plan(chain_run.Request(CLS, str(tmp_path / 'w'), release=str(tmp_path / 'release.pth'),
                                            iters=iters, batch_scale='keep', launcher='slurm', partition='cpu',
                                            gpus=2), ROOT)


def _ckpt(p, i, at):
    os.makedirs(p.runs[i].work_dir, exist_ok=True)
    path = osp.join(p.runs[i].work_dir, f'iter_{at}.pth')
    torch.save({'meta': {'iter': at}, 'state_dict': {}}, path)
    with open(osp.join(p.runs[i].work_dir, 'last_checkpoint'), 'w') as f:
        f.write(path)
    return path


def test_the_job_checks_the_plan_against_the_work_dirs_before_it_trains(tmp_path):
    p = _stage_plan(tmp_path)
    with pytest.raises(UsageError, match=r'^transfer_xcit_t12_poly3_demo is not done \(missing\) in .*: '
                                         r'finetune_xcit_t12_poly3_demo cannot start$'):
        chain_job.check(p, 1)
    identity.write(p.runs[0].work_dir, p.records[0])
    _ckpt(p, 0, 2)
    assert chain_job.check(p, 1) == dict(action='start', checkpoint=None, at=0)
    assert identity.read(p.runs[1].work_dir)['record'] == p.records[1]  # written by the check, before training
    path = _ckpt(p, 1, 3)
    assert chain_job.check(p, 1) == dict(action='resume', checkpoint=path, at=3)
    done = _ckpt(p, 1, 4)
    assert chain_job.check(p, 1) == dict(action='done', checkpoint=done, at=4)
    other = _stage_plan(tmp_path, iters=8)  # another length: the stage before is another run
    with pytest.raises(UsageError, match=r'holds another run than this command'):
        chain_job.check(other, 1)


def test_the_job_requeues_only_after_progress_and_says_so_in_one_line(tmp_path, capsys):
    p = _stage_plan(tmp_path)
    job = chain_job.StageJob(p, 1, None)
    _ckpt(p, 1, 3)
    job.started_at = 3
    assert job.checkpoint() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: finetune_xcit_t12_poly3_demo made no progress in this '
                                               'allotment (it started at iteration 3'), err
    _ckpt(p, 1, 4)
    again = job.checkpoint()
    assert again is not None and again.function is job  # submitit requeues the same stage


_AGREE = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, {root!r})
    from softfree_mm.engine.chain_job import _agree
    rank = int(os.environ['RANK'])
    def decide():
        assert rank == 0, 'a rank other than 0 decided for itself'
        return dict(action='resume', checkpoint='iter_7.pth', at=7)
    print(_agree(decide, rank, 2, 'gloo'))
''')


def test_ranks_other_than_0_take_rank_0s_decision(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    script = tmp_path / 'agree.py'
    script.write_text(_AGREE.format(root=ROOT))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                                       MASTER_PORT=str(port))) for r in (1, 0)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [o.strip().splitlines()[-1] for o, _ in outs] == ["{'action': 'resume', 'checkpoint': 'iter_7.pth', "
                                                             "'at': 7}"] * 2


# ---------------------------------------------------------------------------------------------- the lock
@pytest.mark.parametrize('code', [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_is_one_line_naming_it_not_running_already(code, tmp_path, monkeypatch):
    import fcntl

    def refuse(f, op):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(fcntl, 'flock', refuse)
    with pytest.raises(UsageError) as e:
        with chain_release.chain_lock(str(tmp_path / 'w'), 'transfer_x', wait=True):
            pass
    line = str(e.value)
    assert 'running already' not in line and f'gives no file locks ({errno.errorcode[code]}' in line, line
    assert chain_release.file_system_of(str(tmp_path)) in line


_HOLDER = textwrap.dedent('''
    import subprocess, sys, time
    sys.path.insert(0, {root!r})
    from softfree_mm.engine.chain_release import chain_lock
    with chain_lock({work!r}, 'transfer_x') as fd:
        child = subprocess.Popen(['sleep', '60'], pass_fds=(fd,))
        print(child.pid, flush=True)
        time.sleep(60)
''')


def test_the_lock_is_held_while_a_stage_runs_after_the_tool_is_killed(tmp_path):
    import signal
    script = tmp_path / 'holder.py'
    script.write_text(_HOLDER.format(root=ROOT, work=str(tmp_path / 'w')))
    tool = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    stage = int(tool.stdout.readline())
    tool.kill()  # kill -9 of the tool; its stage goes on
    tool.wait(30)
    try:
        with pytest.raises(UsageError, match=r'^this chain is running already \(pid'):
            with chain_release.chain_lock(str(tmp_path / 'w'), 'transfer_x'):
                pass
    finally:
        os.kill(stage, signal.SIGKILL)
        os.waitpid(stage, 0) if False else None
    for _ in range(100):  # the stage gone: the lock is free
        try:
            with chain_release.chain_lock(str(tmp_path / 'w'), 'transfer_x'):
                break
        except UsageError:
            import time
            time.sleep(0.1)
    else:
        pytest.fail('the lock stayed held after the stage ended')


# -------------------------------------------------------------------------------------------- the options
@pytest.fixture
def tool(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    return main_as_command(load_tool('warm_start'), capsys)


@pytest.mark.parametrize('args,message', [
    (['--gpus', 'x=3'], "--gpus x=3: no stage 'x'; stages are stage1, stage2, main (ROLE=N), or N for all"),
    (['--gpus', 'stage2=0'], '--gpus must be a positive number, got 0 in stage2=0'),
    (['--submit'], '--submit is for --launcher slurm'),
    (['--launcher', 'slurm', '--partition', 'p', '--submit', '--signal-before', '0'],
     '--signal-before must be 1 to 65535 seconds, got 0'),
    (['--launcher', 'slurm', '--partition', 'p', '--time', '10'], '--time is for --submit'),
    (['--cpus-per-task', '0'], '--cpus-per-task must be a positive number, got 0'),
    (['--launcher', 'slurm', '--partition', 'p', '--sub'], 'unrecognized arguments: --sub'),
    (['--launcher', 'slurm', '--partition', 'p', '--subm', '--time', '5'], 'unrecognized arguments: --subm'),
])
def test_bad_cluster_options_are_one_line(args, message, tool):
    status, out, err = tool(CONFIG, '--dry-run', *args)
    lines = [ln for ln in err.strip().splitlines() if 'error' in ln]
    assert status == 2 and len(lines) == 1 and message in lines[0], err


@pytest.mark.parametrize('args,message', [
    (['--time', '5', '--signal-before', '600'], '--time 5 with --signal-before 600: the warning would come before'),
    (['--time', '1:2:3:4'], "--time '1:2:3:4': a Slurm time limit is expected"),
    (['--time', '30', '--sbatch-args', 'account=a'], "--sbatch-args: 'account=a' is no long sbatch option"),
])
def test_a_submission_whose_time_or_sbatch_options_cannot_work_is_one_line_before_anything_is_submitted(
        args, message, tool, tmp_path):
    status, out, err = tool(CONFIG, '--work-root', str(tmp_path / 'w'), '--launcher', 'slurm', '--partition', 'p',
                            '--gpus', '8', '--batch-scale', 'keep', '--submit', *args)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and message in lines[0], err
    assert not osp.exists(tmp_path / 'w' / 'logs' / 'submitit')


def test_a_chain_over_several_nodes_without_slurm_is_refused_before_any_launch(tool, tmp_path, monkeypatch):
    monkeypatch.setenv('NNODES', '2')
    launched = []
    monkeypatch.setattr(chain_run, '_launch', lambda *a, **k: launched.append(a) or 0)
    status, out, err = tool(CONFIG, '--work-root', str(tmp_path / 'w'), '--launcher', 'pytorch', '--gpus', '8')
    lines = [ln for ln in err.strip().splitlines() if 'error' in ln]
    assert status == 2 and len(lines) == 1 and 'NNODES=2: --launcher pytorch runs a chain on this node only' in \
        lines[0], err
    assert launched == [] and not osp.exists(tmp_path / 'w')


def test_train_args_may_start_with_a_dash_and_bad_configs_and_indices_are_one_line(tool, tmp_path):
    status, out, err = tool(CONFIG, '--dry-run', '--launcher', 'pytorch', '--gpus', '8', '--train-args', '--amp')
    assert status == 0, err
    bad = tmp_path / 'broken.py'
    bad.write_text('model = dict(\n')
    status, out, err = tool(str(bad), '--dry-run')
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and f'cannot read config {bad}' in lines[0], err
    status, out, err = tool(CONFIG, '--dry-run', '--stage1-options', 'param_scheduler.7.end=3')
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and 'transfer_xcit_s12_poly3: its options do not fit' in lines[0], err


def test_a_work_root_with_a_space_reaches_every_run_as_it_is(tmp_path):
    from softfree_mm.engine.train_cli import parse_args
    root = tmp_path / 'my runs'
    p = chain_run.plan(chain_run.Request(CONFIG, str(root), launcher='none', batch_scale='keep'), ROOT)
    assert p.cfgs[1].model.backbone.init_cfg.checkpoint == str(root / 'transfer_xcit_s12_poly3')
    argv = [p.runs[1].config, '--work-dir', p.runs[1].work_dir, *chain_run.train_args(p, 1, False)]
    assert parse_args(argv).cfg_options['model.backbone.init_cfg.checkpoint'] == str(root / 'transfer_xcit_s12_poly3')
    assert parse_args(['c.py', '--cfg-options', 'a=[1, 2]', 'b=x,y']).cfg_options == dict(a=[1, 2], b=['x', 'y'])
