"""SoftFreeSwin: registry builds for every kernel, strides/shapes at odd sizes, gradients, bf16, padding
invariance, parity with timm and mmdet Swin given the same weights, conversion, freezing, checkpointing,
layer depths, error messages, and the three downstream models (Mask R-CNN, UperNet, ImageClassifier)."""
import os
import types

import pytest
import torch
import torch.nn.functional as F

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.attention import kernel_class, list_attentions
from softfree_mm.models.backbones.swin import SoftFreeSwin
from softfree_mm.models.backbones.swin_convert import convert_swin

from tests.helpers.models import build_in, run_classifier, run_mask_rcnn, run_upernet, strided_shapes

SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
KERNELS = list_attentions()
TINY = SoftFreeSwin.family.tiny['arch']  # the family's tiny preset: shifted blocks in stages 0 and 1
CHANNELS = (16, 32, 64, 128)


def randomize_(module, std=0.05):
    """Random weights everywhere (LayerNorm weights around 1) so parity tests compare non-trivial numbers."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1 + noise if ('norm' in name and name.endswith('weight')) else noise)


# ------------------------------------------------------------------------------------------- every kernel
@pytest.mark.parametrize('kernel', KERNELS)
def test_every_kernel_builds_in_all_registries_with_strided_shapes_finite_grads_and_bf16(kernel):
    cfg = dict(type='SoftFreeSwin', arch=dict(TINY), attn_cfg=kernel, drop_path_rate=0.1)
    if not kernel_class(kernel).supports_mask:
        # window stages need masks (shift regions, padded keys): the backbone must refuse such a kernel
        with pytest.raises(ValueError, match=rf"SoftFreeSwin: attention kernel '{kernel}' cannot be used in "
                                             r"stage 0 .*global_window=True"):
            build_in('mmdet', cfg)
        cfg['global_window'] = True
    models = [build_in(scope, cfg) for scope in SCOPES]
    assert all(type(m) is SoftFreeSwin for m in models)
    model = models[0].train()
    assert model.out_channels == CHANNELS
    x = torch.randn(1, 3, 67, 93)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == strided_shapes(1, CHANNELS, 67, 93)
    sum(o.square().mean() for o in outs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f'{kernel}: no/non-finite grad for {name}'
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
    assert all(torch.isfinite(o.float()).all() for o in outs)


def test_bias_table_exists_only_for_window_stages_whose_kernel_takes_a_bias():
    cfgs = ['softmax', 'linear', 'poly', 'softmax']
    model = SoftFreeSwin(arch=dict(TINY), attn_cfg=cfgs, global_window=(False, False, False, True))
    has = [blk.attn.relative_position_bias_table is not None for s in model.stages for blk in s.blocks[:1]]
    assert has == [True, False, True, False]
    assert model.stages[0].blocks[0].attn.relative_position_bias_table.shape == (13 * 13, 1)


def test_tiny_preset_channels_and_small_preset_shapes_at_200x333():
    tiny = SoftFreeSwin(arch='tiny', out_indices=(1, 3))
    assert tiny.out_channels == (192, 768) and tiny.num_features == (96, 192, 384, 768)
    assert tiny.depths == (2, 2, 6, 2) and tiny.num_heads == (3, 6, 12, 24)
    assert sum(p.numel() for p in tiny.parameters()) == pytest.approx(27.5e6, rel=0.02)  # Swin-T without head
    model = SoftFreeSwin(arch=dict(TINY)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 200, 333))
    assert [tuple(o.shape) for o in outs] == strided_shapes(1, CHANNELS, 200, 333)


# ------------------------------------------------------------------------------------------- padding
def _pad_positions(hw, window, shifted):
    """(nW, N) bool: which window slots hold pad tokens, derived from the geometry alone (test's own code)."""
    h, w = hw
    hp, wp = -(-h // window) * window, -(-w // window) * window
    pad = torch.ones(hp, wp, dtype=torch.bool)
    pad[:h, :w] = False
    if shifted:
        pad = torch.roll(pad, shifts=(-(window // 2) if h > window else 0, -(window // 2) if w > window else 0),
                         dims=(0, 1))
    return pad.view(hp // window, window, wp // window, window).permute(0, 2, 1, 3).reshape(-1, window * window)


# which slots are padding is the backbone's business (kernels test their own masking): one kernel with a bias
# on the fused path, one factorised kernel honouring the mask
@pytest.mark.parametrize('kernel', ['softmax', 'linear'])
def test_values_in_padded_window_slots_change_no_valid_output(kernel):
    torch.manual_seed(0)
    model = SoftFreeSwin(arch=dict(TINY), attn_cfg=kernel, drop_path_rate=0.0).eval()
    x = torch.randn(1, 3, 39, 61)  # stage grids 10x16 and 5x8: padded, shifted windows
    grids = {0: (10, 16), 1: (5, 8)}
    with torch.no_grad():
        ref = model(x)

    def run_with(perturb):
        handles = []
        for i, hw in grids.items():
            for j, blk in enumerate(model.stages[i].blocks):
                pad = _pad_positions(hw, 7, shifted=j % 2 == 1)
                assert pad.any()

                def hook(mod, args, kwargs, pad=pad):
                    win = args[0].clone()
                    sel = perturb(pad)
                    win[sel.expand(win.shape[0] // sel.shape[0], -1, -1).reshape(win.shape[0], -1)] += 50.0
                    return (win,), kwargs
                handles.append(blk.attn.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            with torch.no_grad():
                return model(x)
        finally:
            for hnd in handles:
                hnd.remove()

    outs = run_with(lambda pad: pad)
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    # control: the same perturbation on one real token does change the outputs
    def one_valid(pad):
        sel = torch.zeros_like(pad)
        sel[0, 0] = True
        return sel
    outs = run_with(one_valid)
    assert not torch.allclose(outs[0], ref[0], atol=1e-3)


# ------------------------------------------------------------------------------------------- parity
def test_softmax_swin_equals_timm_forward_intermediates_with_converted_weights():
    timm = pytest.importorskip('timm')
    arch = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
    ref = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False, embed_dim=16, depths=(2, 2, 2, 2),
                            num_heads=(1, 2, 2, 4), drop_path_rate=0.0).eval()
    randomize_(ref)
    model = SoftFreeSwin(arch=arch, drop_path_rate=0.0).eval()
    randomize_(model)
    missing, unexpected = model.load_state_dict(convert_swin(ref.state_dict()), strict=False)
    assert unexpected == [] and sorted(missing) == [f'norm{i}.{p}' for i in range(3) for p in ('bias', 'weight')]
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        _, inter = ref.forward_intermediates(x, norm=True)
        outs = model(x)
    # stages 0-2: timm gives pre-norm features; our outputs are those features through our own norm{i}
    for i in range(3):
        norm = getattr(model, f'norm{i}')
        expect = F.layer_norm(inter[i].permute(0, 2, 3, 1), norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        torch.testing.assert_close(outs[i], expect.permute(0, 3, 1, 2), atol=1e-4, rtol=1e-4)
    # stage 3: timm's final norm (converted to our norm3)
    torch.testing.assert_close(outs[3], inter[3], atol=1e-4, rtol=1e-4)


def test_softmax_swin_equals_mmdet_swin_with_converted_mmdet_weights():
    from mmdet.models.backbones.swin import SwinTransformer
    ref = SwinTransformer(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), drop_path_rate=0.0)
    ref.eval()
    randomize_(ref)
    model = SoftFreeSwin(arch=dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4)),
                         drop_path_rate=0.0).eval()
    model.load_state_dict(convert_swin(ref.state_dict()), strict=True)
    # 448: every stage grid (112, 56, 28, 14) is a window multiple larger than the window, so mmdet (which
    # neither masks pad keys nor skips the shift on a one-window grid) computes the same function
    x = torch.randn(1, 3, 448, 448)
    with torch.no_grad():
        expect = ref(x)
        outs = model(x)
    for o, e in zip(outs, expect):
        torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)


# 232x296: stage grids 58x74, 29x37, 15x19, 8x10, none a multiple of 7; 200x264: 50x66 .. 7x9 (stage 4 one window
# high, shifted by mmdet all the same)
@pytest.mark.parametrize('hw', [(232, 296), (200, 264)], ids=['232x296', '200x264'])
def test_mmdet_padding_rule_equals_mmdets_own_swin_where_every_stage_pads(hw):
    """An mmdet model-zoo Swin detector loaded into SoftFreeSwin computes mmdet's function on every COCO image when
    built with ``MMDET_PADDING`` (zero pad tokens attended as keys, shifted blocks rolled along both axes): mmdet's
    own module, float64, to 1e-10; our default rule (pad keys removed, no shift along a one-window axis) computes
    another function there."""
    from mmdet.models.backbones.swin import SwinTransformer
    from softfree_mm.models.backbones.swin import MMDET_PADDING
    arch = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
    ref = SwinTransformer(**arch, drop_path_rate=0.0)
    ref.eval()
    randomize_(ref, std=0.2)
    ref.double()
    model = SoftFreeSwin(arch=dict(arch), drop_path_rate=0.0, **MMDET_PADDING).double().eval()
    model.load_state_dict(convert_swin(ref.state_dict()), strict=True)
    ours = SoftFreeSwin(arch=dict(arch), drop_path_rate=0.0).double().eval()
    ours.load_state_dict(model.state_dict(), strict=True)
    x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        expect, outs, other = ref(x), model(x), ours(x)
    for o, e in zip(outs, expect):
        torch.testing.assert_close(o, e, atol=1e-10, rtol=1e-10)
    assert float((other[3] - expect[3]).abs().max()) > 1e-3


def test_abs_pos_embed_swin_equals_mmdet_at_the_pretrain_size_and_mmdet_with_the_bicubic_table_elsewhere(tmp_path):
    from mmdet.models.backbones.swin import SwinTransformer
    from mmpretrain.models.utils import resize_pos_embed
    from softfree_mm.models.converters import load_pretrained
    arch = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
    # window 2: every stage grid below (32/48 at stride 4 down to 4/6) is an even number > 2, where mmdet (which
    # neither masks pad keys nor skips the shift on a one-window grid) computes the same function as ours
    common = dict(window_size=2, drop_path_rate=0.0, use_abs_pos_embed=True)
    ref = SwinTransformer(**arch, **common, pretrain_img_size=(128, 192))
    ref.eval()  # (mmdet's train() returns None)
    randomize_(ref)
    path = os.path.join(tmp_path, 'mask_rcnn_swin_ape.pth')  # what an mmdet detector checkpoint holds
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in ref.state_dict().items()}}, path)
    model = SoftFreeSwin(arch=arch, **common, pretrain_img_size=(128, 192)).eval()
    assert model.absolute_pos_embed.shape == ref.absolute_pos_embed.shape == (1, 32 * 48, 32)
    # the user's path (init_cfg Pretrained): converted, every key placed, nothing skipped
    assert load_pretrained(model, path, convert_swin) == ([], [], [])
    assert torch.equal(model.absolute_pos_embed, ref.absolute_pos_embed)
    x = torch.randn(1, 3, 128, 192)
    with torch.no_grad():
        for o, e in zip(model(x), ref(x)):
            torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)
    # another size (H and W swapped): mmdet adds its table unresized (a shape error for another token count; with
    # this one's equal count, rows land on the wrong tokens); the reference is mmdet's module at that pretrain size
    # given the table resized by mmpretrain's resize_pos_embed (bicubic)
    other = SwinTransformer(**arch, **common, pretrain_img_size=(192, 128))
    other.eval()
    sd = dict(ref.state_dict(), absolute_pos_embed=resize_pos_embed(ref.absolute_pos_embed.detach(), (32, 48),
                                                                    (48, 32), mode='bicubic', num_extra_tokens=0))
    other.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, 192, 128)
    with torch.no_grad():
        outs, expect, unresized = model(x), other(x), ref(x)
    assert not torch.allclose(outs[0], unresized[0], atol=1e-3)
    assert [tuple(o.shape[2:]) for o in outs] == [(48, 32), (24, 16), (12, 8), (6, 4)]
    for o, e in zip(outs, expect):
        torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)


