"""The chain submitted through submitit to a real one-node Slurm (tests/cluster/conftest.py starts it; issue 69): one
job per stage, 2 tasks each, on a partition without GPU GRES, in a work root whose path holds a space.

- An iteration-based stage (stage 2 of the demo classifier chain, 12 iterations, a checkpoint every 4) is warned with
  USR2 (what ``--signal`` sends before the time limit; sent here with ``scancel --signal``), saves one checkpoint at
  its iteration and requeues; the requeued job resumes there; it is then preempted (``scontrol requeue``) and resumes
  from its newest checkpoint; it ends with weights equal to those of the same stage run without interruption (the
  same 2 processes through ``--launcher pytorch``).
- An epoch-based main job (the demo detector as mmdet's Mask R-CNN configs train: EpochBasedTrainLoop,
  AspectRatioBatchSampler; 2 epochs of 8 iterations) warned mid-epoch saves once, requeues, resumes mid-epoch at the
  next batch (the log names what was skipped, nothing is repeated) and ends at the uninterrupted run's epoch and
  iteration counters.
- A job warned before it has made any progress (what a too short --time gives) stops with one line, not requeued.
"""
import glob
import os
import os.path as osp
import re
import subprocess
import sys
import time

import torch

from tests.cluster.conftest import CLASSIFIER, STAGE1, STAGE2, STAGE2_OPTIONS, STAGE_OPTIONS, TOOL, ROOT, seed_stage1

SLURM = ['--launcher', 'slurm', '--partition', 'cpu', '--gpus', '2', '--cpus-per-task', '1']
STAGE2_RUN = [*STAGE2_OPTIONS, 'train_cfg.max_iters=12', 'default_hooks.logger.interval=1',
              'default_hooks.checkpoint.interval=4']


def _job(job):
    out = subprocess.run(['scontrol', 'show', 'job', str(job)], capture_output=True, text=True).stdout
    m = re.search(r'JobState=(\w+)', out)
    return (m.group(1) if m else 'UNKNOWN'), out


def _log(root, job):
    path = osp.join(root, 'logs', 'submitit', f'{job}_0_log.out')
    return open(path).read() if osp.exists(path) else ''


def _wait(root, job, pattern, after=0, timeout=600):
    """Until task 0's output matches ``pattern`` past character ``after`` (a requeued job starts before this)."""
    deadline = time.time() + timeout
    while not re.search(pattern, _log(root, job)[after:]):
        state, info = _job(job)
        if state == 'PENDING' and 'Reason=BeginTime' in info:  # a requeued job waits 2 minutes: start it now
            subprocess.run(['scontrol', 'update', f'JobId={job}', 'StartTime=now'], capture_output=True)
        assert state in ('PENDING', 'RUNNING', 'REQUEUED', 'COMPLETING'), (state, _log(root, job)[-4000:])
        assert time.time() < deadline, _log(root, job)[-4000:]
        time.sleep(0.3)


def _end(root, job, timeout=900):
    deadline = time.time() + timeout
    while True:
        state, info = _job(job)
        if state == 'PENDING' and 'Reason=BeginTime' in info:
            subprocess.run(['scontrol', 'update', f'JobId={job}', 'StartTime=now'], capture_output=True)
        if state in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL'):
            return state, info
        assert time.time() < deadline, _log(root, job)[-4000:]
        time.sleep(0.5)


def _submit(cmd, cwd):
    sub = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=600)
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    return re.findall(r'^\[warm-start\] \d/\d (\S+): job (\d+)', sub.stdout, re.M), sub.stdout


def _weights(path):
    return torch.load(path, map_location='cpu', weights_only=False)['state_dict']


def test_an_iteration_based_stage_signalled_and_preempted_resumes_to_the_uninterrupted_weights(
        slurm, release, tmp_path):
    root = tmp_path / 'work root'  # a space in every path the jobs see
    seeded = seed_stage1(str(root))
    cmd = [sys.executable, TOOL, CLASSIFIER, '--work-root', str(root), '--release', release, *SLURM, *STAGE_OPTIONS,
           '--stage2-options', *STAGE2_RUN, '--submit', '--time', '30', '--signal-before', '120']
    jobs, out = _submit(cmd, tmp_path)
    assert [name for name, _ in jobs] == ([STAGE2] if seeded else [STAGE1, STAGE2]), out
    job = jobs[-1][1]
    _, info = _job(job)
    assert 'Requeue=1' in info and 'TimeLimit=00:30:00' in info, info
    _wait(root, job, r'Iter\(train\) \[\s*2/12\]')
    subprocess.run(['scancel', '--signal=USR2', job], check=True)  # the warning before the time limit
    _wait(root, job, rf'resumes from \S.*/{STAGE2}/iter_\d+\.pth \(iteration \d+\)')
    text = _log(root, job)
    saved = re.findall(rf'SIGUSR2 received: saved \S.*/{STAGE2}/iter_(\d+)\.pth at iteration (\d+)', text)
    assert len(saved) == 1 and saved[0][0] == saved[0][1], text[-4000:]
    at = int(saved[0][0])
    assert 2 <= at < 12 and f'/{STAGE2}/iter_{at}.pth (iteration {at})' in text, text[-4000:]
    mark = len(text)
    _wait(root, job, rf'Iter\(train\) \[\s*{min(at + 5, 11)}/12\]', after=mark)  # a checkpoint past the resume
    subprocess.run(['scontrol', 'requeue', job], check=True)  # preemption
    state, info = _end(root, job)
    text = _log(root, job)
    assert state == 'COMPLETED' and 'Restarts=2' in info, text[-4000:]
    resumed = [int(n) for n in re.findall(rf'resumes from \S.*/{STAGE2}/iter_(\d+)\.pth', text)]
    assert len(resumed) == 2 and resumed[0] == at and resumed[1] > at, text[-4000:]  # the newest checkpoint
    assert len(re.findall('SIGUSR2 received', text)) == 1
    assert f'[warm-start] {STAGE2}: done (' in text
    # the same stage without interruption: 2 processes through --launcher pytorch
    ref = tmp_path / 'reference'
    seed_stage1(str(ref)) or subprocess.run(['cp', '-r', str(root / STAGE1), str(ref / STAGE1)], check=True)
    whole = subprocess.run([sys.executable, TOOL, CLASSIFIER, '--work-root', str(ref), '--release', release,
                            '--launcher', 'pytorch', '--gpus', '2', *STAGE_OPTIONS, '--stage2-options', *STAGE2_RUN],
                           cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    mine, theirs = _weights(root / STAGE2 / 'iter_12.pth'), _weights(ref / STAGE2 / 'iter_12.pth')
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), [k for k in mine if not torch.equal(mine[k], theirs[k])]


