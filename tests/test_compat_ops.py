"""The compiled mmcv ops a shipped config calls, and softfree_mm.compat's mmcv_ops_on_torchvision.

With the default set-up (mmcv-lite) every op is served by the stand-in for ``mmcv._ext`` (tests/test_mmcv_ext.py
checks its values); here the shipped tasks are checked to call no op beyond nms and RoIAlign. With a compiled mmcv
(MMCV_COMPILED=1; the other tests skip without one) the ops run on torchvision's kernels where mmcv has no CUDA ops;
the route is forced on CPU here (SOFTFREE_MM_TORCHVISION_OPS=1) and compared with mmcv's own CPU ops on the real
(tiny) Mask R-CNN of the demo config.

Guards: the same detections, scores, labels and masks at test time (RPN NMS, RoIAlign 7x7 and 14x14, test-time
batched NMS); the same losses and gradients in training (mask targets through mmcv's roi_align, RoIAlign's
backward); no other compiled mmcv op is called by the detector, UperNet, Semantic FPN or the classifier; the route
is logged once, is not taken on CPU unless forced, and the op arguments mmcv passes (offset, score threshold,
max_num) keep their meaning.
"""
import os.path as osp
import sys

import numpy as np
import pytest
import torch

import softfree_mm  # noqa: F401  (applies the repairs)
from softfree_mm import compat

from tests.helpers.demo import DEMO, TINY  # the demo configs at tiny widths, as every demo test uses them

ROUTE = compat.ROUTE_ENV
needs_compiled = pytest.mark.skipif(compat.mmcv_ext_is_standin(), reason='compares with a compiled mmcv\'s own ops '
                                    '(MMCV_COMPILED=1 bash tools/setup_env.sh); here mmcv._ext is the stand-in')


def _cfg(task):
    from mmengine.config import Config
    base, text = TINY[task]
    cfg = Config.fromstring(f'_base_ = {osp.join(DEMO, base)!r}\n{text}', file_format='.py')
    if cfg.get('data_preprocessor'):  # mmpretrain keeps it beside the model; the Runner merges it in
        cfg.model.data_preprocessor = {**cfg.data_preprocessor, **cfg.model.get('data_preprocessor', {})}
    return cfg


def _build(cfg):
    import importlib
    scope = cfg.default_scope
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=True)
    MODELS = importlib.import_module(f'{scope}.registry').MODELS
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


@pytest.fixture(scope='module')
def detector():
    cfg = _cfg('maskrcnn')
    cfg.model.backbone.norm_cfg = dict(type='BN')  # one process, no SyncBN
    # many proposals and detections: the NMS calls have work to do
    cfg.model.test_cfg.rpn.max_per_img = 300
    cfg.model.test_cfg.rcnn.score_thr = 0.0
    cfg.model.test_cfg.rcnn.max_per_img = 100  # mmdet's default (the demo keeps 20): masks on every FPN level
    return _build(cfg)


def _det_batch(training):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(1)
    inputs, samples = [], []
    for h, w in ((224, 288), (256, 256)):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8))
        s = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        boxes = torch.tensor([[10.0, 20.0, 90.0, 120.0], [100.3, 50.7, 200.2, 180.9], [30.0, 140.0, 70.0, 215.0]])
        masks = np.zeros((3, h, w), np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.round().int().tolist()):
            masks[i, y1:y2, x1:(x1 + x2) // 2 + 3] = 1  # a mask that does not fill its box
        s.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([1, 4, 7]), masks=BitmapMasks(masks, h, w))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def _predict(model):
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(_det_batch(False), False)
        return model(**data, mode='predict')


def _loss_and_grads(model):
    model.train()
    model.zero_grad()
    torch.manual_seed(3)  # the RPN and RoI samplers draw random samples
    data = model.data_preprocessor(_det_batch(True), True)
    losses = model(**data, mode='loss')
    total = sum(v if torch.is_tensor(v) else sum(v) for k, v in losses.items() if 'loss' in k)
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: float(v if torch.is_tensor(v) else sum(v)) for k, v in losses.items()}, grads


def _calls():
    return dict(compat.TORCHVISION_OPS.calls)


@needs_compiled
def test_route_is_applied_to_both_mmcv_op_modules():
    import importlib
    assert 'mmcv_ops_on_torchvision' in compat.APPLIED
    for name in ('nms', 'roi_align'):
        assert importlib.import_module(f'mmcv.ops.{name}').ext_module is compat.TORCHVISION_OPS


