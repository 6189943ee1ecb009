"""A checkpoint of another architecture than the model: the converters read depths, widths and heads from the file.

Release files are written here key by key as the official code saves them (Swin, InLine-Swin, PVT v1 / v2,
InLine-PVT, XCiT, CSWin and its segmentation release, InLine-CSWin, SOFT; the mmdet / mmpretrain / timm Swin layouts,
timm's PVTv2 and XCiT), with zero-storage tensors (``expand``) so that full-size presets cost nothing; the writers
are checked against timm's, mmdet's and mmpretrain's own modules. Guards: ``tools/convert_checkpoint.py
--print-arch`` names the preset of a full-size file and the explicit arguments of a file no preset fits (both written
out here by hand); loading a file of another depth / width / heads is one short error naming per stage what the
file holds against the model and the arguments that fit it, and a model built with those arguments loads the file
with no shape mismatch; ``tools/train.py --dry-run`` checks the start checkpoint both ways.
"""
import logging
import os.path as osp
import re

import pytest
import torch
from torch import nn

import softfree_mm  # noqa: F401
from softfree_mm import models
from softfree_mm.models.converters import get_converter, load_pretrained

import convert_checkpoint  # tools/convert_checkpoint.py (tests/conftest.py puts tools/ on sys.path)

from tests.helpers import ROOT, load_tool


# ---------------------------------------------------------------------------------------------- release writers
def zeros(shapes):
    """Tensors of the given shapes holding one stored element each (index buffers as int64)."""
    out = {}
    for k, shape in shapes.items():
        dtype = torch.long if k.endswith(('relative_position_index', 'num_batches_tracked')) else torch.float32
        out[k] = torch.zeros((), dtype=dtype).expand(shape)
    return out


def ln(shapes, pre, c):
    shapes.update({f'{pre}.weight': (c,), f'{pre}.bias': (c,)})


def linear(shapes, pre, cout, cin, bias=True):
    shapes[f'{pre}.weight'] = (cout, cin)
    if bias:
        shapes[f'{pre}.bias'] = (cout,)


