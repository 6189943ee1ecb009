"""A 2-process CPU training (torchrun, gloo) of a demo config runs to completion through tools/dist_train.sh.
CPU is asked for explicitly (--device cpu): under a launcher the tools do not fall back to CPU by themselves.

Guards: the CPU settings tools/train.py picks without CUDA (gloo, DDP without device_ids, BN for SyncBN) together
with softfree_mm.compat's init_dist repair make a real 2-process run work; the data is sharded over both processes
(each runs half the iterations of an epoch); rank 0 saves a checkpoint that loads again; the distributed
evaluation gathers results from both ranks into a top-1; the process group is torn down cleanly at the end (no
rank aborts with "terminate called" on exit; tools/test.py ends the same way, launch.finish_dist).
"""
import glob
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.demo import shared_demo_root

DEMO_CFG = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU (gloo) path')
def test_two_process_gloo_training_of_demo_config_completes_and_checkpoints(tmp_path, tmp_path_factory):
    cfg = tmp_path / 'cls_tiny_dist.py'
    cfg.write_text(f"""_base_ = {DEMO_CFG!r}
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=4, dataset=dict(indices=16))
val_dataloader = dict(batch_size=4, dataset=dict(indices=8))
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
""")
    demo_root = shared_demo_root(tmp_path_factory)  # written on demand by the tool (under a file lock)
    work = str(tmp_path / 'work')
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(_free_port()), OMP_NUM_THREADS='1')
    proc = subprocess.run(
        ['bash', osp.join(ROOT, 'tools', 'dist_train.sh'), str(cfg), '2', '--work-dir', work, '--device', 'cpu',
         '--cfg-options',
         f'train_dataloader.dataset.data_root={demo_root}', f'val_dataloader.dataset.data_root={demo_root}'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'terminate called' not in proc.stderr and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    logs = glob.glob(osp.join(work, '*', '*.log'))
    assert len(logs) == 1
    log = open(logs[0]).read()
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    # 16 images, 4 per process, 2 processes: 2 iterations per epoch on each rank
    assert 'Epoch(train) [1][2/2]' in log and 'Epoch(train) [1][3/' not in log
    assert 'accuracy/top1' in log
    import softfree_mm  # noqa: F401  (its compat repair lets torch 2.14 load mmengine checkpoints)
    ckpt = torch.load(osp.join(work, 'epoch_1.pth'), map_location='cpu')
    assert ckpt['meta']['epoch'] == 1 and ckpt['meta']['iter'] == 2
    assert len(ckpt['softfree_mm_rng']) == 2  # both processes' random states, for an exact resume
    assert any(k.startswith('backbone.') for k in ckpt['state_dict'])
