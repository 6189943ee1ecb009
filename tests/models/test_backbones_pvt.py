"""SoftFreePVT (v1) and SoftFreePVTv2: kernels in spatial-reduction attention, strides, parity, conversion, use."""
import pytest
import torch
import torch.nn.functional as F

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.attention import kernel_class, kernel_arguments, list_attentions
from softfree_mm.models.backbones.pvt import SoftFreePVT, SoftFreePVTv2
from softfree_mm.models.backbones.pvt_convert import convert_pvt, convert_pvt_v2

from tests.helpers.models import build_in, run_classifier, run_mask_rcnn, run_upernet, strided_shapes

KERNELS = list_attentions()
SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
# the families' tiny presets without their arch (the tests pick it): heads 1-2-5-8 of the presets, 16/8/8/8 channels
TINY = {k: v for k, v in SoftFreePVT.family.tiny.items() if k != 'arch'}
assert TINY == {k: v for k, v in SoftFreePVTv2.family.tiny.items() if k != 'arch'}
CHANNELS = TINY['embed_dims']


def kernel_cfg(name, tokens):
    """The kernel's default config; a length-limited kernel gets a max_len covering ``tokens``."""
    if 'max_len' in kernel_arguments(name):  # synthesizer: mix in q.k scores so q and k feed the output too
        return dict(type=name, max_len=tokens, mix=True)
    return dict(type=name)


def needs_grid(cfg):
    from softfree_mm.attention import build_attention
    return build_attention(cfg, num_heads=1, head_dim=16).needs_hw


# ------------------------------------------------------------------------------------------- every kernel
@pytest.mark.parametrize('variant', ['v1_sra', 'v2_no_sr'])
@pytest.mark.parametrize('kernel', KERNELS)
def test_every_kernel_in_all_registries_gives_strided_maps_finite_grads_and_bf16(kernel, variant):
    """v1 with its spatial reduction (a kernel that needs a shared grid: refusal asserted, then run without
    reduction), v2 in the InLine set-up sr_ratios=(1, 1, 1, 1)."""
    h, w = 67, 93
    cls = SoftFreePVT if variant == 'v1_sra' else SoftFreePVTv2
    cfg = dict(type=cls.__name__, attn_cfg=kernel_cfg(kernel, 17 * 24), **TINY)
    if kernel_class(kernel).fixed_length:  # global attention: the token count varies with the input size
        with pytest.raises(ValueError, match=rf"{cls.__name__}: attention kernel '{kernel}' cannot be used in "
                                             r"stage 0.*varies with the input size"):
            build_in('mmdet', dict(cfg))
        pytest.skip(f'{kernel}: tied to fixed positions, refused in global attention (refusal asserted)')
    if variant == 'v2_no_sr':
        cfg['sr_ratios'] = (1, 1, 1, 1)
    elif needs_grid(cfg['attn_cfg']):
        with pytest.raises(ValueError, match=rf"SoftFreePVT: attention kernel '{kernel}' .*sr_ratios=\(1, 1, 1, 1\)"):
            SoftFreePVT(**{k: v for k, v in cfg.items() if k != 'type'})
        cfg['sr_ratios'] = (1, 1, 1, 1)
    models = [build_in(scope, dict(cfg)) for scope in SCOPES]
    assert all(type(m) is cls for m in models)
    model = models[0].train()
    x = torch.randn(1, 3, h, w)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == strided_shapes(1, CHANNELS, h, w)
    sum(o.square().mean() for o in outs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        assert all(torch.isfinite(o.float()).all() for o in model(x))


@pytest.mark.parametrize('arch', ['b0', 'b2_li'])
def test_kernels_needing_a_shared_grid_are_refused_under_reduction_and_the_rest_build(arch):
    for kernel in KERNELS:
        cfg = kernel_cfg(kernel, 64)
        if kernel_class(kernel).fixed_length:
            with pytest.raises(ValueError, match=rf"attention kernel '{kernel}'.*varies with the input size"):
                SoftFreePVTv2(arch=arch, attn_cfg=cfg, **TINY)
        elif needs_grid(cfg):
            fix = 'non-li arch with sr_ratios' if arch == 'b2_li' else r'set sr_ratios=\(1, 1, 1, 1\)'
            with pytest.raises(ValueError, match=rf"SoftFreePVTv2: attention kernel '{kernel}' cannot be used in "
                                                 rf'stage 0 .*{fix}'):
                SoftFreePVTv2(arch=arch, attn_cfg=cfg, **TINY)
        else:
            assert isinstance(SoftFreePVTv2(arch=arch, attn_cfg=cfg, **TINY), SoftFreePVTv2)


def test_inline_set_up_hands_the_kernel_the_shared_grid_and_sra_hands_none():
    seen = []
    model = SoftFreePVTv2(sr_ratios=(1, 1, 2, 1), attn_cfg='softmax', **TINY)
    for i in range(4):
        model.stages[i].blocks[0].attn.kernel.register_forward_hook(
            lambda m, args, kwargs, out: seen.append(kwargs['hw']), with_kwargs=True)
    model(torch.randn(1, 3, 67, 93))
    assert seen == [(17, 24), (9, 12), None, (3, 3)]


def test_sra_with_softmax_equals_a_direct_formula():
    """q from every token, k/v from conv(kernel=stride=sr) + LayerNorm of the grid, softmax(q k^T / sqrt(d)) v."""
    torch.manual_seed(0)
    model = SoftFreePVT(**TINY).eval()
    attn = model.stages[1].blocks[0].attn  # 2 heads of 16, sr 4
    x, (hh, ww) = torch.randn(2, 9 * 12, 32), (9, 12)
    q = attn.q(x).reshape(2, -1, 2, 16).transpose(1, 2)
    y = attn.sr(x.transpose(1, 2).reshape(2, 32, hh, ww))
    assert y.shape[-2:] == (2, 3)  # floor, as the official code
    y = attn.norm(y.flatten(2).transpose(1, 2))
    k, v = attn.kv(y).reshape(2, -1, 2, 2, 16).permute(2, 0, 3, 1, 4)
    a = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)
    ref = attn.proj((a @ v).transpose(1, 2).reshape(2, -1, 32))
    torch.testing.assert_close(attn(x, (hh, ww)), ref, rtol=1e-5, atol=1e-5)