def residual(shapes, pre, c, heads):
    """InLine's per-channel residual (official ``residual``): two grouped 1x1 convs."""
    shapes.update({f'{pre}.residual.0.weight': (c, c // heads, 1), f'{pre}.residual.0.bias': (c,),
                   f'{pre}.residual.2.weight': (9 * c, c // heads, 1), f'{pre}.residual.2.bias': (9 * c,)})


def swin_official(dim, depths, heads, window=7, kinds=None, img=224):
    """microsoft/Swin-Transformer (and LeapLabTHU/InLine's Swin: kinds 'I' blocks with the residual and no bias
    table): layers.{i}.blocks.{j}, layers.{i}.downsample after stage i, attn_mask buffers of shifted blocks."""
    s = {'patch_embed.proj.weight': (dim, 3, 4, 4), 'patch_embed.proj.bias': (dim,)}
    ln(s, 'patch_embed.norm', dim)
    c, res = dim, img // 4
    for i, depth in enumerate(depths):
        win = min(window, res)
        for j in range(depth):
            pre = f'layers.{i}.blocks.{j}'
            ln(s, f'{pre}.norm1', c)
            ln(s, f'{pre}.norm2', c)
            linear(s, f'{pre}.attn.qkv', 3 * c, c)
            linear(s, f'{pre}.attn.proj', c, c)
            linear(s, f'{pre}.mlp.fc1', 4 * c, c)
            linear(s, f'{pre}.mlp.fc2', c, 4 * c)
            if kinds and kinds[i][j] == 'I':
                residual(s, f'{pre}.attn', c, heads[i])
                continue
            s[f'{pre}.attn.relative_position_bias_table'] = ((2 * win - 1) ** 2, heads[i])
            s[f'{pre}.attn.relative_position_index'] = (win * win, win * win)
            if j % 2 and res > window:
                s[f'{pre}.attn_mask'] = ((res // win) ** 2, win * win, win * win)
        if i < len(depths) - 1:
            ln(s, f'layers.{i}.downsample.norm', 4 * c)
            linear(s, f'layers.{i}.downsample.reduction', 2 * c, 4 * c, bias=False)
            c, res = 2 * c, res // 2
    ln(s, 'norm', c)
    linear(s, 'head', 1000, c)
    return s


def swin_timm(dim, depths, heads, window=7):
    """timm's SwinTransformer: the official names with each patch merging at the start of the next stage, no
    buffers, head.fc."""
    out = {}
    for k, v in swin_official(dim, depths, heads, window).items():
        p = k.split('.')
        if k.endswith(('attn_mask', 'relative_position_index')):
            continue
        if k.startswith('layers.') and p[2] == 'downsample':
            k = '.'.join(['layers', str(int(p[1]) + 1)] + p[2:])
        out['head.fc.' + k[5:] if k.startswith('head.') else k] = v
    return out


def swin_mm(dim, depths, heads, window=7, out_norms=(0, 1, 2, 3)):
    """mmdet's / mmpretrain's SwinTransformer: stages.{i}.blocks.{j}.attn.w_msa, ffn.layers, patch_embed.projection,
    downsample after stage i, norm{i} for the outputs."""
    s = {'patch_embed.projection.weight': (dim, 3, 4, 4), 'patch_embed.projection.bias': (dim,)}
    ln(s, 'patch_embed.norm', dim)
    c = dim
    for i, depth in enumerate(depths):
        for j in range(depth):
            pre = f'stages.{i}.blocks.{j}'
            ln(s, f'{pre}.norm1', c)
            ln(s, f'{pre}.norm2', c)
            s[f'{pre}.attn.w_msa.relative_position_bias_table'] = ((2 * window - 1) ** 2, heads[i])
            s[f'{pre}.attn.w_msa.relative_position_index'] = (window ** 2, window ** 2)
            linear(s, f'{pre}.attn.w_msa.qkv', 3 * c, c)
            linear(s, f'{pre}.attn.w_msa.proj', c, c)
            linear(s, f'{pre}.ffn.layers.0.0', 4 * c, c)
            linear(s, f'{pre}.ffn.layers.1', c, 4 * c)
        if i < len(depths) - 1:
            ln(s, f'stages.{i}.downsample.norm', 4 * c)
            linear(s, f'stages.{i}.downsample.reduction', 2 * c, 4 * c, bias=False)
        if i in out_norms:
            ln(s, f'norm{i}', c)
        if i < len(depths) - 1:
            c *= 2
    return s


def detector(backbone):
    """A whole mmdet checkpoint: the backbone under 'backbone.' beside the neck and heads."""
    sd = {f'backbone.{k}': v for k, v in zeros(backbone).items()}
    sd.update(zeros({'neck.fpn_convs.0.conv.weight': (256, 256, 3, 3), 'rpn_head.rpn_cls.weight': (3, 256, 1, 1)}))
    return {'state_dict': sd, 'meta': {'epoch': 12}}


def classifier(backbone, c):
    """A whole mmpretrain checkpoint: 'backbone.*' and the linear head 'head.fc'."""
    sd = {f'backbone.{k}': v for k, v in zeros(backbone).items()}
    sd.update(zeros({'head.fc.weight': (1000, c), 'head.fc.bias': (1000,)}))
    return {'state_dict': sd, 'meta': {'epoch': 300}}


def pvt_official(dims, depths, mlp, sr, version=1, linear_sra=False, inline_heads=None, img=224):
    """whai362/PVT (v1: pos_embed{i}, stage 4's with the class row, cls_token, norm; v2: overlapping embeddings,
    mlp.dwconv.dwconv, norm{i}); LeapLabTHU/InLine's PVT (v1 layout, no class token, the residual in every block,
    inline_heads)."""
    s, cin, side = {}, 3, img // 4
    for i, (c, d, m, r) in enumerate(zip(dims, depths, mlp, sr), start=1):
        k, p = ((7 if i == 1 else 3), None) if version == 2 else (None, 4 if i == 1 else 2)
        s[f'patch_embed{i}.proj.weight'] = (c, cin, k, k) if version == 2 else (c, cin, p, p)
        s[f'patch_embed{i}.proj.bias'] = (c,)
        ln(s, f'patch_embed{i}.norm', c)
        if version == 1:
            s[f'pos_embed{i}'] = (1, side * side + (1 if i == 4 and not inline_heads else 0), c)
        for j in range(d):
            pre = f'block{i}.{j}'
            ln(s, f'{pre}.norm1', c)
            ln(s, f'{pre}.norm2', c)
            linear(s, f'{pre}.attn.q', c, c)
            linear(s, f'{pre}.attn.kv', 2 * c, c)
            linear(s, f'{pre}.attn.proj', c, c)
            if linear_sra or r > 1:
                n = 1 if linear_sra else r
                s.update({f'{pre}.attn.sr.weight': (c, c, n, n), f'{pre}.attn.sr.bias': (c,)})
                ln(s, f'{pre}.attn.norm', c)
            linear(s, f'{pre}.mlp.fc1', m * c, c)
            linear(s, f'{pre}.mlp.fc2', c, m * c)
            if version == 2:
                s.update({f'{pre}.mlp.dwconv.dwconv.weight': (m * c, 1, 3, 3),
                          f'{pre}.mlp.dwconv.dwconv.bias': (m * c,)})
            if inline_heads:
                residual(s, f'{pre}.attn', c, inline_heads[i - 1])
        if version == 2:
            ln(s, f'norm{i}', c)
        cin, side = c, side // 2
    if version == 1 and not inline_heads:
        s['cls_token'] = (1, 1, dims[-1])
        ln(s, 'norm', dims[-1])
    linear(s, 'head', 1000, dims[-1])
    return s


def xcit_official(dim, depth, heads, patch=16, cls_layers=2):
    """facebookresearch/xcit: the conv stem (conv + SyncBN per step), pos_embeder, XCA blocks with temperatures,
    class-attention blocks with a fused qkv, norm, head."""
    steps = 4 if patch == 16 else 3
    s, cin = {}, 3
    for n in range(steps):
        cout = dim // 2 ** (steps - 1 - n)
        s[f'patch_embed.proj.{2 * n}.0.weight'] = (cout, cin, 3, 3)
        for part in ('weight', 'bias', 'running_mean', 'running_var'):
            s[f'patch_embed.proj.{2 * n}.1.{part}'] = (cout,)
        s[f'patch_embed.proj.{2 * n}.1.num_batches_tracked'] = ()
        cin = cout
    s.update({'pos_embeder.token_projection.weight': (dim, 64, 1, 1), 'pos_embeder.token_projection.bias': (dim,),
              'cls_token': (1, 1, dim)})
    for j in range(depth):
        pre = f'blocks.{j}'
        for g in ('gamma1', 'gamma2', 'gamma3'):
            s[f'{pre}.{g}'] = (dim,)
        for norm in ('norm1', 'norm2', 'norm3'):
            ln(s, f'{pre}.{norm}', dim)
        s[f'{pre}.attn.temperature'] = (heads, 1, 1)
        linear(s, f'{pre}.attn.qkv', 3 * dim, dim)
        linear(s, f'{pre}.attn.proj', dim, dim)
        for conv in ('conv1', 'conv2'):
            s.update({f'{pre}.local_mp.{conv}.weight': (dim, 1, 3, 3), f'{pre}.local_mp.{conv}.bias': (dim,)})
        for part in ('weight', 'bias', 'running_mean', 'running_var'):
            s[f'{pre}.local_mp.bn.{part}'] = (dim,)
        s[f'{pre}.local_mp.bn.num_batches_tracked'] = ()
        linear(s, f'{pre}.mlp.fc1', 4 * dim, dim)
        linear(s, f'{pre}.mlp.fc2', dim, 4 * dim)
    for j in range(cls_layers):
        pre = f'cls_attn_blocks.{j}'
        s.update({f'{pre}.gamma1': (dim,), f'{pre}.gamma2': (dim,)})
        ln(s, f'{pre}.norm1', dim)
        ln(s, f'{pre}.norm2', dim)
        linear(s, f'{pre}.attn.qkv', 3 * dim, dim)
        linear(s, f'{pre}.attn.proj', dim, dim)
        linear(s, f'{pre}.mlp.fc1', 4 * dim, dim)
        linear(s, f'{pre}.mlp.fc2', dim, 4 * dim)
    ln(s, 'norm', dim)
    linear(s, 'head', 1000, dim)
    return s


def cswin_official(dim, depths, heads, kinds='SSSS', segmentation=False):
    """microsoft/CSWin-Transformer (and InLine-CSwin: 'I' stages one branch with all heads and the residual):
    stage1_conv_embed, stage{s}.{j} with attns.{b}.get_v, merge{s}; the classifier's norm + head or the
    segmentation backbone's norm1..norm4."""
    s = {'stage1_conv_embed.0.weight': (dim, 3, 7, 7), 'stage1_conv_embed.0.bias': (dim,)}
    ln(s, 'stage1_conv_embed.2', dim)
    c = dim
    for i, depth in enumerate(depths, start=1):
        last = i == len(depths)
        for j in range(depth):
            pre = f'stage{i}.{j}'
            linear(s, f'{pre}.qkv', 3 * c, c)
            ln(s, f'{pre}.norm1', c)
            linear(s, f'{pre}.proj', c, c)
            ln(s, f'{pre}.norm2', c)
            linear(s, f'{pre}.mlp.fc1', 4 * c, c)
            linear(s, f'{pre}.mlp.fc2', c, 4 * c)
            branches = 1 if last or kinds[i - 1] == 'I' else 2
            for b in range(branches):
                part = c // branches
                s.update({f'{pre}.attns.{b}.get_v.weight': (part, 1, 3, 3), f'{pre}.attns.{b}.get_v.bias': (part,)})
                if kinds[i - 1] == 'I':
                    residual(s, f'{pre}.attns.{b}', part, heads[i - 1])
        if segmentation:
            ln(s, f'norm{i}', c)
        if not last:
            s.update({f'merge{i}.conv.weight': (2 * c, c, 3, 3), f'merge{i}.conv.bias': (2 * c,)})
            ln(s, f'merge{i}.norm', 2 * c)
            c *= 2
    if not segmentation:
        ln(s, 'norm', c)
        linear(s, 'head', 1000, c)
    return s


def soft_official(dims, depths, heads):
    """fudan-zvg/SOFT (softmax_free_vision_transformer.py, kernel method 'torch'): conv-BN stems, pos_embed{i},
    block{i}.{j}.att.mha (W_q, W_v, Qlandmark_op, Qnorm_act, conv, ff), stage 4's softmax blocks, cls_token."""
    s = {}

    def conv_bn(conv, bn, cin, cout):
        s.update({f'{conv}.weight': (cout, cin, 3, 3), f'{conv}.bias': (cout,)})
        for part in ('weight', 'bias', 'running_mean', 'running_var'):
            s[f'{bn}.{part}'] = (cout,)
        s[f'{bn}.num_batches_tracked'] = ()
    conv_bn('patch_embed1.proj.0', 'patch_embed1.proj.1', 3, 32)
    conv_bn('patch_embed1.proj.3', 'patch_embed1.proj.4', 32, 32)
    conv_bn('patch_embed1.proj.6', 'patch_embed1.proj.7', 32, dims[0])
    for i in (2, 3, 4):
        conv_bn(f'patch_embed{i}.proj.0', f'patch_embed{i}.proj.1', dims[i - 2], dims[i - 1])
    for i, n in enumerate((3136, 784, 196, 50), start=1):
        s[f'pos_embed{i}'] = (1, n, dims[i - 1])
    for i, (ratio, conv) in enumerate(((8, 9), (4, 5), (2, 3)), start=1):
        c, h = dims[i - 1], heads[i - 1]
        for j in range(depths[i - 1]):
            pre = f'block{i}.{j}.att'
            linear(s, f'{pre}.mha.W_q', c, c)
            linear(s, f'{pre}.mha.W_v', c, c)
            s[f'{pre}.mha.attn.Qlandmark_op.weight'] = (c // h, c // h, ratio, ratio)
            ln(s, f'{pre}.mha.attn.Qnorm_act.0', c // h)
            s[f'{pre}.mha.attn.conv.weight'] = (h, 1, conv, conv)
            linear(s, f'{pre}.mha.ff', c, c)
            ln(s, f'{pre}.norm1', c)
            ln(s, f'{pre}.norm2', c)
            linear(s, f'{pre}.ff1', 4 * c, c)
            linear(s, f'{pre}.ff2', c, 4 * c)
    c = dims[3]
    for j in range(depths[3]):
        pre = f'block4.{j}'
        ln(s, f'{pre}.norm1', c)
        ln(s, f'{pre}.norm2', c)
        linear(s, f'{pre}.attn.q', c, c)
        linear(s, f'{pre}.attn.kv', 2 * c, c)
        linear(s, f'{pre}.attn.proj', c, c)
        linear(s, f'{pre}.mlp.fc1', 4 * c, c)
        linear(s, f'{pre}.mlp.fc2', c, 4 * c)
    ln(s, 'norm', c)
    s['cls_token'] = (1, 1, c)
    linear(s, 'head', 1000, c)
    return s


def save(tmp_path, name, obj):
    path = tmp_path / f'{name}.pth'
    torch.save(obj, path)
    return str(path)


def wrapped(shapes, wrapper='model'):
    return {wrapper: zeros(shapes), 'epoch': 300}


# ---------------------------------------------------------------------------------------------- writers vs modules
def _converted_shapes(family, sd):
    sd = {k: v for k, v in sd.items() if not k.startswith('head')}
    return {k: tuple(v.shape) for k, v in get_converter(family)(sd).items()
            if not k.endswith(('relative_position_index', 'attn_mask'))}


def test_the_release_writers_give_the_names_and_shapes_of_timm_mmdet_and_mmpretrain_modules():
    """The writers above are what the real modules save (converted to our names, heads aside), so that the
    full-size files below are what those libraries write."""
    timm = pytest.importorskip('timm')
    from mmdet.models.backbones import SwinTransformer as MMDetSwin
    from mmpretrain.models.backbones import SwinTransformer as MMPretrainSwin
    dim, depths, heads = 16, (1, 1, 3, 1), (1, 2, 2, 4)
    swin = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False, embed_dim=dim, depths=depths,
                             num_heads=heads)
    assert _converted_shapes('swin', swin.state_dict()) == _converted_shapes('swin', zeros(swin_timm(dim, depths,
                                                                                                      heads)))
    assert _converted_shapes('swin', zeros(swin_official(dim, depths, heads))) == \
        _converted_shapes('swin', swin.state_dict())
    mmdet = MMDetSwin(embed_dims=dim, depths=depths, num_heads=heads)
    assert _converted_shapes('swin', mmdet.state_dict()) == \
        _converted_shapes('swin', zeros(swin_mm(dim, depths, heads)))
    mmpre = MMPretrainSwin(arch=dict(embed_dims=dim, depths=depths, num_heads=heads))
    assert _converted_shapes('swin', mmpre.state_dict()) == \
        _converted_shapes('swin', zeros(swin_mm(dim, depths, heads, out_norms=(3,))))
    pvt = timm.create_model('pvt_v2_b0', pretrained=False, embed_dims=(16, 32, 48, 64), depths=(1, 1, 2, 1),
                            num_heads=(1, 2, 3, 4))
    assert _converted_shapes('pvt_v2', pvt.state_dict()) == _converted_shapes(
        'pvt_v2', zeros(pvt_official((16, 32, 48, 64), (1, 1, 2, 1), (8, 8, 4, 4), (8, 4, 2, 1), version=2)))
    xcit = timm.create_model('xcit_tiny_12_p16_224', pretrained=False, embed_dim=32, num_heads=4, depth=3)
    assert _converted_shapes('xcit', xcit.state_dict()) == _converted_shapes('xcit', zeros(xcit_official(32, 3, 4)))


# ---------------------------------------------------------------------------------------------- --print-arch
# a full-size file of each layout -> the one line --print-arch prints (family, then the class call)
FULL = {
    'swin-official-small': (lambda: wrapped(swin_official(96, (2, 2, 18, 2), (3, 6, 12, 24))),
                            "swin: SoftFreeSwin(arch='small'): "),
    'swin-official-base-384': (lambda: wrapped(swin_official(128, (2, 2, 18, 2), (4, 8, 16, 32), window=12,
                                                             img=384)),
                               "swin: SoftFreeSwin(arch='base', window_size=12): "),
    'swin-timm-large': (lambda: {'state_dict': zeros(swin_timm(192, (2, 2, 18, 2), (6, 12, 24, 48)))},
                        "swin: SoftFreeSwin(arch='large'): "),
    'swin-mmdet-detector-tiny': (lambda: detector(swin_mm(96, (2, 2, 6, 2), (3, 6, 12, 24))),
                                 "swin: SoftFreeSwin(arch='tiny'): "),
    'swin-mmpretrain-base': (lambda: classifier(swin_mm(128, (2, 2, 18, 2), (4, 8, 16, 32), out_norms=(3,)), 1024),
                             "swin: SoftFreeSwin(arch='base'): "),
    'inline-swin-small': (lambda: wrapped(swin_official(96, (2, 2, 18, 2), (3, 6, 12, 24),
                                                        kinds=('II', 'II', 'S' * 18, 'SS'))),
                          "inline_swin: SoftFreeSwin(arch='inline_small'): "),
    'inline-swin-base': (lambda: wrapped(swin_official(128, (2, 2, 18, 2), (4, 8, 16, 32),
                                                       kinds=('II', 'II', 'II' + 'S' * 16, 'SS'))),
                         "inline_swin: SoftFreeSwin(arch='inline_base'): "),
    'pvt-official-medium': (lambda: wrapped(pvt_official((64, 128, 320, 512), (3, 4, 18, 3), (8, 8, 4, 4),
                                                         (8, 4, 2, 1))),
                            "pvt: SoftFreePVT(arch='medium'): "),
    'pvt-official-small-512': (lambda: wrapped(pvt_official((64, 128, 320, 512), (3, 4, 6, 3), (8, 8, 4, 4),
                                                            (8, 4, 2, 1), img=512)),
                               "pvt: SoftFreePVT(arch='small', pretrain_img_size=512): "),
    'inline-pvt-large': (lambda: wrapped(pvt_official((64, 128, 320, 512), (3, 8, 27, 3), (8, 8, 4, 4),
                                                      (1, 1, 1, 1), inline_heads=(2, 4, 10, 16))),
                         "inline_pvt: SoftFreePVT(arch='inline_large'): "),
    'pvt-v2-official-b5': (lambda: wrapped(pvt_official((64, 128, 320, 512), (3, 6, 40, 3), (4, 4, 4, 4),
                                                        (8, 4, 2, 1), version=2)),
                           "pvt_v2: SoftFreePVTv2(arch='b5'): "),
    'pvt-v2-official-b2-li': (lambda: wrapped(pvt_official((64, 128, 320, 512), (3, 4, 6, 3), (8, 8, 4, 4),
                                                           (8, 4, 2, 1), version=2, linear_sra=True)),
                              "pvt_v2: SoftFreePVTv2(arch='b2_li'): "),
    'xcit-official-s24': (lambda: wrapped(xcit_official(384, 24, 8)), "xcit: SoftFreeXCiT(arch='s24'): "),
    'xcit-official-s12-p8': (lambda: wrapped(xcit_official(384, 12, 8, patch=8)),
                             "xcit: SoftFreeXCiT(arch='s12', patch_size=8): "),
    'cswin-official-base': (lambda: {'state_dict_ema': zeros(cswin_official(96, (2, 4, 32, 2), (4, 8, 16, 32)))},
                            "cswin: SoftFreeCSWin(arch='base'): "),
    'cswin-segmentation-large': (lambda: {'state_dict': zeros(cswin_official(144, (2, 4, 32, 2), (6, 12, 24, 24),
                                                                             segmentation=True))},
                                 "cswin: SoftFreeCSWin(arch='large'): "),
    'inline-cswin-small': (lambda: wrapped(cswin_official(64, (3, 6, 29, 2), (2, 4, 8, 16), kinds='IISS')),
                           "inline_cswin: SoftFreeCSWin(arch='inline_small'): "),
    'soft-official-medium': (lambda: {'state_dict_ema': zeros(soft_official((64, 128, 288, 512), (1, 3, 29, 5),
                                                                            (2, 4, 9, 16)))},
                             "soft: SoftFreeSOFT(arch='medium') or arch='medium_norm' (the file does not show "
                             "which): "),
}


@pytest.mark.parametrize('name', sorted(FULL))
def test_print_arch_names_the_preset_of_a_full_size_release_file(name, tmp_path, capsys):
    make, expected = FULL[name]
    src = save(tmp_path, name, make())
    assert convert_checkpoint.main(['auto', src, '--print-arch']) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(expected), out
    assert not list(tmp_path.glob('*_ours*'))  # --print-arch alone writes nothing


def test_print_arch_logs_nothing_of_the_probe_models_it_builds(tmp_path, capsys, monkeypatch):
    """Naming the family builds a small model of each family (once a process); the InLine-Swin probe's build note
    (no bias table in its InLine stages) is about that model, not the file. Checked on the logger's records with
    the probes built here (their cache emptied), so neither an earlier test's probes nor the stream the logger's
    handler was given when it was made decide what is seen."""
    from mmengine.logging import MMLogger
    from softfree_mm.models.converters import detect
    monkeypatch.setattr(detect, '_PATTERNS', {})
    make, expected = FULL['inline-swin-base']
    src = save(tmp_path, 'inline-swin-base', make())
    records = []
    seen = logging.Handler()
    seen.emit = records.append
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.INFO)  # a fresh process's level: what the tool would print
    logger.addHandler(seen)
    try:
        assert convert_checkpoint.main(['auto', src, '--print-arch']) == 0
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    assert [r.getMessage() for r in records] == []
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(expected), out


def test_print_arch_says_what_the_file_holds_stage_by_stage(tmp_path, capsys):
    src = save(tmp_path, 'soft', {'state_dict_ema': zeros(soft_official((64, 128, 320, 512), (1, 3, 8, 4),
                                                                        (2, 4, 10, 16)))})
    assert convert_checkpoint.main(['soft', src, '--print-arch']) == 0
    assert capsys.readouterr().out.strip() == (
        "soft: SoftFreeSOFT(arch=dict(embed_dims=(64, 128, 320, 512), depths=(1, 3, 8, 4), num_heads=(2, 4, 10, 16)))"
        ' (no preset has this architecture); add normalized=True for a SOFT-Norm file (the file does not show '
        'which): the file holds depths (1, 3, 8, 4), widths (64, 128, 320, 512), heads (2, 4, 10, ?)')


# ---------------------------------------------------------------------------------------------- small files
# a file of each layout at small widths with another depth than the model; the arguments that fit it (by hand),
# the model it is loaded into, and what else a model built with those arguments needs to take the whole file
SWIN = dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4))
SWIN_FITS = "arch='tiny', embed_dims=16, depths=(1, 1, 3, 1), num_heads=(1, 2, 2, 4)"
PVT = dict(embed_dims=(16, 32, 80, 128), depths=(1, 1, 1, 1))
CSWIN = dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 4))
SOFT = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4))


