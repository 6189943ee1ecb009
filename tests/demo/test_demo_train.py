"""Each task's demo config trains, saves, resumes and evaluates through tools/train.py and tools/test.py.

Guards, per task (Mask R-CNN / COCO AP via pycocotools, UperNet and Semantic FPN / mIoU, classifier / top-1):
the demo data is written on demand under a ``data/demo`` root; training runs and checkpoints; ``--resume``
continues from the saved iteration instead of starting again; tools/test.py evaluates the checkpoint and reports
the task's metric. The demo configs run unchanged except for a tiny backbone / head width (a child config written
here) and two or three iterations, to keep CPU time small.
"""
import glob
import json
import math
import os.path as osp

import pytest
import torch

from tests.helpers import load_tool
from tests.helpers.demo import DEMO, TINY  # the demo configs at tiny widths

# a short schedule: run 1 trains to ``first``, run 2 resumes to ``second``
SCHEDULE = {
    'iter': ("""
train_cfg = dict(max_iters={n}, val_interval=1000)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=3))
""", 2, 3),
    'epoch': ("""
train_cfg = dict(max_epochs={n}, val_interval=1000)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=3))
""", 1, 2),
}
METRIC = {'maskrcnn': ('coco/bbox_mAP', 'coco/segm_mAP'), 'upernet': ('mIoU', ), 'semfpn': ('mIoU', ),
          'cls': ('accuracy/top1', )}


@pytest.fixture(scope='module')
def tools():
    return load_tool('train'), load_tool('test')


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    """A ``data/demo`` root that does not exist yet: the first tool run writes it."""
    return str(tmp_path_factory.mktemp('demo_runs') / 'data' / 'demo')


def _tiny_config(task, folder, n):
    base, text = TINY[task]
    kind = 'epoch' if task == 'cls' else 'iter'
    path = osp.join(folder, f'{task}_tiny_{n}.py')
    with open(path, 'w') as f:
        f.write(f"_base_ = {osp.join(DEMO, base)!r}\n{text}\n{SCHEDULE[kind][0].format(n=n)}\n")
    return path


def _reroot(task, demo_root):
    """--cfg-options that move every data root from data/demo to the test's demo root; a small validation set."""
    sub = {'maskrcnn': 'coco/', 'upernet': 'ade', 'semfpn': 'ade', 'cls': 'imagenet'}[task]
    root = osp.join(demo_root, sub)
    opts = [f'{k}.dataset.data_root={root}' for k in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    opts += [f'{k}.dataset.indices=4' for k in ('val_dataloader', 'test_dataloader')]
    if task == 'maskrcnn':
        ann = osp.join(root, 'annotations', 'instances_val2017.json')
        opts += [f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']
    return opts


def _scalar_steps(work_dir):
    steps = []
    for p in sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(p) as f:
            steps.append([json.loads(line)['step'] for line in f if '"loss"' in line])
    return steps


@pytest.mark.parametrize('task', list(TINY))
def test_demo_config_trains_saves_resumes_and_evaluates(task, tools, demo_root, tmp_path):
    train, test = tools
    kind = 'epoch' if task == 'cls' else 'iter'
    _, first, second = SCHEDULE[kind]
    work = str(tmp_path / 'work')
    opts = _reroot(task, demo_root)
    # a visualizer is one named instance per process: give each run its own, so its logs land in its own folder
    opts_run = [*opts, f'visualizer.name=vis_{task}_{tmp_path.name}_']

    torch.manual_seed(0)
    assert train.main([_tiny_config(task, str(tmp_path), first), '--work-dir', work,
                       '--cfg-options', *opts_run[:-1], opts_run[-1] + '1']) == 0
    assert osp.exists(osp.join(demo_root, {'maskrcnn': 'coco', 'cls': 'imagenet'}.get(task, 'ade'), '.complete'))
    ckpt1 = osp.join(work, f'{kind}_{first}.pth')
    assert osp.isfile(ckpt1)

    assert train.main([_tiny_config(task, str(tmp_path), second), '--work-dir', work, '--resume',
                       '--cfg-options', *opts_run[:-1], opts_run[-1] + '2']) == 0
    ckpt2 = osp.join(work, f'{kind}_{second}.pth')
    meta1 = torch.load(ckpt1, map_location='cpu')['meta']
    meta2 = torch.load(ckpt2, map_location='cpu')['meta']
    assert meta2[kind] == second
    # resumed, not restarted: over both runs every iteration was logged exactly once, in order (a restart would
    # log iteration 1 again)
    assert len(_scalar_steps(work)) == 2
    steps = [s for run in _scalar_steps(work) for s in run]
    assert meta1['iter'] >= 1 and steps == list(range(1, meta2['iter'] + 1))

    assert test.main([_tiny_config(task, str(tmp_path), second), ckpt2, '--work-dir', work,
                      '--cfg-options', *opts_run[:-1], opts_run[-1] + '3']) == 0
    with open(osp.join(work, 'test_metrics.json')) as f:
        metrics = json.load(f)
    for key in METRIC[task]:
        assert key in metrics, f'{key} missing from {sorted(metrics)}'
        value = metrics[key]
        assert math.isfinite(value)
        assert 0 <= value <= (1 if task == 'maskrcnn' else 100)

    # the other outputs of tools/test.py, one task each: raw predictions (--out), submission files (--format-only)
    if task == 'cls':
        out = str(tmp_path / 'preds.pkl')
        assert test.main([_tiny_config(task, str(tmp_path), second), ckpt2, '--work-dir', work, '--out', out,
                          '--cfg-options', *opts_run[:-1], opts_run[-1] + '4']) == 0
        import pickle
        with open(out, 'rb') as f:
            preds = pickle.load(f)
        assert len(preds) == 4 and all(0 <= int(p['pred_label']) < 1000 for p in preds)
    if task == 'maskrcnn':
        assert test.main([_tiny_config(task, str(tmp_path), second), ckpt2, '--work-dir', work, '--format-only',
                          '--cfg-options', *opts_run[:-1], opts_run[-1] + '4']) == 0
        for kind in ('bbox', 'segm'):
            with open(osp.join(work, 'format_only', f'results.{kind}.json')) as f:
                results = json.load(f)
            assert isinstance(results, list) and all(r['category_id'] in range(1, 11) for r in results)
