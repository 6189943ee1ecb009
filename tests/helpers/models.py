"""Building a model in one OpenMMLab scope's registry, and one training step of a downstream model on a backbone:
mmdet's Mask R-CNN R50-FPN, mmseg's UperNet, mmpretrain's classifier, each from the library's own base config
(the backbone tests' downstream checks)."""
import importlib
import math
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope


def build_in(scope, cfg):
    """``cfg`` built by ``scope``'s MODELS registry (mmdet, mmseg, mmpretrain), that scope the default."""
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(cfg)


def strided_shapes(b, channels, h, w):
    """The four feature maps of a backbone at strides 4, 8, 16, 32: (b, c, ceil(h / s), ceil(w / s))."""
    return [(b, c, math.ceil(h / 2 ** (i + 2)), math.ceil(w / 2 ** (i + 2))) for i, c in enumerate(channels)]


def _base_model(package, name):
    folder = osp.join(osp.dirname(importlib.import_module(package).__file__), '.mim', 'configs', '_base_', 'models')
    return Config.fromfile(osp.join(folder, name)).model


def _backward(model, losses):
    loss, _ = model.parse_losses(losses)
    loss.backward()
    assert torch.isfinite(loss)
    return model


def run_mask_rcnn(backbone, channels):
    """Mask R-CNN on ``backbone`` (feature maps of ``channels``), one training step on mmdet's demo inputs."""
    from mmdet.testing import demo_mm_inputs
    cfg = _base_model('mmdet', 'mask-rcnn_r50_fpn.py')
    cfg.backbone = backbone
    cfg.neck.in_channels = list(channels)
    cfg.train_cfg.rpn_proposal.update(nms_pre=200, max_per_img=100)  # small sampling keeps the CPU step short
    cfg.train_cfg.rcnn.sampler.num = 64
    model = build_in('mmdet', cfg).train()
    data = model.data_preprocessor(demo_mm_inputs(2, [(3, 128, 160)] * 2, num_items=[3, 2], with_mask=True), True)
    return _backward(model, model(**data, mode='loss'))


def run_upernet(backbone, channels):
    """UperNet (with its auxiliary head) on ``backbone``, one training step on random images and labels."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    cfg = _base_model('mmseg', 'upernet_swin.py')
    cfg.backbone = backbone
    cfg.decode_head.update(in_channels=list(channels), channels=32, num_classes=5, norm_cfg=dict(type='BN'))
    cfg.auxiliary_head.update(in_channels=channels[2], channels=16, num_classes=5, norm_cfg=dict(type='BN'))
    model = build_in('mmseg', cfg).train()
    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(128, 160), pad_shape=(128, 160), ori_shape=(128, 160)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 5, (1, 128, 160)))
        samples.append(s)
    return _backward(model, model(torch.randn(2, 3, 128, 160), samples, mode='loss'))


def run_classifier(backbone, channels):
    """An image classifier on ``backbone``'s last output, one training step on random images: the last feature map
    alone (``out_indices``: every parameter then feeds the loss) pooled by GlobalAveragePooling, or a class token
    (``out_type='cls_token'``) read as it is."""
    from mmpretrain.structures import DataSample
    cfg = dict(type='ImageClassifier', backbone=backbone,
               head=dict(type='LinearClsHead', num_classes=10, in_channels=channels[-1]))
    if backbone.get('out_type') != 'cls_token':
        cfg.update(backbone=dict(backbone, out_indices=(len(channels) - 1,)), neck=dict(type='GlobalAveragePooling'))
    model = build_in('mmpretrain', cfg).train()
    samples = [DataSample().set_gt_label(i) for i in (3, 7)]
    return _backward(model, model(torch.randn(2, 3, 128, 160), samples, mode='loss'))