def test_convert_checkpoint_places_an_mmdet_swin_files_absolute_pos_embed():
    from mmdet.models.backbones.swin import SwinTransformer
    from softfree_mm.models.converters import detect_family, unplaced_keys
    ref = SwinTransformer(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), use_abs_pos_embed=True)
    family, converted = detect_family(ref.state_dict())
    assert family == 'swin' and 'absolute_pos_embed' in converted and unplaced_keys('swin', converted) == []


def test_abs_pos_embed_is_trunc_normal_frozen_with_the_stem_and_absent_by_default():
    model = SoftFreeSwin(arch=dict(TINY), use_abs_pos_embed=True, pretrain_img_size=(96, 64))
    pos = model.absolute_pos_embed.detach()
    assert pos.shape == (1, 24 * 16, 16)
    assert abs(pos.std().item() - 0.02) < 0.003 and abs(pos.mean().item()) < 0.003
    assert model.get_layer_depth('backbone.absolute_pos_embed', 'backbone.') == (0, sum(TINY['depths']) + 2)
    frozen = SoftFreeSwin(arch=dict(TINY), use_abs_pos_embed=True, frozen_stages=0)
    assert not frozen.absolute_pos_embed.requires_grad and not frozen.patch_embed.proj.weight.requires_grad
    assert SoftFreeSwin(arch=dict(TINY), use_abs_pos_embed=True).absolute_pos_embed.requires_grad
    assert 'absolute_pos_embed' not in SoftFreeSwin(arch=dict(TINY)).state_dict()


