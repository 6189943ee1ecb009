"""The cluster tests (.ci/run runs them after `make test`, which leaves this folder out): a real one-node Slurm
(tools/slurm_local.sh: munged, slurmctld and slurmd on this machine): the chain as srun jobs and submitted through
submitit.

Where Slurm cannot be started here (no root, no apt-get) they skip, saying why; with ``SOFTFREE_MM_REQUIRE_CLUSTER=1``
(set by .ci/run) they fail instead. Shared by the files: the demo chain's release (the demo's XCiT-T12 classifier
with softmax, a few iterations) and the chain's command at demo scale, two processes a run.
"""
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

REQUIRE = 'SOFTFREE_MM_REQUIRE_CLUSTER'
TOOL = osp.join(ROOT, 'tools', 'warm_start.py')
SLURM_LOCAL = osp.join(ROOT, 'tools', 'slurm_local.sh')
DETECTOR = osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_t12_poly3_warm_demo.py')  # stage 1, stage 2, detector
CLASSIFIER = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_t12_poly3_demo.py')  # stage 1, stage 2 (the classifier)
STAGE1, STAGE2 = 'transfer_xcit_t12_poly3_demo', 'finetune_xcit_t12_poly3_demo'
# the demo chain of tests/tools/test_warm_start_chain.py, 2 processes a run (so its recipe batch: kept)
STAGE_OPTIONS = ['--iters', '6', '--batch-scale', 'keep', '--train-args', '--device cpu',
                 '--stage1-options', 'train_dataloader.dataset.indices=64']
STAGE2_OPTIONS = ['train_dataloader.dataset.indices=64', 'val_dataloader.dataset.indices=16']


def unavailable(reason):
    """Skip, or fail where the cluster tests must run (.ci/run)."""
    if os.environ.get(REQUIRE) == '1':
        pytest.fail(f'{REQUIRE}=1 and {reason}')
    pytest.skip(reason)


@pytest.fixture(scope='session')
def slurm():
    """A running one-node Slurm (SLURM_CONF set for this process and its children); started here when it is not
    running, and then stopped at the end by the PIDs the script kept."""
    status = subprocess.run(['bash', SLURM_LOCAL, 'status'], capture_output=True, text=True)
    started = status.returncode != 0
    if started:
        up = subprocess.run(['bash', SLURM_LOCAL, 'up'], capture_output=True, text=True, timeout=600)
        if up.returncode:
            unavailable(f'no Slurm here: {up.stderr.strip().splitlines()[-1] if up.stderr.strip() else up.returncode}')
        conf = up.stdout.strip().split('SLURM_CONF=')[-1]
    else:
        conf = status.stdout.strip().split('SLURM_CONF=')[-1]
    os.environ['SLURM_CONF'] = conf
    yield conf
    if started:
        subprocess.run(['bash', SLURM_LOCAL, 'down'], capture_output=True, text=True, timeout=60)


def run(cmd, cwd, timeout=900, **kw):
    proc = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=timeout, **kw)
    return proc


@pytest.fixture(scope='session')
def release(tmp_path_factory):
    """The demo chain's release: the demo's XCiT-T12 classifier with softmax, one short epoch."""
    where = tmp_path_factory.mktemp('release')
    work_dir = where / 'softmax_cls'
    proc = run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), CLASSIFIER, '--work-dir', str(work_dir),
                '--cfg-options', 'model.backbone.attn_cfg=softmax', 'train_cfg.max_epochs=1',
                'train_dataloader.dataset.indices=64', 'val_dataloader.dataset.indices=16'], where, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(work_dir)


# a stage 1 that is done, made by the first test that runs it at 2 processes (the run identities of both launches
# agree: world size 2, the same release file, recipe and length); the others copy it instead of training it again
_DONE_STAGE1 = {}


def keep_stage1(root):
    if osp.isfile(osp.join(root, STAGE1, 'iter_2.pth')):
        _DONE_STAGE1.setdefault('dir', osp.join(root, STAGE1))


def seed_stage1(root) -> bool:
    """Copy a done stage 1 into ``root`` (False when no test has made one yet)."""
    src = _DONE_STAGE1.get('dir')
    if src is None:
        return False
    dest = osp.join(root, STAGE1)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns('2*'))  # not its log folders
    with open(osp.join(dest, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(dest, 'iter_2.pth'))
    return True