@needs_compiled
def test_forced_route_gives_mmcv_detections_scores_and_masks(detector, monkeypatch):
    monkeypatch.setenv(ROUTE, '0')
    before = _calls()
    ref = _predict(detector)
    assert all(_calls().get(('torchvision', op), 0) == before.get(('torchvision', op), 0) for op in compat.ROUTED_OPS)
    monkeypatch.setenv(ROUTE, '1')
    before = _calls()
    out = _predict(detector)
    after = _calls()
    # the route really ran: RPN and test-time NMS, RoIAlign of boxes and of masks (one call per FPN level that
    # receives RoIs, so at least one each)
    assert after[('torchvision', 'nms')] - before.get(('torchvision', 'nms'), 0) >= 4
    assert after[('torchvision', 'roi_align_forward')] - before.get(('torchvision', 'roi_align_forward'), 0) >= 2
    for r, o in zip(ref, out):
        r, o = r.pred_instances, o.pred_instances
        assert len(r) >= 50, 'too few detections for a meaningful comparison'
        assert torch.equal(r.labels, o.labels)
        torch.testing.assert_close(o.bboxes, r.bboxes, rtol=0, atol=1e-4)
        torch.testing.assert_close(o.scores, r.scores, rtol=0, atol=1e-6)
        assert torch.equal(o.masks, r.masks)


@needs_compiled
def test_forced_route_gives_mmcv_losses_and_gradients(detector, monkeypatch):
    monkeypatch.setenv(ROUTE, '0')
    ref_losses, ref_grads = _loss_and_grads(detector)
    monkeypatch.setenv(ROUTE, '1')
    before = _calls()
    losses, grads = _loss_and_grads(detector)
    after = _calls()
    assert after[('torchvision', 'roi_align_backward')] > before.get(('torchvision', 'roi_align_backward'), 0)
    assert losses.keys() == ref_losses.keys() and ref_losses['loss_mask'] > 0
    for k in ref_losses:
        assert losses[k] == pytest.approx(ref_losses[k], rel=1e-5, abs=1e-6), k
    assert grads.keys() == ref_grads.keys()
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6, msg=k)


@needs_compiled
def test_route_not_taken_on_cpu_unless_forced(monkeypatch):
    from mmcv.ops import nms
    monkeypatch.delenv(ROUTE, raising=False)
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [50.0, 50.0, 60.0, 60.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    before = _calls()
    nms(boxes, scores, 0.5)
    after = _calls()
    assert after[('mmcv', 'nms')] == before.get(('mmcv', 'nms'), 0) + 1
    assert after.get(('torchvision', 'nms'), 0) == before.get(('torchvision', 'nms'), 0)
    assert compat.TORCHVISION_OPS.routes(boxes) is False
    # on CUDA tensors the route is taken exactly when mmcv has no CUDA ops (decided without a GPU: a meta tensor
    # stands in for the device check)


@needs_compiled
@pytest.mark.parametrize('offset', [0, 1])
def test_nms_arguments_keep_their_meaning(monkeypatch, offset):
    """mmcv's nms(boxes, scores, iou, offset, score_threshold, max_num) on random boxes, both ways."""
    from mmcv.ops import nms
    g = torch.Generator().manual_seed(offset)
    xy = torch.rand(300, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 2 + torch.rand(300, 2, generator=g) * 30], 1)
    scores = torch.rand(300, generator=g)
    res = {}
    for mode in ('0', '1'):
        monkeypatch.setenv(ROUTE, mode)
        res[mode] = nms(boxes, scores, 0.3, offset=offset, score_threshold=0.2, max_num=40)
    assert torch.equal(res['0'][1], res['1'][1]) and torch.equal(res['0'][0], res['1'][0])
    assert 10 < len(res['1'][1]) <= 40


@needs_compiled
def test_route_is_logged_once(monkeypatch, capsys):
    from mmcv.ops import nms
    from mmengine.logging import MMLogger
    monkeypatch.setenv(ROUTE, '1')
    monkeypatch.setattr(compat.TORCHVISION_OPS, 'logged', False)
    logger = MMLogger.get_instance('softfree_mm_route_test', log_level='WARNING')
    records = []
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger.addHandler(Keep())
    MMLogger._instance_dict.move_to_end('softfree_mm_route_test')  # the 'current' logger
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])
    for _ in range(3):
        nms(boxes, torch.tensor([0.9, 0.8]), 0.5)
    routed = [m for m in records if "torchvision's kernels" in m]
    assert len(routed) == 1 and 'nms / roi_align' in routed[0]


def _roi_align_by_formula(x, rois, out_hw, scale, sampling_ratio):
    """mmcv's RoIAlign (aligned=True, avg) written out: each output bin is the mean of sampling_ratio x
    sampling_ratio bilinear samples at evenly spaced points of the bin (all inside the map for the boxes used)."""
    (ph, pw), r = out_hw, sampling_ratio
    outs = []
    for b, x1, y1, x2, y2 in rois.tolist():
        x1, y1, x2, y2 = (c * scale - 0.5 for c in (x1, y1, x2, y2))  # aligned: pixel centres at +0.5
        ys = y1 + (torch.arange(ph * r, dtype=x.dtype) + 0.5) * (y2 - y1) / (ph * r)
        xs = x1 + (torch.arange(pw * r, dtype=x.dtype) + 0.5) * (x2 - x1) / (pw * r)
        y0, x0 = ys.floor().long(), xs.floor().long()
        ly, lx = (ys - y0)[:, None], (xs - x0)[None]
        f = x[int(b)]
        v = (f[:, y0][:, :, x0] * (1 - ly) * (1 - lx) + f[:, y0][:, :, x0 + 1] * (1 - ly) * lx
             + f[:, y0 + 1][:, :, x0] * ly * (1 - lx) + f[:, y0 + 1][:, :, x0 + 1] * ly * lx)
        outs.append(v.reshape(-1, ph, r, pw, r).mean((2, 4)))
    return torch.stack(outs)