# ------------------------------------------------------------------------------------------- conversion
def test_convert_swin_maps_official_and_timm_layouts_to_the_same_state_dict():
    timm = pytest.importorskip('timm')
    ref = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False, embed_dim=16, depths=(2, 2, 1, 1),
                            num_heads=(1, 2, 2, 4))
    timm_sd = ref.state_dict()
    # official release layout: patch merging belongs to the end of the previous stage, buffers are saved
    official = {}
    for k, v in timm_sd.items():
        p = k.split('.')
        if k.startswith('layers.') and p[2] == 'downsample':
            k = '.'.join(['layers', str(int(p[1]) - 1)] + p[2:])
        official[k.replace('head.fc.', 'head.')] = v
    official['layers.0.blocks.1.attn_mask'] = torch.zeros(4, 49, 49)
    official['layers.0.blocks.0.attn.relative_position_index'] = torch.zeros(49, 49, dtype=torch.long)
    a, b = convert_swin(timm_sd), convert_swin(official)
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    model = SoftFreeSwin(arch=dict(TINY))
    own = set(model.state_dict())
    assert set(a) == own - {f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}
    assert convert_swin(model.state_dict()).keys() == model.state_dict().keys()  # ours passes through


def test_pretrained_init_cfg_loads_an_official_layout_file_through_the_converter(tmp_path):
    timm = pytest.importorskip('timm')
    ref = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False, embed_dim=16, depths=(2, 2, 1, 1),
                            num_heads=(1, 2, 2, 4))
    official = {}
    for k, v in ref.state_dict().items():
        p = k.split('.')
        if k.startswith('layers.') and p[2] == 'downsample':
            k = '.'.join(['layers', str(int(p[1]) - 1)] + p[2:])
        official[k] = v + 0.5 if k.startswith('norm.') else v  # a final norm unlike LayerNorm's initialisation
    a = convert_swin(official)
    path = os.path.join(tmp_path, 'swin_official.pth')
    torch.save({'model': official}, path)
    # a classifier takes the release's final norm as norm3; a feature pyramid leaves norm3 at its initialisation,
    # as the official detection code and mmdet do
    for out_indices in ((3,), (0, 1, 2, 3)):
        loaded = SoftFreeSwin(arch=dict(TINY), out_indices=out_indices,
                              init_cfg=dict(type='Pretrained', checkpoint=path))
        loaded.init_weights()
        sd = loaded.state_dict()
        pyramid = out_indices != (3,)
        assert all(torch.equal(sd[k], a[k]) for k in a if not (pyramid and k.startswith('norm3.')))
        assert torch.equal(sd['norm3.weight'], torch.ones(128) if pyramid else a['norm3.weight'])


