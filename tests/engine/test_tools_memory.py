"""Memory under load: a training holds a flat resident memory after warm-up (no growth per iteration).

A short run of the smallest demo config (the classifier, tiny widths, an iteration-based schedule) through
tools/train.py records the process's resident memory after every iteration; the least-squares slope over the
iterations after warm-up must stay under 16 KiB per iteration (16 MiB per 1,000 iterations; a leak of one
64-image batch of 64 x 64 RGB floats per iteration would be 3 MiB an iteration). The README gives the figures of a
1,000-iteration run of the demo detector (tiny widths).
"""
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from tests.helpers import ROOT, load_tool
from tests.helpers.demo import shared_demo_root

DEMO_CLS = osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')
PAGE = os.sysconf('SC_PAGE_SIZE')
RSS = []


def rss_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * PAGE


@HOOKS.register_module(force=True)
class RecordRSSHook(Hook):
    priority = 'LOWEST'

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        RSS.append(rss_bytes())


@pytest.mark.skipif(not osp.exists('/proc/self/statm'), reason='reads /proc')
def test_resident_memory_is_flat_after_warm_up(tmp_path, tmp_path_factory):
    iters, warm = 50, 15
    root = shared_demo_root(tmp_path_factory)
    cfg = tmp_path / 'cls_tiny.py'
    cfg.write_text(f"""_base_ = {DEMO_CLS!r}
data_root = {root!r}
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=8, sampler=dict(type='InfiniteSampler', shuffle=True),
                        dataset=dict(data_root=data_root, indices=32))
val_dataloader = dict(batch_size=8, dataset=dict(data_root=data_root, indices=8))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={iters}, val_interval={iters + 1})
param_scheduler = []
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(by_epoch=False, interval={iters}))
custom_hooks = [dict(type='RecordRSSHook')]
""")
    RSS.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a shared 2-core machine (or 2 test workers) spin far longer
    try:
        assert load_tool('train').main([str(cfg), '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                        f'visualizer.name=vis_rss_{tmp_path.name}']) == 0
    finally:
        torch.set_num_threads(threads)
    assert len(RSS) == iters
    tail = np.array(RSS[warm:], dtype=np.float64)
    slope = np.polyfit(np.arange(len(tail)), tail, 1)[0]
    print(f'RSS {tail[0] / 2**20:.1f} -> {tail[-1] / 2**20:.1f} MiB, slope {slope / 1024:.2f} KiB/iteration')
    assert slope < 16 * 1024, f'resident memory grows {slope / 1024:.1f} KiB per iteration after warm-up'