def _timm(name, **kw):
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    return {'state_dict': timm.create_model(name, pretrained=False, **kw).state_dict()}


def _mm_swin(kind):
    if kind == 'mmdet':
        from mmdet.models.backbones import SwinTransformer
        m = SwinTransformer(embed_dims=16, depths=(1, 1, 3, 1), num_heads=(1, 2, 2, 4))
        return {'state_dict': {f'backbone.{k}': v for k, v in m.state_dict().items()}}
    from mmpretrain.models.backbones import SwinTransformer
    m = SwinTransformer(arch=dict(embed_dims=16, depths=(1, 1, 3, 1), num_heads=(1, 2, 2, 4)))
    sd = {f'backbone.{k}': v for k, v in m.state_dict().items()}
    sd.update({'head.fc.weight': torch.zeros(10, 128), 'head.fc.bias': torch.zeros(10)})
    return {'state_dict': sd}


SMALL = {  # name: (file, model class, model kwargs, the arguments that fit the file, what else the fitting model takes)
    'swin-official': (lambda: wrapped(swin_official(16, (1, 1, 3, 1), (1, 2, 2, 4))), 'SoftFreeSwin', SWIN, SWIN_FITS,
                      {}),
    'swin-timm': (lambda: _timm('swin_tiny_patch4_window7_224', embed_dim=16, depths=(1, 1, 3, 1),
                                num_heads=(1, 2, 2, 4)), 'SoftFreeSwin', SWIN, SWIN_FITS, {}),
    'swin-mmdet': (lambda: _mm_swin('mmdet'), 'SoftFreeSwin', SWIN, SWIN_FITS, {}),
    'swin-mmpretrain': (lambda: _mm_swin('mmpretrain'), 'SoftFreeSwin', SWIN, SWIN_FITS, {}),
    'inline-swin': (lambda: wrapped(swin_official(16, (1, 1, 3, 1), (1, 2, 2, 4), kinds=('I', 'I', 'III', 'S'))),
                    'SoftFreeSwin', dict(SWIN, arch='inline_tiny'),
                    "arch='inline_tiny', embed_dims=16, depths=(1, 1, 3, 1), num_heads=(1, 2, 2, 4)", {}),
    'inline-swin-base': (lambda: wrapped(swin_official(16, (1, 1, 3, 1), (1, 2, 2, 4), kinds=('I', 'I', 'IIS', 'S'))),
                         'SoftFreeSwin', dict(SWIN, arch='inline_base', depths=(1, 1, 4, 1),
                                              attn_cfg=['inline', 'inline', ['inline'] * 2 + ['softmax'] * 2,
                                                        'softmax'],
                                              global_window=(True, True, [True, True, False, False], False)),
                         "arch='inline_base', embed_dims=16, depths=(1, 1, 3, 1), attn_cfg=('inline', 'inline', "
                         "('inline', 'inline', 'softmax'), 'softmax'), global_window=(True, True, (True, True, False), "
                         'False), num_heads=(1, 2, 2, 4)', {}),
    'pvt-official': (lambda: wrapped(pvt_official((16, 32, 80, 128), (1, 2, 1, 1), (8, 8, 4, 4), (8, 4, 2, 1))),
                     'SoftFreePVT', PVT, "arch='tiny', embed_dims=(16, 32, 80, 128), depths=(1, 2, 1, 1)", {}),
    'inline-pvt': (lambda: wrapped(pvt_official((16, 32, 80, 128), (1, 2, 1, 1), (8, 8, 4, 4), (1, 1, 1, 1),
                                                inline_heads=(2, 4, 10, 16))),
                   'SoftFreePVT', dict(PVT, arch='inline_tiny'),
                   "arch='inline_tiny', embed_dims=(16, 32, 80, 128), depths=(1, 2, 1, 1)", {}),
    'pvt-v2-official': (lambda: wrapped(pvt_official((16, 32, 80, 128), (1, 1, 2, 1), (8, 8, 4, 4), (8, 4, 2, 1),
                                                     version=2)),
                        'SoftFreePVTv2', dict(PVT, arch='b1'),
                        "arch='b1', embed_dims=(16, 32, 80, 128), depths=(1, 1, 2, 1)", {}),
    'pvt-v2-timm': (lambda: _timm('pvt_v2_b0', embed_dims=(16, 32, 80, 128), depths=(1, 1, 2, 1),
                                  num_heads=(1, 2, 5, 8)),
                    'SoftFreePVTv2', dict(PVT, arch='b0'),
                    "arch='b0', embed_dims=(16, 32, 80, 128), depths=(1, 1, 2, 1)", {}),
    'xcit-official': (lambda: wrapped(xcit_official(32, 3, 4)), 'SoftFreeXCiT',
                      dict(arch='t12', embed_dims=32, depth=2, num_heads=4, out_type='cls_token'),
                      "arch='t12', embed_dims=32, depth=3", dict(out_type='cls_token')),
    'xcit-timm': (lambda: _timm('xcit_tiny_12_p16_224', embed_dim=32, num_heads=2, depth=3), 'SoftFreeXCiT',
                  dict(arch='t12', embed_dims=32, depth=3, num_heads=4, out_type='cls_token'),
                  "arch='t12', embed_dims=32, depth=3, num_heads=2", dict(out_type='cls_token')),
    'cswin-official': (lambda: wrapped(cswin_official(16, (1, 1, 3, 1), (2, 2, 4, 4))), 'SoftFreeCSWin', CSWIN,
                       "arch='tiny', embed_dims=16, depths=(1, 1, 3, 1), num_heads=(2, 2, 4, 4)", {}),
    'cswin-segmentation': (lambda: wrapped(cswin_official(16, (1, 2, 2, 1), (2, 2, 4, 4), segmentation=True)),
                           'SoftFreeCSWin', CSWIN,
                           "arch='tiny', embed_dims=16, depths=(1, 2, 2, 1), num_heads=(2, 2, 4, 4)", {}),
    'inline-cswin': (lambda: wrapped(cswin_official(16, (1, 1, 3, 1), (2, 2, 4, 4), kinds='IISS')), 'SoftFreeCSWin',
                     dict(CSWIN, arch='inline_tiny'),
                     "arch='inline_tiny', embed_dims=16, depths=(1, 1, 3, 1), num_heads=(2, 2, 4, 4)", {}),
    'soft-official': (lambda: {'state_dict_ema': zeros(soft_official((16, 32, 48, 64), (1, 1, 3, 1), (1, 2, 3, 4)))},
                      'SoftFreeSOFT', dict(arch=dict(SOFT, normalized=True)),
                      'arch=dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 3, 1), num_heads=(1, 2, 3, 4), '
                      'normalized=True)', {}),
}
NO_HEADS = {'pvt-official', 'pvt-v2-official', 'pvt-v2-timm', 'cswin-official', 'cswin-segmentation'}