def test_mmdet_unfold_order_conversion_inverts_mmdets_own_swin_converter():
    from mmdet.models.backbones.swin import swin_converter
    w = torch.randn(8, 4 * 3)
    norm = torch.randn(4 * 3)
    official = {'layers.0.downsample.reduction.weight': w, 'layers.0.downsample.norm.weight': norm}
    official['patch_embed.proj.weight'] = torch.randn(3, 3, 4, 4)
    mm = {k[len('backbone.'):]: v for k, v in swin_converter(official).items()}
    assert 'patch_embed.projection.weight' in mm and 'stages.0.downsample.reduction.weight' in mm
    ours = convert_swin(mm)
    assert torch.equal(ours['stages.1.downsample.reduction.weight'], w)
    assert torch.equal(ours['stages.1.downsample.norm.weight'], norm)


def _swin_shift(hw, window, always=False):
    """Swin's shift: half a window along each axis that holds more than one window (none where one window covers
    the axis: the roll would only cut that window in two); ``always`` (mmdet's rule): half a window along both."""
    return tuple(win // 2 if (n > win or always) else 0 for n, win in zip(hw, window))


def _shifted_keep(hw, window, shift, pad_keys='mask'):
    """(nW, N, N) bool: which slots of each window a slot may see, from token positions alone. The (H, W) grid is
    zero padded to whole windows and rolled back by ``shift``; two slots of a window may meet when they lie in the
    window as their tokens lie in the padded grid (no wrap-around between them); with ``pad_keys='mask'`` a pad
    token is no key (seen by itself only), with 'zeros' it is a key like any other."""
    (h, w), (wh, ww), (sh, sw) = hw, window, shift
    hp, wp = -(-h // wh) * wh, -(-w // ww) * ww
    r, c = torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing='ij')  # slot positions after the roll
    src_r, src_c = (r + sh) % hp, (c + sw) % wp  # where each slot's token lies in the padded grid

    def windows(t):
        return t.view(hp // wh, wh, wp // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)

    def offsets(t):
        return t[:, :, None] - t[:, None, :]
    r, c, src_r, src_c = (windows(t) for t in (r, c, src_r, src_c))
    together = (offsets(src_r) == offsets(r)) & (offsets(src_c) == offsets(c))
    real_key = ((src_r < h) & (src_c < w))[:, None, :] | (pad_keys == 'zeros')
    return (together & real_key) | torch.eye(wh * ww, dtype=torch.bool)


# one window along one axis and several along the other (both ways, padded or not), several along both, one in all
SHIFT_GRIDS = [((5, 16), 7), ((7, 20), 7), ((16, 5), 7), ((6, 11), 7), ((10, 16), 7), ((14, 14), 7), ((5, 6), 7),
               ((7, 7), 7), ((3, 9), 4), ((9, 4), 4), ((8, 12), 4)]
RULES = [('mask', False), ('zeros', True)]  # ours; mmdet's and the official detection / segmentation code's


@pytest.mark.parametrize('rule', RULES, ids=['ours', 'mmdet'])
@pytest.mark.parametrize('hw,window', SHIFT_GRIDS, ids=[f'{h}x{w}-window{n}' for (h, w), n in SHIFT_GRIDS])
def test_window_masks_equal_a_mask_from_token_positions(hw, window, rule):
    """Every real query's row of the keep-mask, under either padding rule; an unshifted window's mask of ours is a
    key mask (nW, 1, 1, N): it only removes pad keys, so linear kernels keep their factorised order."""
    from softfree_mm.models.utils.windows import WindowGeometry
    pad_keys, always = rule
    geo = WindowGeometry(hw, window, 'cpu', pad_keys=pad_keys, always_shift=always)
    hp, wp = -(-hw[0] // window) * window, -(-hw[1] // window) * window
    for shifted in (False, True):
        shift = _swin_shift(hw, (window, window), always) if shifted else (0, 0)
        assert geo.shift == _swin_shift(hw, (window, window), always)
        expect = _shifted_keep(hw, (window, window), shift, pad_keys)
        got = geo.mask(shifted)
        if got is not None and not (shifted and any(shift)):
            assert got.shape == (expect.shape[0], 1, 1, expect.shape[1])  # a key mask
        got = torch.ones_like(expect) if got is None else got[:, 0].expand_as(expect)  # None: every key may be seen
        pad = torch.ones(hp, wp, dtype=torch.bool)
        pad[:hw[0], :hw[1]] = False
        pad = torch.roll(pad, shifts=tuple(-s for s in shift), dims=(0, 1))
        real_query = ~pad.view(hp // window, window, wp // window, window).permute(0, 2, 1, 3).reshape(expect.shape[:2])
        assert torch.equal(got[real_query], expect[real_query]), f'{hw}, window {window}, shifted={shifted}'


def _plain_attend(blk, x, geo):
    """The window attention written the plain way: zero pad the normed tokens, roll, cut windows, qkv on every
    slot, kernel under the mask from token positions, proj on every slot, un-window, roll back, crop; InLine's
    context as the mean over real tokens."""
    b, h, w, c = x.shape
    (hp, wp), (wh, ww) = geo.padded, geo.window
    sh, sw = _swin_shift((h, w), geo.window) if blk.shifted else (0, 0)
    real = torch.zeros(1, hp, wp, 1, dtype=x.dtype)
    real[:, :h, :w] = 1
    xp = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
    if sh or sw:
        xp, real = (torch.roll(t, shifts=(-sh, -sw), dims=(1, 2)) for t in (xp, real))

    def windows(t):
        return t.reshape(t.shape[0], hp // wh, wh, wp // ww, ww, -1).transpose(2, 3).reshape(-1, wh * ww,
                                                                                            t.shape[-1])
    xw, rw = windows(xp), windows(real).repeat(b, 1, 1)
    context = (xw * rw).sum(1) / rw.sum(1).clamp_min(1) if blk.attn.kernel.takes_context else None
    keep = _shifted_keep((h, w), (wh, ww), (sh, sw))
    mask = None if keep.all() else keep[:, None].repeat(b, 1, 1, 1)
    y = blk.attn.proj(blk.attn(blk.attn.qkv(xw), mask=mask, hw=(wh, ww), context=context))
    y = y.view(b, hp // wh, wp // ww, wh, ww, c).transpose(2, 3).reshape(b, hp, wp, c)
    if sh or sw:
        y = torch.roll(y, shifts=(sh, sw), dims=(1, 2))
    return y[:, :h, :w]


# one kernel with a bias and a mask, one that takes the mean of each window's real tokens as context and convolves
# v over the window, one factorised kernel; batch 2 (windows are batch-major)
@pytest.mark.parametrize('kernel', ['softmax', dict(type='inline', local_residual='channel'), 'poly'])
def test_gathered_windows_equal_plain_pad_roll_partition_in_outputs_and_every_gradient(kernel, monkeypatch):
    from softfree_mm.models.backbones import swin_layers
    torch.manual_seed(0)
    a = SoftFreeSwin(arch=dict(TINY), attn_cfg=kernel, drop_path_rate=0.0).train()
    randomize_(a, std=0.2)
    b = SoftFreeSwin(arch=dict(TINY), attn_cfg=kernel, drop_path_rate=0.0).train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 45, 83)  # grids 12x21, 6x11, 3x6, 2x3: padded and shifted, then one-window stages
    outs_a = a(x)
    monkeypatch.setattr(swin_layers.SwinBlock, '_attend', _plain_attend)
    outs_b = b(x)
    g = [torch.randn_like(o) for o in outs_a]
    sum((o * gi).sum() for o, gi in zip(outs_a, g)).backward()
    sum((o * gi).sum() for o, gi in zip(outs_b, g)).backward()
    for oa, ob in zip(outs_a, outs_b):
        torch.testing.assert_close(oa, ob, atol=2e-5, rtol=1e-4)
    gb = dict(b.named_parameters())
    for n, p in a.named_parameters():
        if p.grad is None:
            assert gb[n].grad is None, n
            continue
        scale = float(gb[n].grad.abs().max())  # float sums in another order: differences relative to the largest
        assert float((p.grad - gb[n].grad).abs().max()) <= 1e-5 * scale + 1e-6, n


# ------------------------------------------------------------------------------------------- options
def test_frozen_stages_stay_frozen_and_in_eval_after_train():
    # as mmdet's SwinTransformer: a frozen stage takes the patch merging after it (ours: the next stage's first part)
    model = SoftFreeSwin(arch=dict(TINY), frozen_stages=2, drop_path_rate=0.1).train()
    frozen = [model.patch_embed, model.stages[0], model.stages[1], model.stages[2].downsample, model.norm0,
              model.norm1]
    for m in frozen:
        assert not m.training and all(not p.requires_grad for p in m.parameters())
    for m in (model.stages[2].blocks, model.stages[3], model.norm2, model.norm3):
        assert m.training and all(p.requires_grad for p in m.parameters())
    sum(o.sum() for o in model(torch.randn(1, 3, 64, 64))).backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())


def test_global_window_stage_uses_whole_grid_without_shift_or_padding():
    model = SoftFreeSwin(arch=dict(TINY), attn_cfg='linear', global_window=True).eval()
    seen = []
    model.stages[0].blocks[1].attn.kernel.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((args[0].shape, kwargs.get('hw'), kwargs.get('mask'))),
        with_kwargs=True)
    with torch.no_grad():
        model(torch.randn(1, 3, 67, 93))
    (shape, hw, mask), = seen
    assert shape == (1, 1, 17 * 24, 16) and hw == (17, 24) and mask is None


def test_get_layer_depth_matches_mmpretrain_swin_convention():
    from mmpretrain.models.backbones import SwinTransformer
    model = SoftFreeSwin(arch=dict(TINY))
    ref = types.SimpleNamespace(depths=model.depths)
    for name, _ in model.named_parameters():
        p = name.split('.')
        mm_name = name
        if p[0] == 'stages' and p[2] == 'downsample':  # mmpretrain keeps the merge at the end of stage i-1
            mm_name = '.'.join(['stages', str(int(p[1]) - 1)] + p[2:])
        assert model.get_layer_depth('backbone.' + name, 'backbone.') == \
            SwinTransformer.get_layer_depth(ref, 'backbone.' + mm_name, 'backbone.'), name
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (sum(TINY['depths']) + 1, sum(TINY['depths']) + 2)


def test_bad_arguments_raise_errors_naming_the_value_and_valid_choices():
    with pytest.raises(ValueError, match=r"unknown arch 'huge'; valid archs: tiny, small, base"):
        SoftFreeSwin(arch='huge')
    with pytest.raises(ValueError, match=r'attn_cfg is a list of 3 kernel configs but the model has 4 stages'):
        SoftFreeSwin(arch=dict(TINY), attn_cfg=['softmax'] * 3)
    with pytest.raises(KeyError, match=r"unknown attention type .*softmx.*; valid types: .*softmax"):
        SoftFreeSwin(arch=dict(TINY), attn_cfg='softmx')
    with pytest.raises(ValueError, match=r'global_window=\(True, False\) has 2 entries but the model has 4'):
        SoftFreeSwin(arch=dict(TINY), global_window=(True, False))
    with pytest.raises(ValueError, match=r'out_indices must be stage indices in \[0, 3\], got \(4,\)'):
        SoftFreeSwin(arch=dict(TINY), out_indices=(4,))
    with pytest.raises(TypeError, match=r'unexpected keyword argument'):
        SoftFreeSwin(arch=dict(TINY), windowsize=7)
    with pytest.raises(ValueError, match=r"downsample must be 'merge' \(Swin's\) or 'conv' \(PVTv2's\), got 'pool'"):
        SoftFreeSwin(arch=dict(TINY), downsample='pool')
    with pytest.raises(ValueError, match=r"mlp must be 'linear' \(Swin's\) or 'dwconv' \(PVTv2's\), got 'conv'"):
        SoftFreeSwin(arch=dict(TINY), mlp='conv')
    with pytest.raises(ValueError, match=r"mlp='dwconv' has no dropout .*drop_rate=0.1"):
        SoftFreeSwin(arch=dict(TINY), mlp='dwconv', drop_rate=0.1)


def test_pvtv2_convolutions_are_the_written_out_layers_and_the_default_is_swins_own():
    """downsample='conv' and mlp='dwconv' (ours, the study's windowed backbone) against the layers written out with
    the module's weights: LayerNorm(conv3x3 stride 2 pad 1) between stages, fc2(gelu(dwconv3x3(fc1(x)))) in every
    block; the defaults keep Swin's patch merging and MLP (the official parameter names, nothing else)."""
    default = SoftFreeSwin(arch=dict(TINY), drop_path_rate=0.0).state_dict()
    assert any(k.startswith('stages.1.downsample.reduction.') for k in default)
    assert not any('dwconv' in k or 'downsample.embed' in k for k in default)
    torch.manual_seed(0)
    plain = SoftFreeSwin(arch=dict(TINY), drop_path_rate=0.0)  # torch's conv init: |w| <= 1 / sqrt(fan_in)
    assert plain.patch_embed.proj.weight.abs().max() <= 48 ** -0.5
    for option in (dict(downsample='conv'), dict(mlp='dwconv')):  # either: PVTv2's init, normal(0, sqrt(2/fan_out))
        model = SoftFreeSwin(arch=dict(TINY), mlp_ratio=2.0, drop_path_rate=0.0, **option)
        convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        for conv in convs:
            fan_out = conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels // conv.groups
            assert conv.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.25), (option, conv)
            assert not conv.bias.any()
    model = SoftFreeSwin(arch=dict(TINY), downsample='conv', mlp='dwconv', mlp_ratio=2.0, drop_path_rate=0.0,
                         window_size=4).eval()
    randomize_(model)
    stage = model.stages[1]
    x = torch.randn(2, 7, 9, 16)  # odd sides: the grid halves rounded up, as patch merging pads
    conv = stage.downsample.embed.proj
    want = F.conv2d(x.permute(0, 3, 1, 2), conv.weight, conv.bias, stride=2, padding=1).permute(0, 2, 3, 1)
    want = F.layer_norm(want, (32,), stage.downsample.embed.norm.weight, stage.downsample.embed.norm.bias)
    got = stage.downsample(x)
    assert got.shape == (2, 4, 5, 32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    block = stage.blocks[1]
    mlp = block.mlp
    y = torch.randn(2, 4, 5, 32)
    h = F.linear(y, mlp.fc1.weight, mlp.fc1.bias).permute(0, 3, 1, 2)
    h = F.conv2d(h, mlp.dwconv.weight, mlp.dwconv.bias, padding=1, groups=64).permute(0, 2, 3, 1)
    want = F.linear(F.gelu(h), mlp.fc2.weight, mlp.fc2.bias)
    torch.testing.assert_close(block._mlp(y), want, rtol=1e-5, atol=1e-6)
    # the block uses it: its output moves when only the depthwise conv changes
    with torch.no_grad():
        before = model(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)))[-1]
        mlp.dwconv.weight.add_(0.5)
        after = model(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)))[-1]
    assert (before - after).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------- downstream