@needs_compiled
@pytest.mark.parametrize('sampling_ratio', [1, 2])
def test_routed_roi_align_keeps_the_sampling_ratio(monkeypatch, sampling_ratio):
    """sampling_ratio > 0 (every shipped config uses 0, adaptive): the route's forward and backward against mmcv's
    CPU op and against the formula; the boxes are large enough that the adaptive count (3 or 4 per bin side)
    differs from the ratio asked for, so a route that dropped it gives other values."""
    from mmcv.ops import roi_align
    g = torch.Generator().manual_seed(sampling_ratio)
    x = torch.randn(2, 3, 20, 24, generator=g, dtype=torch.float64)
    rois = torch.tensor([[0, 4.6, 6.2, 27.4, 25.8], [1, 10.0, 3.0, 40.0, 30.0], [0, 7.0, 9.0, 19.0, 33.0]],
                        dtype=torch.float64)
    weight = torch.randn(3, 3, 4, 4, generator=g, dtype=torch.float64)
    res = {}
    for mode, how in (('0', 'mmcv'), ('1', 'torchvision')):
        monkeypatch.setenv(ROUTE, mode)
        before = _calls()
        xi = x.clone().requires_grad_()
        out = roi_align(xi, rois, (4, 4), 0.5, sampling_ratio, 'avg', True)
        (out * weight).sum().backward()
        after = _calls()
        for op in ('roi_align_forward', 'roi_align_backward'):
            assert after[(how, op)] == before.get((how, op), 0) + 1, (how, op)
        res[how] = out.detach(), xi.grad
    xf = x.clone().requires_grad_()
    ref = _roi_align_by_formula(xf, rois, (4, 4), 0.5, sampling_ratio)
    (ref * weight).sum().backward()
    for how, (out, grad) in res.items():
        torch.testing.assert_close(out, ref.detach(), rtol=1e-9, atol=1e-9, msg=how)
        torch.testing.assert_close(grad, xf.grad, rtol=1e-9, atol=1e-9, msg=how)
    monkeypatch.setenv(ROUTE, '0')
    adaptive = roi_align(x, rois, (4, 4), 0.5, 0, 'avg', True)
    assert (adaptive - ref.detach()).abs().max() > 1e-2  # the ratio matters for these boxes


def _record_every_compiled_op(monkeypatch):
    """Every ``ext_module`` of every loaded mmcv.ops module wrapped in a recorder of the names called."""
    import importlib
    import pkgutil
    import mmcv.ops
    seen = set()

    class Recorder:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            attr = getattr(self._inner, name)
            if callable(attr):
                def call(*a, **k):
                    seen.add(name)
                    return attr(*a, **k)
                return call
            return attr

    for info in pkgutil.iter_modules(mmcv.ops.__path__):
        mod = sys.modules.get(f'mmcv.ops.{info.name}')
        if mod is not None and hasattr(mod, 'ext_module'):
            monkeypatch.setattr(mod, 'ext_module', Recorder(mod.ext_module))
    return seen


def test_shipped_tasks_call_no_other_compiled_mmcv_op(detector, monkeypatch):
    """The detector (training and test), UperNet, Semantic FPN and the classifier of the demo configs (the real
    configs' models at tiny widths) call only the routed ops."""
    seen = _record_every_compiled_op(monkeypatch)
    _predict(detector)
    _loss_and_grads(detector)
    assert seen == set(compat.ROUTED_OPS)
    seen.clear()
    for task in ('upernet', 'semfpn', 'cls'):
        cfg = _cfg(task)
        model = _build(cfg)
        model.train()
        if task == 'cls':
            from mmpretrain.structures import DataSample
            data = dict(inputs=[torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)] * 2,
                        data_samples=[DataSample().set_gt_label(3), DataSample().set_gt_label(5)])
        else:
            from mmseg.structures import SegDataSample
            from mmengine.structures import PixelData
            samples = []
            for _ in range(2):
                s = SegDataSample(metainfo=dict(img_shape=(128, 128), ori_shape=(128, 128), pad_shape=(128, 128)))
                s.gt_sem_seg = PixelData(data=torch.randint(0, 11, (1, 128, 128)))
                samples.append(s)
            data = dict(inputs=[torch.randint(0, 256, (3, 128, 128), dtype=torch.uint8)] * 2, data_samples=samples)
        losses = model(**model.data_preprocessor(data, True), mode='loss')
        sum(v for k, v in losses.items() if 'loss' in k).backward()
        model.eval()
        with torch.no_grad():
            model(**model.data_preprocessor(data, False), mode='predict')
    assert seen == set(), f'{sorted(seen)} are compiled mmcv ops outside the route'