def _build(cls_name, kwargs):
    kwargs = dict(kwargs)
    if cls_name == 'SoftFreeXCiT':
        kwargs.setdefault('norm_cfg', dict(type='BN'))
    return getattr(models, cls_name)(**kwargs)


@pytest.mark.parametrize('name', sorted(SMALL))
def test_loading_a_file_of_another_depth_is_one_error_naming_the_arguments_that_fit_it(name, tmp_path, capsys):
    make, cls_name, model_kw, fits, extra = SMALL[name]
    path = save(tmp_path, name, make())
    model = _build(cls_name, dict(model_kw, init_cfg=dict(type='Pretrained', checkpoint=path)))
    with pytest.raises(ValueError) as e:
        model.init_weights()
    msg = str(e.value)
    lines = msg.splitlines()
    assert lines[0].startswith(f'{cls_name}: checkpoint {path} holds another architecture than this model'), msg
    assert f'the file fits {cls_name}({fits})' in lines[-1], msg
    assert 1 <= len(lines) - 2 <= 4 and len(msg) < 1200 and 'size mismatch' not in msg  # a row per differing stage
    stage_rows = [line for line in lines[1:-1] if line.strip().startswith('stage ')]
    assert len(stage_rows) == (0 if cls_name == 'SoftFreeXCiT' else len(lines) - 2), msg
    if name in NO_HEADS:
        assert 'the file does not show the heads' not in msg  # the model's heads fill the stages of its width
    # a model built with those arguments takes the file: nothing of another shape, every block placed
    # --print-arch on the same file: the class, the arguments' depths, no preset
    assert convert_checkpoint.main(['auto', path, '--print-arch']) == 0
    line = capsys.readouterr().out.strip()
    depths, depth = re.search(r'depths=\(([^)]*)\)', fits), re.search(r'depth=(\d+)', fits)
    holds = f'the file holds depths ({depths.group(1)})' if depths else f'the file holds {depth.group(1)} blocks'
    assert f': {cls_name}(arch=' in line and '(no preset has this architecture)' in line and holds in line, line
    fitting = _build(cls_name, {**eval(f'dict({fits})'), **extra})
    missing, unexpected, mismatched = load_pretrained(fitting, path, type(fitting)._convert,
                                                      prefer_ema=fitting._prefer_ema)
    assert mismatched == [] and not [k for k in missing if 'blocks.' in k], (missing, mismatched)


