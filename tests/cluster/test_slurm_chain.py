"""The warm-start chain against a real Slurm (tests/cluster/conftest.py starts one on this machine): every stage an
srun job of 2 tasks on a partition without GPU GRES, and the chain as one sbatch job that survives a signal.

Guards: tools/slurm_train.sh runs PYTHON and asks no GRES with GPUS_PER_NODE=0 (this partition refuses a GRES
request); through --launcher slurm the demo chain runs stage 1, stage 2 and the demo detector as srun jobs of 2 tasks
(no --gres asked: the partition has none), each stage's log in WORK_ROOT/logs and its path printed; stage 2 cancelled
with scancel stops the chain (the done check runs under slurm too), and the same command resumes stage 2 without
running stage 1 again and finishes. --submit runs the chain as one sbatch job; USR1 to it (what --signal sends before
the time limit) makes the running stage save a checkpoint at its iteration and stop, the job requeue itself, and the
requeued job resume that stage from that checkpoint to the end.
"""
import glob
import os
import os.path as osp
import re
import subprocess
import sys
import time

from tests.cluster.conftest import (CLASSIFIER, DETECTOR, STAGE1, STAGE2, STAGE2_OPTIONS, STAGE_OPTIONS, TOOL,
                                    keep_stage1, seed_stage1)

SLURM = ['--launcher', 'slurm', '--partition', 'cpu', '--gpus', '2', '--cpus-per-task', '1']


def _job_state(job):
    out = subprocess.run(['scontrol', 'show', 'job', str(job)], capture_output=True, text=True).stdout
    m = re.search(r'JobState=(\w+)', out)
    return (m.group(1) if m else 'UNKNOWN'), out


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


def test_submit_runs_the_chain_as_one_job_that_saves_requeues_and_resumes_on_the_signal(slurm, release, tmp_path):
    root = tmp_path / 'w'
    seeded = seed_stage1(str(root))  # stage 1 of the test above, when it ran: only stage 2 runs here
    cmd = [sys.executable, TOOL, CLASSIFIER, '--work-root', str(root), '--release', release, *SLURM, *STAGE_OPTIONS,
           '--stage2-options', *STAGE2_OPTIONS, 'train_cfg.max_iters=12', 'default_hooks.logger.interval=1',
           'default_hooks.checkpoint.interval=100', '--submit', '--time', '30', '--signal-before', '120']
    sub = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    m = re.search(r'submitted job (\d+): .* its output (\S+);', sub.stdout)
    assert m, sub.stdout
    job, output = m.group(1), m.group(2)
    state, info = _job_state(job)
    for want in ('Requeue=1', 'TimeLimit=00:30:00'):
        assert want in info, info
    # stage 2 trains: USR1 to the job's batch shell, as sbatch --signal=B:USR1@120 sends it before the limit
    deadline = time.time() + 600
    while not [p for p in glob.glob(str(root / 'logs' / f'{STAGE2}.*.log'))
               if re.search(r'Iter\(train\) \[\s*2/12\]', open(p).read())]:
        assert _job_state(job)[0] in ('PENDING', 'RUNNING'), open(output).read()[-3000:]
        assert time.time() < deadline, open(output).read()[-3000:]
        time.sleep(0.3)
    subprocess.run(['scancel', '--signal=USR1', '--batch', job], check=True)
    # requeued: Slurm holds a requeued job two minutes (BeginTime); the test lets it start now
    deadline = time.time() + 900
    while True:
        state, info = _job_state(job)
        if state == 'PENDING' and 'Reason=BeginTime' in info:
            subprocess.run(['scontrol', 'update', f'JobId={job}', 'StartTime=now'], capture_output=True)
        if state in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT'):
            break
        assert time.time() < deadline, open(output).read()[-3000:]
        time.sleep(0.5)
    text = open(output).read()
    assert state == 'COMPLETED' and 'Restarts=1' in info, text[-4000:]
    saved = re.search(rf'SIGUSR1 received: saved (\S+/{STAGE2}/iter_(\d+)\.pth)', ''.join(
        open(p).read() for p in sorted(glob.glob(str(root / 'logs' / f'{STAGE2}.*.log')))))
    assert saved, text[-3000:]
    at = int(saved.group(2))
    assert 2 <= at < 12
    assert 'requeueing job' in text and f'stopped at iter {at} of 12: resumes from' in text, text[-4000:]
    assert text.count('every run of the chain is done') == 1
    assert (root / STAGE2 / 'iter_12.pth').exists()
    if seeded:  # stage 1 was done: the job ran stage 2 only
        assert f'[warm-start] 1/2 {STAGE1}: bash ' not in text and f'done: {root / STAGE1}' in text, text[-3000:]


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
