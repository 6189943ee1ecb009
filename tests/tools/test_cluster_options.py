"""The cluster path's options and what the launchers are given (issue 50); the runs themselves against a real Slurm
and on two node ranks are tests/cluster/ (`make test-cluster`, .ci/run).

Guards: the Slurm scripts' variables are checked in one line naming the variable and what is valid; the chain gives
each stage its scripts' interpreter (PYTHON = the tool's), asks a CPU partition for no GRES, passes CPUs per task and
srun options, and gives a stage its own --gpus (its world size in its run identity); a stage that ends without its last
checkpoint stops the chain under every launcher (slurm included); --submit's sbatch line has the time limit, requeue,
the signal before the limit and the user's options, and the job runs the same command without --submit; bad options
are one line, exit status 2.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest

from softfree_mm.engine import chain_run
from softfree_mm.engine.chain_cluster import node_env, submit_command
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
              train_args='--device cpu', cpus_per_task=3, slurm_args='--account=a --qos=q', batch_scale='keep')
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
    import torch
    p = _plan(tmp_path, launcher=launcher, partition='cpu', gpus=8, batch_scale='keep')
    started = []

    def launch(cmd, env):
        started.append(cmd)
        work_dir = p.runs[0].work_dir
        torch.save({'meta': {'iter': 5}, 'state_dict': {}}, osp.join(work_dir, 'iter_5.pth'))
        return 0
    with pytest.raises(UsageError, match=r'^transfer_xcit_s12_poly3 ended without its last checkpoint in .* '
                                         r'\(partial\): the chain stops$'):
        chain_run.execute(p, chain_run.probe(p), launch=launch, say=lambda *a, **k: None)
    assert len(started) == 1


def test_submit_is_one_sbatch_job_with_time_requeue_and_the_signal_running_the_same_command():
    tool = load_tool('warm_start')
    argv = [CONFIG, '--launcher', 'slurm', '--partition', 'p', '--gpus', '8', '--submit', '--time', '2-00:00:00',
            '--signal-before=600', '--sbatch-args', '--account=a --qos=q']
    args = tool.parse_args(argv)
    job = tool._job_argv(argv)
    assert job == [CONFIG, '--launcher', 'slurm', '--partition', 'p', '--gpus', '8']
    cmd = submit_command(job, tool.request_of(args), 'work_dirs', '/env/bin/python', '/repo/tools/warm_start.py',
                         args.time, args.signal_before, args.sbatch_args)
    for want in ('--partition=p', '--nodes=1', '--ntasks-per-node=8', '--gres=gpu:8', '--requeue', '--time=2-00:00:00',
                 '--signal=B:USR1@600', '--account=a', '--qos=q', '--open-mode=append', '--cpus-per-task=10'):
        assert want in cmd, (want, cmd)
    assert cmd[-1].startswith('--wrap=cd ') and cmd[-1].endswith(
        f'exec /env/bin/python /repo/tools/warm_start.py {CONFIG} --launcher slurm --partition p --gpus 8 --in-job')
    assert any(c.startswith('--output=') and c.endswith('/work_dirs/logs/warm_start.%j.out') for c in cmd)


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
])
def test_bad_cluster_options_are_one_line(args, message, tool):
    status, out, err = tool(CONFIG, '--dry-run', *args)
    lines = [ln for ln in err.strip().splitlines() if 'error' in ln]
    assert status == 2 and len(lines) == 1 and message in lines[0], err


@pytest.mark.parametrize('env,message', [
    ({'NNODES': 'two'}, "NNODES='two': a whole number is expected"),
    ({'NNODES': '2', 'NODE_RANK': '2'}, 'NODE_RANK=2 with NNODES=2: node ranks are 0 to NNODES - 1'),
    ({'NNODES': '2', 'CHAIN_PORT': '70000'}, "CHAIN_PORT='70000': a TCP port (1-65535) is expected"),
])
def test_bad_node_variables_are_one_line(env, message, monkeypatch):
    for k in ('NNODES', 'NODE_RANK', 'CHAIN_PORT', 'PORT'):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UsageError) as e:
        node_env()
    assert str(e.value).startswith(message)