def test_the_issue_examples_name_the_preset_of_the_file(tmp_path):
    """A SOFT-Small-Norm-sized file into a model of other widths names small_norm (the model is SOFT-Norm; the
    file cannot tell), an InLine-CSWin-S file into inline_tiny names inline_small, a Swin-S file into a Swin-T
    names small; each row names a stage."""
    cases = [
        ({'state_dict_ema': zeros(soft_official((64, 128, 320, 512), (1, 3, 20, 4), (2, 4, 10, 16)))},
         'SoftFreeSOFT', dict(arch=dict(SOFT, normalized=True)), "SoftFreeSOFT(arch='small_norm')",
         'stage 2: 20 blocks of 320 channels (10 heads) in the file, 2 blocks of 48 channels (3 heads) in the model'),
        (wrapped(cswin_official(64, (3, 6, 29, 2), (2, 4, 8, 16), kinds='IISS')), 'SoftFreeCSWin',
         dict(CSWIN, arch='inline_tiny'), "SoftFreeCSWin(arch='inline_small')",
         'stage 2: 29 blocks of 256 channels in the file, 2 blocks of 64 channels (4 heads) in the model'),
        (wrapped(swin_official(96, (2, 2, 18, 2), (3, 6, 12, 24))), 'SoftFreeSwin', dict(arch='tiny', embed_dims=8,
                                                                                         num_heads=(1, 1, 1, 1)),
         "SoftFreeSwin(arch='small')",
         'stage 2: 18 blocks of 384 channels (12 heads) in the file, 6 blocks of 32 channels (1 head) in the model'),
    ]
    for i, (obj, cls_name, kw, fits, row) in enumerate(cases):
        path = save(tmp_path, str(i), obj)
        model = _build(cls_name, dict(kw, init_cfg=dict(type='Pretrained', checkpoint=path)))
        with pytest.raises(ValueError) as e:
            model.init_weights()
        lines = str(e.value).splitlines()
        assert lines[-1].strip() == f'the file fits {fits}', str(e.value)
        assert f'  {row};' in lines, str(e.value)
        assert len(lines) == 6