def test_full_presets_have_the_official_channels_heads_and_reductions():
    v1 = SoftFreePVT(arch='tiny')
    assert v1.out_channels == v1.num_features == (64, 128, 320, 512) and v1.depths == (2, 2, 2, 2)
    assert [s.blocks[0].attn.num_heads for s in v1.stages] == [1, 2, 5, 8]
    assert [s.blocks[0].attn.sr.kernel_size[0] if s.blocks[0].attn.sr is not None else 1 for s in v1.stages] == \
        [8, 4, 2, 1]
    assert [s.blocks[0].mlp.fc1.out_features // d for s, d in zip(v1.stages, v1.embed_dims)] == [8, 8, 4, 4]
    assert [tuple(s.pos_embed.shape) for s in v1.stages] == [(1, 56 * 56, 64), (1, 28 * 28, 128),
                                                            (1, 14 * 14, 320), (1, 49, 512)]
    sizes = {'tiny': (2, 2, 2, 2), 'small': (3, 4, 6, 3), 'medium': (3, 4, 18, 3), 'large': (3, 8, 27, 3)}
    assert {a: SoftFreePVT.arch_zoo[a]['depths'] for a in SoftFreePVT.arch_zoo} == \
        dict(sizes, **{'inline_' + k: v for k, v in sizes.items()},
             **{f'agent_{k}{tail}': sizes[k] for k in ('tiny', 'small') for tail in ('', '_downstream')})
    for size in sizes:  # the official InLine-PVT models: heads 2-4-10-16, no spatial reduction, InLine everywhere
        preset = SoftFreePVT.arch_zoo['inline_' + size]
        assert preset['num_heads'] == (2, 4, 10, 16) and preset['sr_ratios'] == (1, 1, 1, 1)
        assert preset['attn_cfg'] == 'inline' and preset['mlp_ratios'] == (8, 8, 4, 4)
    b0 = SoftFreePVTv2(arch='b0')
    assert b0.out_channels == (32, 64, 160, 256)
    zoo = SoftFreePVTv2.arch_zoo
    assert zoo['b5']['depths'] == (3, 6, 40, 3) and zoo['b5']['mlp_ratios'] == (4, 4, 4, 4)
    assert zoo['b2_li'].get('linear') and zoo['b2_li']['depths'] == (3, 4, 6, 3)


def test_smoke_smallest_preset_at_200x333_gives_strides_4_8_16_32():
    model = SoftFreePVTv2(arch='b0', attn_cfg='poly').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 200, 333))
    assert [tuple(o.shape) for o in outs] == strided_shapes(1, (32, 64, 160, 256), 200, 333)


