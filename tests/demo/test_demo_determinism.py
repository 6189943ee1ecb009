"""Same seed, same numbers: the demo's pretraining -> detector chain, run twice, gives identical losses, metrics
and predictions, to the last bit.

The chain is `make demo`'s (tools/run_demo.py) through the same tools, shortened: the demo classifier config trains
two iterations and saves its checkpoint; the demo Mask R-CNN config starts its backbone from that checkpoint
(init_cfg Pretrained, prefix 'backbone.'), trains three iterations, and tools/test.py evaluates it on four val images
(COCO AP with pycocotools) and dumps its raw predictions. Both configs run at a tiny width (everything else is the
demo's). Guards: the two runs' logged losses and gradient norms, COCO metrics, and predicted boxes, scores, labels
and masks are equal exactly; a run with another seed gives other losses (so the comparison can fail).
"""
import glob
import json
import os
import os.path as osp
import pickle

import numpy as np
import pytest

from tests.helpers import load_tool
from tests.helpers.demo import DEMO

CLS_TINY = """
model = dict(backbone=dict(embed_dims=32, depth=4, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=8, dataset=dict(indices=16))
val_dataloader = dict(dataset=dict(indices=8))
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
"""
DET_TINY = """
model = dict(
    backbone=dict(embed_dims=32, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[32, 32, 32, 32], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(in_channels=32, conv_out_channels=32)),
    train_cfg=dict(rpn_proposal=dict(max_per_img=64), rcnn=dict(sampler=dict(num=16))),
    test_cfg=dict(rpn=dict(max_per_img=64)))
train_cfg = dict(max_iters={iters})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval={iters}))
randomness = dict(seed={seed})
"""


@pytest.fixture(scope='module')
def tools():
    return load_tool('train'), load_tool('test')


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    from softfree_mm.engine.demo_data import make_demo_data
    return make_demo_data(str(tmp_path_factory.mktemp('determinism') / 'data' / 'demo'), only=['coco', 'imagenet'])


def _child(path, base, text):
    with open(path, 'w') as f:
        f.write(f'_base_ = {osp.join(DEMO, base)!r}\n{text}\n')
    return str(path)


def _logged(work_dir):
    """Every logged training record (losses, grad norm, lr), without the timings."""
    (path, ) = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k.startswith(('loss', 'grad_norm', 'lr', 'step'))} for r in recs
            if 'loss' in r]


def _chain(tools, data_root, folder, tag, seed=0, iters=3, cls_ckpt=None):
    """Pretrain (unless ``cls_ckpt`` is given), fine-tune the detector from it, evaluate."""
    train, test = tools
    os.makedirs(folder)
    coco, inet = osp.join(data_root, 'coco') + '/', osp.join(data_root, 'imagenet')
    cls_dir, det_dir = osp.join(folder, 'cls'), osp.join(folder, 'det')
    out = {}
    if cls_ckpt is None:
        cls_cfg = _child(osp.join(folder, 'cls.py'), 'cls_xcit_s12_poly3_demo.py', CLS_TINY)
        assert train.main([cls_cfg, '--work-dir', cls_dir, '--cfg-options', f'visualizer.name=det_{tag}_cls',
                           f'train_dataloader.dataset.data_root={inet}',
                           f'val_dataloader.dataset.data_root={inet}']) == 0
        with open(osp.join(cls_dir, 'last_checkpoint')) as f:
            cls_ckpt = f.read().strip()
        out.update(cls=_logged(cls_dir), cls_ckpt=cls_ckpt)
    det_cfg = _child(osp.join(folder, 'det.py'), 'maskrcnn_xcit_s12_poly3_demo.py',
                     DET_TINY.format(iters=iters, seed=seed))
    data = [f'{k}.dataset.data_root={coco}' for k in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    data += [f'{k}.ann_file={coco}annotations/instances_val2017.json' for k in ('val_evaluator', 'test_evaluator')]
    assert train.main([det_cfg, '--work-dir', det_dir, '--cfg-options', f'visualizer.name=det_{tag}_det',
                       f'model.backbone.init_cfg.checkpoint={cls_ckpt}', *data]) == 0
    with open(osp.join(det_dir, 'last_checkpoint')) as f:
        det_ckpt = f.read().strip()
    preds = osp.join(folder, 'preds.pkl')
    assert test.main([det_cfg, det_ckpt, '--work-dir', det_dir, '--out', preds, '--cfg-options',
                      f'visualizer.name=det_{tag}_test', 'test_dataloader.dataset.indices=4', *data]) == 0
    with open(osp.join(det_dir, 'test_metrics.json')) as f:
        metrics = json.load(f)
    with open(preds, 'rb') as f:
        predictions = pickle.load(f)
    return dict(out, det=_logged(det_dir), metrics=metrics, preds=predictions)


def _same_predictions(a, b):
    assert len(a) == len(b) == 4
    for pa, pb in zip(a, b):
        ia, ib = pa['pred_instances'], pb['pred_instances']
        for key in ('bboxes', 'scores', 'labels'):
            assert np.array_equal(np.asarray(ia[key]), np.asarray(ib[key])), key
        assert [m['counts'] for m in ia['masks']] == [m['counts'] for m in ib['masks']]


def test_two_runs_of_the_pretrain_to_detector_chain_are_identical_and_another_seed_is_not(tools, data_root,
                                                                                            tmp_path):
    first = _chain(tools, data_root, str(tmp_path / 'a'), 'a')
    second = _chain(tools, data_root, str(tmp_path / 'b'), 'b')
    assert len(first['cls']) == 2 and len(first['det']) == 3
    assert first['cls'] == second['cls']
    assert first['det'] == second['det']
    assert first['metrics'] == second['metrics'] and 'coco/bbox_mAP' in first['metrics']
    _same_predictions(first['preds'], second['preds'])
    # the comparison can fail: another detector seed (another RoI sampling, other head weights) changes the losses
    other = _chain(tools, data_root, str(tmp_path / 'c'), 'c', seed=1, iters=1, cls_ckpt=first['cls_ckpt'])
    assert other['det'][0]['loss'] != first['det'][0]['loss']