def test_our_own_layout_of_other_heads_is_one_error_naming_the_heads(tmp_path):
    torch.manual_seed(0)
    src = models.SoftFreeSwin(arch='tiny', embed_dims=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 4))
    path = save(tmp_path, 'ours', {'state_dict': src.state_dict()})
    model = models.SoftFreeSwin(arch=dict(SWIN), init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=r'stage 2: 2 blocks of 64 channels \(4 heads\) in the file, 2 blocks of 64 '
                                         r'channels \(2 heads\) in the model;\n  the file fits SoftFreeSwin\('
                                         r"arch='tiny', embed_dims=16, depths=\(1, 1, 2, 1\), "
                                         r'num_heads=\(1, 2, 4, 4\)'):
        model.init_weights()
    # the same file into a model of its architecture with another kernel (no bias tables) is no error
    same = models.SoftFreeSwin(arch='tiny', embed_dims=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 4),
                               attn_cfg='linear', init_cfg=dict(type='Pretrained', checkpoint=path))
    same.init_weights()
    assert torch.equal(same.state_dict()['stages.2.blocks.1.attn.qkv.weight'],
                       src.state_dict()['stages.2.blocks.1.attn.qkv.weight'])


# ---------------------------------------------------------------------------------------------- train.py
class _Detector(nn.Module):
    def __init__(self, **backbone):
        super().__init__()
        self.backbone = models.SoftFreeSwin(**backbone)
        self.head = nn.Linear(4, 2)