# ------------------------------------------------------------------------------------------- padding
def test_v1_pads_only_bottom_right_with_zeros_so_no_token_is_pure_padding():
    """67x93 -> grid ceil(./4): the embedding equals that of the explicitly zero-padded 68x96 image, and every
    token covers real pixels (nonzero gradient from the image)."""
    model = SoftFreePVT(**TINY).eval()
    x = torch.randn(1, 3, 67, 93, requires_grad=True)
    tok, hw = model.stages[0].patch_embed(x)
    ref, hw_ref = model.stages[0].patch_embed(F.pad(x, (0, 3, 0, 1)))
    assert hw == hw_ref == (17, 24)
    torch.testing.assert_close(tok, ref)
    (g,) = torch.autograd.grad(tok.sum(-1)[0, -1], x)  # the bottom-right token
    assert g[..., 64:, 92:].abs().sum() > 0


def test_v1_positions_are_the_table_at_the_pretrain_grid_and_bilinear_elsewhere():
    stage = SoftFreePVT(**TINY).stages[0]
    assert stage.positions((56, 56)) is stage.pos_embed
    table = stage.pos_embed.reshape(1, 56, 56, 16).permute(0, 3, 1, 2)
    ref = F.interpolate(table, size=(17, 24), mode='bilinear', align_corners=False).flatten(2).transpose(1, 2)
    torch.testing.assert_close(stage.positions((17, 24)), ref)


# ------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize('variant,size', [('pvt_v2_b0', (224, 224)), ('pvt_v2_b2_li', (67, 93))])
def test_softmax_pvt_v2_equals_timm_four_stages_with_converted_weights(variant, size):
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    kw = {} if variant == 'pvt_v2_b0' else dict(depths=(1, 1, 1, 1))
    ref = timm.create_model(variant, pretrained=False, **kw).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for name, p in ref.named_parameters():
            if 'norm' in name:
                p.normal_(1.0 if name.endswith('weight') else 0.0, 0.1)
    ours = SoftFreePVTv2(arch=variant[len('pvt_v2_'):], **kw).eval()
    ours.load_state_dict(convert_pvt_v2(ref.state_dict()), strict=True)
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        outs = ours(x)
        inter = ref.forward_intermediates(x, intermediates_only=True)
    for o, r in zip(outs, inter):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------- conversion
def _official_names(sd, version):
    """Our layout -> the official release's names (whai362/PVT): patch_embed{s}, pos_embed{s}, block{s}.{j},
    norm{s} (v2) and v2's mlp.dwconv.dwconv; v1's classification extras cls_token, norm, head and a class row."""
    out = {}
    for k, v in sd.items():
        parts = k.split('.')
        s, rest = int(parts[1]) + 1, parts[2:]
        if rest[0] == 'patch_embed':
            out[f'patch_embed{s}.' + '.'.join(rest[1:])] = v
        elif rest[0] == 'pos_embed':
            out[f'pos_embed{s}'] = torch.cat([torch.randn(1, 1, v.shape[-1]), v], 1) if s == 4 else v
        elif rest[0] == 'blocks':
            tail = '.'.join(rest[2:]).replace('mlp.dwconv.', 'mlp.dwconv.dwconv.')
            out[f'block{s}.{rest[1]}.{tail}'] = v
        elif rest[0] == 'norm':
            out[f'norm{s}.' + '.'.join(rest[1:])] = v
        else:
            raise AssertionError(k)
    if version == 1:
        c = sd['stages.3.patch_embed.norm.weight'].shape[0]
        out.update({'cls_token': torch.zeros(1, 1, c), 'norm.weight': torch.ones(c), 'norm.bias': torch.zeros(c)})
    out.update({'head.weight': torch.randn(10, 8), 'head.bias': torch.randn(10)})
    return out


@pytest.mark.parametrize('version', [1, 2])
def test_convert_maps_the_official_release_layout_to_ours_and_is_idempotent(version):
    model = (SoftFreePVT if version == 1 else SoftFreePVTv2)(**TINY)
    convert = convert_pvt if version == 1 else convert_pvt_v2
    sd = model.state_dict()
    official = _official_names(sd, version)
    assert ('pos_embed4' in official) == (version == 1)
    if version == 1:
        assert official['pos_embed4'].shape[1] == 50 and 'block1.0.attn.sr.weight' in official
    else:
        assert 'block1.0.mlp.dwconv.dwconv.weight' in official and 'norm4.weight' in official
    converted = convert(official)
    assert set(converted) == set(sd)
    assert all(torch.equal(converted[k], sd[k]) for k in sd)
    again = convert(converted)
    assert all(torch.equal(again[k], sd[k]) for k in sd)