SWIN_BACKBONE = dict(type='SoftFreeSwin', arch=dict(TINY), attn_cfg='poly', drop_path_rate=0.1)


@pytest.mark.parametrize('runner', [run_mask_rcnn, run_upernet, run_classifier])
def test_downstream_model_trains_a_step_with_swin_backbone(runner):
    model = runner(dict(SWIN_BACKBONE), CHANNELS)
    assert type(model.backbone) is SoftFreeSwin
    grads = [p.grad for p in model.backbone.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_position_tied_kernel_fits_fixed_windows_but_is_refused_in_global_windows():
    """A synthesizer's logits are tied to positions up to max_len: fine in 7x7 windows (49 tokens), refused where
    the window is the whole, input-dependent stage grid."""
    model = SoftFreeSwin(arch=dict(TINY), attn_cfg=dict(type='synthesizer', max_len=49)).eval()
    with torch.no_grad():
        assert len(model(torch.randn(1, 3, 67, 93))) == 4
    with pytest.raises(ValueError, match=r"SoftFreeSwin: attention kernel 'synthesizer' cannot be used in stage 0 "
                                         r"\(global window\).*varies with the input size.*softmax"):
        SoftFreeSwin(arch=dict(TINY), attn_cfg='synthesizer', global_window=True)


@pytest.mark.parametrize('hw,window,shift', [((10, 16), 7, (3, 3)), ((5, 8), 7, (0, 3)), ((14, 7), 7, (0, 0)),
                                             ((9, 9), 9, (0, 0))])
def test_window_layout_gathers_as_pad_roll_partition_and_back_with_exact_gradients(hw, window, shift):
    from softfree_mm.models.utils.windows import WindowLayout
    b, c, (h, w) = 2, 3, hw
    hp, wp = -(-h // window) * window, -(-w // window) * window
    lay = WindowLayout(b, hw, (hp, wp), (window, window), shift, 'cpu')
    x = torch.randn(b, h, w, c, dtype=torch.double, requires_grad=True)
    fill = torch.randn(c, dtype=torch.double, requires_grad=True)
    # written out: pad with the fill row, roll, cut windows
    xp = fill.expand(b, hp, wp, c).clone()
    xp[:, :h, :w] = x
    xp = torch.roll(xp, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    ref = xp.reshape(b, hp // window, window, wp // window, window, c).transpose(2, 3).reshape(-1, window ** 2, c)
    win = lay.to_windows(x, fill=fill)
    assert torch.equal(win, ref)
    back = lay.from_windows(win * 2)
    assert torch.equal(back, 2 * x)
    real = torch.zeros(b, hp, wp, 1, dtype=torch.double)
    real[:, :h, :w] = 1
    real = torch.roll(real, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    real = real.reshape(b, hp // window, window, wp // window, window, 1).transpose(2, 3).reshape(-1, window ** 2, 1)
    torch.testing.assert_close(lay.window_means(x), (ref * real).sum(1) / real.sum(1).clamp_min(1))
    assert torch.autograd.gradcheck(lambda t, f: lay.to_windows(t, fill=f), (x, fill))
    assert torch.autograd.gradcheck(lambda t: lay.from_windows(t), (ref.detach().requires_grad_(),))
    assert torch.autograd.gradcheck(lambda t: lay.window_means(t), (x,))


def test_window_geometry_is_kept_across_passes_but_not_from_inference_mode():
    from softfree_mm.models.utils import windows as swin  # the geometries' cache
    model = SoftFreeSwin(arch=dict(TINY), drop_path_rate=0.0).train()
    x = torch.randn(1, 3, 45, 83)
    swin._GEOMETRIES.clear()
    with torch.inference_mode():
        model(x)
    assert not swin._GEOMETRIES  # inference tensors could not be saved for backward later
    sum(o.sum() for o in model(x)).backward()  # works after an inference-mode pass
    kept = dict(swin._GEOMETRIES)
    assert kept and all(isinstance(g, swin.WindowGeometry) for g in kept.values())
    model(x)
    assert all(swin._GEOMETRIES[k] is g for k, g in kept.items())  # the same objects: built once per grid


def test_the_windowed_grid_preset_tiles_its_grid_with_shifted_windows_and_no_stage_of_padding():
    """configs/demo/study_swin_digits.py (the warm-start grid's windowed layout) at the digits' 64 px: stage 1 a 16x16
    grid in 4 x 4 windows of 4x4, stage 2 8x8 in 2 x 2, both with shifted blocks (rolled by 2) and no padding; stage 3
    one 4x4 window (no shift, no padding); stage 4 its whole 2x2 grid."""
    import os.path as osp

    from mmengine.config import Config

    from softfree_mm.models.backbones.swin_layers import SwinBlock
    from tests.helpers.models import build_in
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    cfg = Config.fromfile(osp.join(root, 'configs', 'demo', 'study_swin_digits.py'))
    assert cfg.img_size == 64
    backbone = dict(cfg.model.backbone.to_dict(), init_cfg=None)
    model = build_in('softfree_mm', backbone).eval()
    seen = []

    def hook(module, args, kwargs, output):
        geo = args[1] if len(args) > 1 else kwargs['geo']
        seen.append((geo.hw, geo.window, geo.padded, geo.shift if module.shifted else (0, 0)))
    blocks = [m for m in model.modules() if isinstance(m, SwinBlock)]
    handles = [b.register_forward_hook(hook, with_kwargs=True) for b in blocks]
    with torch.no_grad():
        model(torch.randn(1, 3, cfg.img_size, cfg.img_size))
    for h in handles:
        h.remove()
    assert seen == [((16, 16), (4, 4), (16, 16), (0, 0)), ((16, 16), (4, 4), (16, 16), (2, 2)),
                    ((8, 8), (4, 4), (8, 8), (0, 0)), ((8, 8), (4, 4), (8, 8), (2, 2)),
                    ((4, 4), (4, 4), (4, 4), (0, 0)), ((4, 4), (4, 4), (4, 4), (0, 0)),
                    ((2, 2), (2, 2), (2, 2), (0, 0)), ((2, 2), (2, 2), (2, 2), (0, 0))], seen
    # windows per side in the shifted stages: 4 and 2; the shifted blocks mask what the roll joins
    assert [g[0][0] // g[1][0] for g in seen[:4:2]] == [4, 2]
