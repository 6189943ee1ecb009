"""SoftFreeSOFT (SOFT's own backbone): registry builds, strides at odd sizes, gradients, kernels swapped in, the
official sizes, conversion, freezing, errors. Its equality with the official computation is in
test_official_weights.py."""
import math

import pytest
import torch

import softfree_mm  # noqa: F401
from softfree_mm.models.backbones.soft import ARCH_ZOO, SoftFreeSOFT
from softfree_mm.models.backbones.soft_convert import convert_soft

from tests.helpers.models import build_in

SMALL = dict(embed_dims=(16, 32, 32, 32), num_heads=(1, 2, 2, 2), depths=(1, 1, 1, 1))


def test_builds_in_all_registries_with_strided_maps_at_odd_sizes_and_finite_grads():
    cfg = dict(type='SoftFreeSOFT', arch=dict(SMALL), drop_path_rate=0.1)
    models = [build_in(scope, cfg) for scope in ('mmdet', 'mmseg', 'mmpretrain')]
    assert all(type(m) is SoftFreeSOFT for m in models)
    model = models[0].train()
    x = torch.randn(1, 3, 75, 101)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(1, c, math.ceil(75 / s), math.ceil(101 / s))
                                              for c, s in zip(SMALL['embed_dims'], (4, 8, 16, 32))]
    sum(o.square().mean() for o in outs).backward()
    for name, p in model.named_parameters():
        if name != 'cls_token':  # only the classifier reads the class token's output
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_official_sizes_and_default_kernels():
    assert {k: v['depths'] for k, v in ARCH_ZOO.items() if not k.endswith('_norm')} == {
        'tiny': (1, 2, 3, 2), 'small': (1, 3, 20, 4), 'medium': (1, 3, 29, 5), 'large': (1, 3, 40, 5),
        'huge': (1, 5, 49, 5)}
    assert ARCH_ZOO['medium']['embed_dims'] == (64, 128, 288, 512) and ARCH_ZOO['huge']['num_heads'][2] == 11
    model = SoftFreeSOFT(arch='tiny_norm')
    kernels = [s.blocks[0].attn.kernel for s in model.stages]
    assert [(k.landmark_ratio, k.conv_size, k.normalized) for k in kernels[:3]] == [(8, 9, True), (4, 5, True),
                                                                                    (2, 3, True)]
    assert type(kernels[3]).__name__ == 'SoftmaxAttention'
    assert [tuple(s.pos_embed.shape) for s in model.stages] == [(1, 3136, 64), (1, 784, 128), (1, 196, 320),
                                                              (1, 50, 512)]
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(13e6, rel=0.1)  # SOFT-Tiny: 13M


def test_other_kernels_swap_in_and_a_grid_kernel_is_refused_next_to_the_class_token():
    model = SoftFreeSOFT(arch=dict(SMALL), attn_cfg=['poly', 'inline', 'linear', 'linear']).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 96))
    assert all(torch.isfinite(o).all() for o in outs)
    with pytest.raises(ValueError, match=r"SoftFreeSOFT: attention kernel 'inline' cannot be used in stage 3: it "
                                         r'needs the token grid .*, but the class token joins the grid'):
        SoftFreeSOFT(arch=dict(SMALL), attn_cfg=['soft', 'soft', 'soft', 'inline'])


def test_class_token_output_and_freezing():
    model = SoftFreeSOFT(arch=dict(SMALL), out_type='cls_token', frozen_stages=2).train()
    (cls,) = model(torch.randn(2, 3, 64, 64))
    assert cls.shape == (2, 32)
    assert not model.stages[1].training and model.stages[2].training
    assert not any(p.requires_grad for p in model.stages[1].parameters())
    assert all(p.requires_grad for p in model.stages[2].parameters())


def test_convert_maps_the_official_names_and_is_idempotent():
    ours = SoftFreeSOFT(arch=dict(SMALL)).state_dict()
    assert convert_soft(ours).keys() == ours.keys()
    official = {'block2.0.att.mha.attn.Qlandmark_op.weight': torch.ones(1), 'block1.0.att.ff1.bias': torch.ones(1),
                'patch_embed1.proj.7.running_var': torch.ones(1), 'pos_embed4': torch.ones(1),
                'block4.0.attn.kv.weight': torch.ones(1), 'head.weight': torch.ones(1), 'cls_token': torch.ones(1)}
    assert sorted(convert_soft(official)) == sorted([
        'stages.1.blocks.0.attn.kernel.landmark_conv.weight', 'stages.0.blocks.0.mlp.fc1.bias',
        'stages.0.patch_embed.proj.7.running_var', 'stages.3.pos_embed', 'stages.3.blocks.0.attn.kv.weight',
        'cls_token'])


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"unknown arch 'mini'; valid archs: tiny, small"):
        SoftFreeSOFT(arch='mini')
    with pytest.raises(ValueError, match=r"unknown out_type 'pooled'"):
        SoftFreeSOFT(arch=dict(SMALL), out_type='pooled')
    with pytest.raises(ValueError, match=r'out_indices must be stage indices in \[0, 3\], got \(4,\)'):
        SoftFreeSOFT(arch=dict(SMALL), out_indices=(4,))


def test_classifier_and_detector_train_a_step_with_the_soft_backbone():
    """mmpretrain's ImageClassifier on the class token (as configs/cls_soft_s_softnorm.py) and mmdet's Mask R-CNN
    neck input: one loss, finite, with gradients reaching the backbone."""
    from mmpretrain.structures import DataSample
    clf = build_in('mmpretrain', dict(
        type='ImageClassifier', backbone=dict(type='SoftFreeSOFT', arch=dict(SMALL), out_type='cls_token'),
        head=dict(type='LinearClsHead', num_classes=5, in_channels=32, loss=dict(type='CrossEntropyLoss'))))
    x = torch.randn(2, 3, 64, 64)
    losses = clf(x, [DataSample().set_gt_label(1), DataSample().set_gt_label(3)], mode='loss')
    losses['loss'].backward()
    assert torch.isfinite(losses['loss'])
    assert clf.backbone.cls_token.grad is not None and clf.backbone.stages[0].blocks[0].attn.q.weight.grad is not None
    fpn = build_in('mmdet', dict(type='FPN', in_channels=list(SMALL['embed_dims']), out_channels=8, num_outs=5))
    bb = SoftFreeSOFT(arch=dict(SMALL))
    outs = fpn(bb(torch.randn(1, 3, 96, 128)))
    assert [o.shape[-2:] for o in outs] == [torch.Size((24 // 2 ** i, 32 // 2 ** i)) for i in range(4)] + \
        [torch.Size((2, 2))]