def test_dry_run_start_check_reads_converts_and_names_what_is_not_there(tmp_path):
    from mmengine.config import Config

    from softfree_mm.engine.dry_run import check_start
    from softfree_mm.engine.errors import UsageError
    official = save(tmp_path, 'swin_official', wrapped(swin_official(16, (1, 1, 2, 1), (1, 2, 2, 4))))
    model = _Detector(arch=dict(SWIN), init_cfg=dict(type='Pretrained', checkpoint=official))
    whole = save(tmp_path, 'whole', {'state_dict': model.state_dict(), 'meta': {}})
    lines = check_start(Config(dict(load_from=whole)), model)
    assert lines[0].startswith(f'model.backbone.init_cfg: {official} fits SoftFreeSwin (depths (1, 1, 2, 1), '
                               'widths (16, 32, 64, 128), heads (1, 2, 2, 4)'), lines
    # the output norms 0-2 a classifier does not have
    assert lines[0].endswith('weights placed (6 left to their initialisation)'), lines
    assert lines[1] == f'load_from: {whole} fits the model: {len(model.state_dict())} of its ' \
                       f'{len(model.state_dict())} weights'
    # a whole-model checkpoint whose backbone is deeper: the backbone's error, under load_from
    deeper = _Detector(arch='tiny', embed_dims=16, depths=(1, 1, 3, 1), num_heads=(1, 2, 2, 4))
    other = save(tmp_path, 'deeper', {'state_dict': deeper.state_dict()})
    with pytest.raises(UsageError, match=r'--dry-run: load_from: ValueError: SoftFreeSwin: checkpoint .*deeper.pth '
                                         r'holds another architecture .* stage 2: 3 blocks'):
        check_start(Config(dict(load_from=other)), model)
    # files not there: lines, not errors
    model.backbone.init_cfg = dict(type='Pretrained', checkpoint=str(tmp_path / 'work_dirs' / 'cls_swin_t_poly3' /
                                                                     'epoch_300.pth'))
    lines = check_start(Config(dict(load_from=str(tmp_path / 'none.pth'))), model)
    assert lines[0].startswith('model.backbone.init_cfg: the run stops before training: pretrained checkpoint ')
    assert 'make it with `python tools/train.py configs/cls_swin_t_poly3.py`' in lines[0]
    assert lines[1] == f'load_from: not checked: {tmp_path / "none.pth"} is not there'
    model.backbone.init_cfg = dict(type='Pretrained', checkpoint='https://example.org/never/swin_not_fetched_9f3a.pth')
    assert 'is not downloaded yet' in check_start(Config(dict()), model)[0]