def test_pretrained_init_cfg_loads_an_official_v2_checkpoint_through_the_converter(tmp_path):
    src = SoftFreePVTv2(**TINY)
    path = str(tmp_path / 'pvt_v2.pth')
    torch.save(_official_names(src.state_dict(), 2), path)
    dst = SoftFreePVTv2(init_cfg=dict(type='Pretrained', checkpoint=path), **TINY)
    dst.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k


# ------------------------------------------------------------------------------------------- training helpers
def test_frozen_stages_stay_frozen_and_in_eval_after_train():
    model = SoftFreePVT(frozen_stages=2, **TINY).train()
    for i, stage in enumerate(model.stages):
        assert all(p.requires_grad == (i >= 2) for p in stage.parameters())
        assert all(m.training == (i >= 2) for m in stage.modules())


def test_get_layer_depth_matches_mmpretrain_swin_convention():
    from mmpretrain.models.backbones import SwinTransformer
    model = SoftFreePVTv2(depths=(2, 2, 2, 2), embed_dims=(16, 32, 40, 64))
    swin = SwinTransformer(arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]), img_size=64)
    pairs = [('stages.0.patch_embed.proj.weight', 'patch_embed.projection.weight'),
             ('stages.0.blocks.1.attn.q.weight', 'stages.0.blocks.1.attn.w_msa.qkv.weight'),
             ('stages.2.blocks.0.mlp.fc1.weight', 'stages.2.blocks.0.ffn.layers.0.0.weight'),
             ('stages.1.norm.weight', 'stages.1.downsample.norm.weight'),
             ('stages.2.patch_embed.proj.weight', 'stages.1.downsample.reduction.weight')]
    for ours, theirs in pairs:
        assert model.get_layer_depth('backbone.' + ours, 'backbone.') == \
            swin.get_layer_depth('backbone.' + theirs, 'backbone.'), ours
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (9, 10)


def test_bad_arguments_raise_errors_naming_the_value_and_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown arch 'b9'; valid archs: b0, b1, b2, b3, b4, b5, b2_li"):
        SoftFreePVTv2(arch='b9')
    with pytest.raises(ValueError, match=r"unknown arch 'huge'; valid archs: tiny, small, medium, large"):
        SoftFreePVT(arch='huge')
    with pytest.raises(ValueError, match=r'list of 3 kernel configs but the model has 4 stages'):
        SoftFreePVT(attn_cfg=['poly'] * 3, **TINY)
    with pytest.raises(ValueError, match=r"SoftFreePVTv2: attention kernel 'inline' cannot be used in stage 0 "
                                         r'with spatial reduction sr_ratio=8.*sr_ratios=\(1, 1, 1, 1\)'):
        SoftFreePVTv2(attn_cfg='inline', **TINY)
    with pytest.raises(ValueError, match=r'sr_ratios must have 4 entries'):
        SoftFreePVT(sr_ratios=(1, 1, 1), **TINY)
    with pytest.raises(ValueError, match=r'out_indices must be stage indices in \[0, 3\], got \(4,\)'):
        SoftFreePVT(out_indices=(4,), **TINY)
    with pytest.raises(ValueError, match=r'SoftFreePVT: these arguments have no meaning here: '
                                         r'use_abs_pos_embed=False \(this model has True\)'):
        SoftFreePVT(use_abs_pos_embed=False, **TINY)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'embed_dim'"):
        SoftFreePVT(embed_dim=64)


# ------------------------------------------------------------------------------------------- downstream
@pytest.mark.parametrize('runner,backbone', [
    (run_mask_rcnn, dict(type='SoftFreePVTv2', attn_cfg='poly', **TINY)),
    (run_upernet, dict(type='SoftFreePVT', attn_cfg='linear', **TINY)),
    (run_classifier, dict(type='SoftFreePVTv2', arch='b2_li', attn_cfg='poly', **TINY)),
], ids=['mask_rcnn_pvt_v2', 'upernet_pvt_v1', 'classifier_pvt_v2_li'])
def test_downstream_model_trains_a_step_with_pvt_backbone(runner, backbone):
    model = runner(backbone, CHANNELS)
    assert type(model.backbone).__name__ == backbone['type']
    for name, p in model.backbone.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
