"""The warm-start chain against a real Slurm (tests/cluster/conftest.py starts one on this machine): every stage an
srun job of 2 tasks on a partition without GPU GRES (the submitted chain: test_submitted_chain.py).

Guards: tools/slurm_train.sh runs PYTHON and asks no GRES with GPUS_PER_NODE=0 (this partition refuses a GRES
request); through --launcher slurm the demo chain runs stage 1, stage 2 and the demo detector as srun jobs of 2 tasks
(no --gres asked: the partition has none), each stage's log in WORK_ROOT/logs and its path printed; stage 2 cancelled
with scancel stops the chain (the done check runs under slurm too), and the same command resumes stage 2 without
running stage 1 again and finishes.
"""
import os
import os.path as osp
import re
import subprocess
import sys
import time

from tests.cluster.conftest import DETECTOR, STAGE1, STAGE2, STAGE2_OPTIONS, STAGE_OPTIONS, TOOL, keep_stage1

SLURM = ['--launcher', 'slurm', '--partition', 'cpu', '--gpus', '2', '--cpus-per-task', '1']


def _saved(work_dir):
    last = osp.join(work_dir, 'last_checkpoint')
    name = osp.basename(open(last).read().strip()) if osp.exists(last) else ''
    return int(name[len('iter_'):-len('.pth')]) if name.startswith('iter_') else 0

def test_the_demo_chain_runs_as_srun_jobs_and_resumes_after_scancel(slurm, release, tmp_path):
    root = tmp_path / 'w'
    cmd = [sys.executable, TOOL, DETECTOR, '--work-root', str(root), '--release', release, *SLURM, *STAGE_OPTIONS,
           '--stage2-options', *STAGE2_OPTIONS, 'default_hooks.checkpoint.interval=1',
           '--cfg-options', 'train_cfg.max_iters=2', 'val_dataloader.dataset.indices=4',
           'test_dataloader.dataset.indices=4']
    stage2 = root / STAGE2
    with open(tmp_path / 'first.log', 'w') as out:
        proc = subprocess.Popen(cmd, cwd=str(tmp_path), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 600
        while _saved(str(stage2)) < 1:  # stage 2 has begun: cancel its job
            assert proc.poll() is None, (tmp_path / 'first.log').read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.2)
        jobs = subprocess.run(['squeue', '-h', '-n', f'warm_start_{STAGE2}', '-o', '%i'], capture_output=True,
                              text=True).stdout.split()
        assert len(jobs) == 1, jobs
        subprocess.run(['scancel', jobs[0]], check=True)
        status = proc.wait(300)
    first = (tmp_path / 'first.log').read_text()
    assert status != 0 and f'{STAGE2} stopped with exit status' in first, first[-3000:]
    assert 'every run of the chain is done' not in first
    keep_stage1(str(root))
    stage1_files = sorted(os.listdir(root / STAGE1))
    at_cancel = _saved(str(stage2))
    assert 1 <= at_cancel < 4

    done = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f'stopped at iter {at_cancel} of 4: resumes from' in out and 'not needed: stage 2 (fine-tune) resumes' in out
    assert sorted(os.listdir(root / STAGE1)) == stage1_files  # stage 1 not run again
    assert (stage2 / 'iter_4.pth').exists()
    assert (root / 'maskrcnn_xcit_t12_poly3_warm_demo' / 'iter_2.pth').exists()
    assert 'every run of the chain is done' in out
    # each stage an srun job of 2 tasks, without --gres, its log kept in the work root and its path printed
    logs = re.findall(r'^\[warm-start\] \d/3 (\S+): log (\S+)$', first + out, re.M)
    assert [name for name, _ in logs] == [STAGE1, STAGE2, STAGE2, 'maskrcnn_xcit_t12_poly3_warm_demo'], logs
    for name, path in logs:
        assert path.startswith(str(root / 'logs' / name)) and osp.isfile(path), path
    launches = [ln for ln in (first + out).splitlines() if re.match(r'^\[warm-start\] \d/3 \S+: bash ', ln)]
    assert len(launches) == 4 and all('slurm_train.sh cpu ' in ln for ln in launches), launches
    resumed_log = open(logs[2][1]).read()
    assert re.search(rf'resumed epoch: 0, iter: {at_cancel}\b', resumed_log), resumed_log[-3000:]
    # 2 tasks: each says how it runs (gloo: no CUDA), and the run identity the chain wrote says world size 2
    for _, path in logs:
        assert open(path).read().count('[softfree_mm] no CUDA: distributed backend gloo') == 2, path
    assert '"world_size": 2' in (stage2 / 'run_identity.json').read_text()

def test_the_slurm_script_runs_the_given_interpreter_and_asks_no_gres_with_gpus_per_node_0(slurm, tmp_path):
    """On this partition without GPU GRES: GPUS_PER_NODE=0 runs (2 tasks of PYTHON), a GRES request is refused."""
    script = osp.join(osp.dirname(TOOL), 'slurm_train.sh')
    env = dict(os.environ, GPUS='2', CPUS_PER_TASK='1', PYTHON='/bin/echo')
    ok = subprocess.run(['bash', script, 'cpu', 'j', 'C.py', 'W'], env=dict(env, GPUS_PER_NODE='0'),
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [f'-u {osp.dirname(TOOL)}/train.py C.py --work-dir=W --launcher=slurm'] * 2
    refused = subprocess.run(['bash', script, 'cpu', 'j', 'C.py', 'W'], env=dict(env, GPUS_PER_NODE='1'),
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and 'gres' in refused.stderr.lower(), refused.stderr