@pytest.fixture(scope='module')
def train_tool():
    return load_tool('train', 'softfree_tool_train_arch')


@pytest.mark.parametrize('mode', ['load', 'resume', 'test'])
def test_start_and_test_checks_name_a_backbone_of_another_depth(mode, tmp_path):
    """tools/train.py (load_from, --resume) and tools/test.py check the checkpoint with check_checkpoint."""
    from softfree_mm.engine.checkpoints import check_checkpoint
    from softfree_mm.engine.errors import BadInput
    model = _Detector(arch=dict(SWIN))
    deeper = _Detector(arch='tiny', embed_dims=16, depths=(1, 1, 3, 1), num_heads=(1, 2, 2, 4))
    path = save(tmp_path, 'deeper', {'state_dict': deeper.state_dict()})
    with pytest.raises(BadInput, match=r'^SoftFreeSwin: checkpoint .* holds another architecture than this model '
                                       r"\(arch=dict\(.*\)\): stage 2: 3 blocks .*; the file fits SoftFreeSwin\("
                                       r"arch='tiny', embed_dims=16, depths=\(1, 1, 3, 1\)"):
        check_checkpoint(path, model, mode)
    check_checkpoint(save(tmp_path, 'same', {'state_dict': model.state_dict()}), model, mode)


def test_dry_run_checks_the_start_checkpoint_both_ways(train_tool, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = osp.join(ROOT, 'configs', 'demo', 'upernet_swin_t_poly3_demo.py')
    small = dict(embed_dims=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4))
    options = ['--cfg-options', 'model.backbone.embed_dims=16', 'model.backbone.depths=[2,2,1,1]',
               'model.backbone.num_heads=[1,2,2,4]', 'model.decode_head.in_channels=[16,32,64,128]',
               'model.auxiliary_head.in_channels=64', 'model.backbone.init_cfg.type=Pretrained']
    fits = save(tmp_path, 'fits', {'state_dict': models.SoftFreeSwin(arch=dict(small)).state_dict()})
    deeper = save(tmp_path, 'deeper', {'state_dict': models.SoftFreeSwin(
        arch=dict(small, depths=(2, 2, 2, 1))).state_dict()})
    args = [cfg, '--dry-run', '--work-dir', str(tmp_path / 'w'), *options]
    assert train_tool.main(args + [f'model.backbone.init_cfg.checkpoint={fits}']) == 0
    out = capsys.readouterr().out
    assert f'[dry-run] model.backbone.init_cfg: {fits} fits SoftFreeSwin (depths (2, 2, 1, 1), ' in out
    assert 'of its 99 weights placed' in out
    assert train_tool.main(args + [f'model.backbone.init_cfg.checkpoint={deeper}']) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith('error:')]
    assert err == [f'error: --dry-run: model.backbone.init_cfg.checkpoint: ValueError: SoftFreeSwin: checkpoint '
                   f"{deeper} holds another architecture than this model (arch='tiny'): stage 2: 2 blocks of 64 "
                   'channels (2 heads) in the file, 1 block of 64 channels (2 heads) in the model; the file fits '
                   "SoftFreeSwin(arch='tiny', embed_dims=16, depths=(2, 2, 2, 1), num_heads=(1, 2, 2, 4)) (no preset "
                   'has this architecture)']