EPOCHS = '''
_base_ = {base!r}
train_dataloader = dict(batch_size=1, sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
                        batch_sampler=dict(type='AspectRatioBatchSampler'), dataset=dict(indices=16))
val_dataloader = dict(dataset=dict(indices=4))
test_dataloader = dict(dataset=dict(indices=4))
train_cfg = dict(_delete_=True, type='EpochBasedTrainLoop', max_epochs=2, val_interval=2)
param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=2)]
default_hooks = dict(checkpoint=dict(interval=1, by_epoch=True), logger=dict(interval=1))
log_processor = dict(by_epoch=True)
'''


def test_an_epoch_based_main_job_signalled_mid_epoch_resumes_mid_epoch_and_ends_at_the_same_counters(
        slurm, release, tmp_path):
    root = tmp_path / 'w'
    seed_stage1(str(root))
    config = tmp_path / 'maskrcnn_epochs_demo.py'
    config.write_text(EPOCHS.format(base=osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_t12_poly3_warm_demo.py')))
    cmd = [sys.executable, TOOL, str(config), '--work-root', str(root), '--release', release, *SLURM,
           *STAGE_OPTIONS, '--stage2-options', *STAGE2_OPTIONS, '--submit', '--time', '30', '--signal-before', '120']
    jobs, out = _submit(cmd, tmp_path)
    job = jobs[-1][1]
    assert jobs[-1][0] == 'maskrcnn_epochs_demo', out
    _wait(root, job, r'Epoch\(train\)\s+\[1\]\[\s*2/8\]', timeout=900)
    subprocess.run(['scancel', '--signal=USR2', job], check=True)
    state, info = _end(root, job)
    text = _log(root, job)
    assert state == 'COMPLETED' and 'Restarts=1' in info, text[-4000:]
    saved = re.findall(r'SIGUSR2 received: saved \S+/maskrcnn_epochs_demo/iter_(\d+)\.pth at iteration \d+ '
                       r'\(epoch 1, batch (\d) of 8', text)
    assert len(saved) == 1, text[-4000:]
    at = int(saved[0][0])
    assert 2 <= at < 8 and int(saved[0][1]) == at
    assert (f'resumed mid-epoch: epoch 1 goes on at batch {at + 1} of 8; the {at} batches it trained before the '
            'stop are skipped') in text, text[-4000:]
    files = sorted(f for f in os.listdir(root / 'maskrcnn_epochs_demo') if f.endswith('.pth'))
    assert 'epoch_2.pth' in files and [f for f in files if f.startswith('iter_')] == [f'iter_{at}.pth'], files
    # one checkpoint for the signal (the config keeps the newest epoch checkpoint only)
    meta = torch.load(root / 'maskrcnn_epochs_demo' / 'epoch_2.pth', map_location='cpu', weights_only=False)['meta']
    assert (meta['epoch'], meta['iter']) == (2, 16)  # the uninterrupted run's counters: 2 epochs of 8
    trained = re.findall(r'Epoch\(train\)\s+\[(\d)\]\[\s*(\d)/8\]', text)
    assert sorted(trained) == [(e, b) for e in '12' for b in '12345678'], trained  # every batch once


def test_a_job_warned_before_any_progress_stops_with_one_line(slurm, release, tmp_path):
    root = tmp_path / 'w'
    seed_stage1(str(root))  # stage 1 of an earlier test when one ran (else its job runs first)
    cmd = [sys.executable, TOOL, CLASSIFIER, '--work-root', str(root), '--release', release, *SLURM, *STAGE_OPTIONS,
           '--stage2-options', *STAGE2_RUN, '--submit', '--time', '30', '--signal-before', '120']
    jobs, _ = _submit(cmd, tmp_path)
    job = jobs[-1][1]
    _wait(root, job, rf'\[warm-start\] {STAGE2}: starts')  # before its first iteration
    subprocess.run(['scancel', '--signal=USR2', job], check=True)
    state, info = _end(root, job)
    text = _log(root, job)
    assert state == 'FAILED' and 'Restarts=0' in info, text[-4000:]
    lines = [ln for ln in text.splitlines() if 'made no progress' in ln]
    assert lines == [f'error: {STAGE2} made no progress in this allotment (it started at iteration 0 and has no '
                     'newer checkpoint when the time-limit signal came): not requeued; give the job more time '
                     '(--time) or warn it later (--signal-before), then submit the same command again'], text[-4000:]
    assert not glob.glob(str(root / STAGE2 / 'iter_*.pth'))
