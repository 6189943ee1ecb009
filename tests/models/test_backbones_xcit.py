"""SoftFreeXCiT: kernels inside cross-covariance attention, strides, parity with timm, conversion, downstream use."""
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.attention import build_attention, kernel_class, list_attentions
from softfree_mm.models.backbones.xcit import XCA, BlockDeconv, SoftFreeXCiT
from softfree_mm.models.backbones.xcit_convert import convert_xcit

from tests.helpers.models import build_in, run_classifier, run_mask_rcnn, run_upernet

KERNELS = list_attentions()
BN = dict(type='BN')
# tiny: 4 blocks, 4 heads of 8 channels; every block feeds one output
TINY = SoftFreeXCiT.family.tiny  # t12 at width 32, depth 4, four outputs, BatchNorm
SCOPES = ('mmdet', 'mmseg', 'mmpretrain')


def expected_shapes(b, c, h, w, patch=16):
    """ceil(H / s) x ceil(W / s) at strides 4, 8, 16, 32, like every other backbone, for either patch size."""
    return [(b, c, math.ceil(h / s), math.ceil(w / s)) for s in (4, 8, 16, 32)]


@pytest.mark.parametrize('patch', [16, 8])
@pytest.mark.parametrize('hw', [(33, 47), (41, 77), (64, 96)])
def test_outputs_are_ceil_size_at_each_stride_and_crop_only_past_the_image(patch, hw):
    """At sizes that are not multiples of the patch, the upsampled levels are cropped to ceil(H / s): the rows kept
    equal the uncropped adapter's (the crop removes only cells past the image)."""
    torch.manual_seed(0)
    model = SoftFreeXCiT(arch='t12', embed_dims=32, num_heads=4, depth=4, out_indices=(0, 1, 2, 3), patch_size=patch,
                         norm_cfg=dict(type='BN')).eval()
    x = torch.randn(1, 3, *hw)
    uncropped = []
    hooks = [getattr(model, f'fpn{i}').register_forward_hook(lambda m, i, o: uncropped.append(o)) for i in (1, 2, 3, 4)]
    with torch.no_grad():
        outs = model(x)
    for h in hooks:
        h.remove()
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, 32, *hw)
    for o, f in zip(outs, uncropped):
        torch.testing.assert_close(o, f[..., :o.shape[-2], :o.shape[-1]], rtol=0, atol=0)


def refuses_xca(name):
    """A kernel XCA must refuse: it needs a grid, or it cannot be built without a fixed head_dim."""
    if kernel_class(name).needs_hw:
        return True
    try:
        build_attention(name, num_heads=4, head_dim=None)
    except (ValueError, TypeError):
        return True
    return False


# ------------------------------------------------------------------------------------------- every kernel
@pytest.mark.parametrize('kernel', KERNELS)
def test_every_kernel_in_all_registries_gives_strided_maps_finite_grads_and_bf16(kernel):
    # the synthesizer's random logits ignore q.k (and so the temperature) unless mixed with the dot product
    attn = dict(type=kernel, mix=True) if kernel == 'synthesizer' else kernel
    cfg = dict(type='SoftFreeXCiT', attn_cfg=attn, drop_path_rate=0.1, **TINY)
    if refuses_xca(kernel):
        for scope in SCOPES:
            with pytest.raises(ValueError, match=rf"SoftFreeXCiT: attention kernel '{kernel}'"):
                build_in(scope, dict(cfg))
        pytest.skip(f'{kernel}: refused by XCA (needs a token grid or a fixed head_dim); refusal asserted')
    models = [build_in(scope, dict(cfg)) for scope in SCOPES]
    assert all(type(m) is SoftFreeXCiT for m in models)
    model = models[0].train()
    x = torch.randn(1, 3, 67, 93)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, 32, 67, 93)
    sum(o.square().mean() for o in outs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        assert all(torch.isfinite(o.float()).all() for o in model(x))


def test_synthesizer_random_mode_fits_xca_when_max_len_covers_the_head_channels():
    model = SoftFreeXCiT(attn_cfg=dict(type='synthesizer', mode='random', max_len=8), **TINY)
    assert len(model(torch.randn(1, 3, 64, 64))) == 4


def test_grid_kernel_is_refused_with_an_error_naming_xcit_the_kernel_and_the_fit():
    with pytest.raises(ValueError, match=r"SoftFreeXCiT: attention kernel 'inline' cannot be used in layer 0 "
                                         r'\(cross-covariance attention\): '):
        SoftFreeXCiT(attn_cfg='inline', **TINY)
    # the same kernel without its grid-based local residual needs no grid and fits XCA
    model = SoftFreeXCiT(attn_cfg=dict(type='inline', local_residual=False), **TINY)
    assert not model.blocks[0].attn.kernel.needs_hw


def test_xca_hands_the_kernel_channels_as_tokens_with_the_temperature_as_scale():
    """poly p=3 over channels: A = (t * q^ k^T)^3 / sqrt(d_h), q^ k^ L2-normalised over the N tokens."""
    torch.manual_seed(0)
    xca = XCA(32, 4, dict(type='poly', degree=3), where='test')
    with torch.no_grad():
        xca.temperature.copy_(torch.tensor([0.5, 1.0, 2.0, 3.0]).view(4, 1, 1))
    x = torch.randn(2, 10, 32)
    qkv = xca.qkv(x).reshape(2, 10, 3, 4, 8).permute(2, 0, 3, 4, 1)
    q, k, v = F.normalize(qkv[0], dim=-1), F.normalize(qkv[1], dim=-1), qkv[2]
    a = (q @ k.transpose(-2, -1) * xca.temperature) ** 3 / math.sqrt(8)
    ref = xca.proj((a @ v).permute(0, 3, 1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(xca(x), ref, rtol=1e-5, atol=1e-5)


def test_full_presets_have_the_official_widths_depths_and_layer_scale():
    t12 = SoftFreeXCiT(arch='t12', norm_cfg=BN)
    assert t12.out_channels == t12.num_features == (192,) * 4 and t12.out_indices == (3, 5, 7, 11)
    assert len(t12.blocks) == 12 and t12.blocks[0].attn.num_heads == 4 and t12.blocks[0].attn.head_channels == 48
    assert torch.all(t12.blocks[0].gamma1 == 1.0)
    zoo = SoftFreeXCiT.arch_zoo
    assert [(zoo[a]['embed_dims'], zoo[a]['depth'], zoo[a]['num_heads'], zoo[a]['eta']) for a in zoo] == [
        (192, 12, 4, 1.0), (384, 12, 8, 1.0), (384, 24, 8, 1e-5), (512, 24, 8, 1e-5)]
    # a 24-layer preset (narrowed to keep the test light) takes the 24-layer detection blocks and eta
    s24 = SoftFreeXCiT(arch='s24', embed_dims=32, norm_cfg=BN)
    assert s24.out_indices == (7, 11, 15, 23) and len(s24.blocks) == 24
    assert torch.all(s24.blocks[0].gamma1 == 1e-5)
    sync = SoftFreeXCiT(**dict(TINY, norm_cfg=dict(type='SyncBN')))
    assert isinstance(sync.blocks[0].local_mp.bn, torch.nn.SyncBatchNorm)
    assert inspect.signature(SoftFreeXCiT).parameters['norm_cfg'].default['type'] == 'SyncBN'  # official det


def test_smoke_smallest_preset_at_200x333_gives_strides_4_8_16_32():
    model = SoftFreeXCiT(arch='t12', norm_cfg=BN, attn_cfg='poly').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 200, 333))
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, 192, 200, 333)


def test_patch8_adapter_gives_strides_4_8_16_32():
    model = SoftFreeXCiT(patch_size=8, **TINY).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 67, 93))
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, 32, 67, 93, patch=8)


@pytest.mark.parametrize('kernel, stride, bias, batch, channels_last', [
    (2, 2, True, 1, False), (2, 2, True, 2, True), (2, 2, False, 2, False), (3, 3, True, 1, False),
    (3, 2, True, 1, True)])
def test_block_deconv_equals_conv_transpose_and_returns_contiguous_nchw(kernel, stride, bias, batch, channels_last):
    """the adapter's matrix-product form of a kernel == stride transposed conv (and the fallback of an overlapping
    kernel) against torch's ConvTranspose2d with the same weights: outputs, input / weight / bias gradients, and an
    NCHW-contiguous output, also from a channels-last input (mmcv's CPU RoIAlign reads its input as NCHW)"""
    torch.manual_seed(0)
    ours = BlockDeconv(6, 5, kernel, stride=stride, bias=bias)
    ref = torch.nn.ConvTranspose2d(6, 5, kernel, stride=stride, bias=bias)
    ref.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    x = torch.randn(batch, 6, 5, 7)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    kept = set()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.add(t.untyped_storage().data_ptr()) or t,
                                                  lambda t: t):
        out = ours(xo)
    want = ref(xr)
    if kernel == stride:  # autograd keeps the input itself (NCHW or channels-last), never a copy of it
        assert kept <= {xo.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in ours.parameters()}
    # the matrix-product form returns NCHW memory; the fallback whatever torch's layer returns
    assert out.is_contiguous() if kernel == stride else out.stride() == want.stride()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(want)
    (out * g).sum().backward()
    (want * g).sum().backward()
    torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-5, atol=1e-5)
    for po, pr in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(po.grad, pr.grad, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------- padding
def test_no_pad_tokens_every_token_sees_real_pixels_and_odd_grids_keep_their_last_row():
    """The conv stem maps H to ceil(H/16) without padding the image: every token's receptive field holds real
    pixels (nonzero gradient from the image), and the stride-32 pool keeps the odd grid's last row/column."""
    model = SoftFreeXCiT(**TINY).eval()
    x = torch.randn(1, 3, 67, 93, requires_grad=True)
    tokens, hw = model.patch_embed(x)
    assert hw == (5, 6)
    for t in range(tokens.shape[1]):
        (g,) = torch.autograd.grad(tokens[0, t].sum(), x, retain_graph=True)
        assert g.abs().sum() > 0, t
    with torch.no_grad():
        feats = []
        hook = model.blocks[3].register_forward_hook(lambda m, a, o: feats.append(o))
        outs = model(x)
        hook.remove()
    grid = feats[0].transpose(1, 2).reshape(1, 32, 5, 6)
    torch.testing.assert_close(outs[3][..., 2, 2], grid[..., 4:, 4:].amax(dim=(-1, -2)))


# ------------------------------------------------------------------------------------------- parity
def _timm_pair(variant, **kw):
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    ref = timm.create_model(variant, pretrained=False, embed_dim=64, num_heads=4).eval()
    with torch.no_grad():  # non-trivial BN statistics and LayerScale
        for name, buf in ref.named_buffers():
            if name.endswith('running_mean'):
                buf.normal_(0, 0.1)
            elif name.endswith('running_var'):
                buf.uniform_(0.5, 1.5)
        for name, p in ref.named_parameters():
            if 'gamma' in name or 'temperature' in name:
                p.uniform_(0.5, 1.5)
    ours = SoftFreeXCiT(embed_dims=64, num_heads=4, norm_cfg=BN, **kw).eval()
    return ref, ours


def test_softmax_xcit_p16_equals_timm_blocks_7_and_11_with_converted_weights():
    ref, ours = _timm_pair('xcit_small_12_p16_224', arch='s12')
    missing, unexpected = ours.load_state_dict(convert_xcit(ref.state_dict()), strict=False)
    assert all(k.startswith('fpn') for k in missing)
    assert all(k.startswith(('cls_attn_blocks', 'cls_token', 'norm.')) for k in unexpected)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        outs = ours(x)
        inter = ref.forward_intermediates(x, indices=[7, 11], intermediates_only=True)
    torch.testing.assert_close(outs[2], inter[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[3], F.max_pool2d(inter[1], 2), rtol=1e-4, atol=1e-4)


def test_softmax_xcit_p8_equals_timm_block_5_and_max_pools_of_blocks_7_and_11():
    """Patch 8: stride 8 is block 5 itself, strides 16 and 32 the 2x2 and 4x4 MAX pools of blocks 7 and 11 (the
    official adapter; an average pool would not match)."""
    ref, ours = _timm_pair('xcit_tiny_12_p8_224', arch='t12', patch_size=8)
    ours.load_state_dict(convert_xcit(ref.state_dict()), strict=False)
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        b5, b7, b11 = ref.forward_intermediates(x, indices=[5, 7, 11], intermediates_only=True)
        outs = ours(x)
    torch.testing.assert_close(outs[1], b5, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[2], F.max_pool2d(b7, 2), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[3], F.max_pool2d(b11, 4), rtol=1e-4, atol=1e-4)
    assert (F.avg_pool2d(b11, 4) - outs[3]).abs().max() > 0.1  # the two pools differ on these features


def test_cls_token_mode_equals_timm_class_token_and_loads_strictly():
    ref, ours = _timm_pair('xcit_small_12_p16_224', arch='s12', out_type='cls_token')
    ours.load_state_dict(convert_xcit(ref.state_dict()), strict=True)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        (cls,) = ours(x)
        torch.testing.assert_close(cls, ref.forward_features(x)[:, 0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------- conversion
def _official_from_ours(sd):
    """Our (= timm) layout -> the official release's names: pos_embeder, fused class-attention qkv, a head."""
    out = {}
    for k, v in sd.items():
        if k.startswith('pos_embed.'):
            out['pos_embeder.' + k[len('pos_embed.'):]] = v
        elif k.startswith('cls_attn_blocks.') and '.attn.q.' in k:
            pre, suf = k.split('.attn.q.')
            out[f'{pre}.attn.qkv.{suf}'] = torch.cat([v, sd[f'{pre}.attn.k.{suf}'], sd[f'{pre}.attn.v.{suf}']])
        elif k.startswith('cls_attn_blocks.') and ('.attn.k.' in k or '.attn.v.' in k):
            continue
        else:
            out[k] = v
    out['head.weight'], out['head.bias'] = torch.randn(10, 32), torch.randn(10)
    return out


def test_convert_xcit_maps_the_official_layout_to_ours_and_is_idempotent():
    ours = SoftFreeXCiT(out_type='cls_token', **TINY)
    sd = ours.state_dict()
    official = _official_from_ours(sd)
    assert 'cls_attn_blocks.0.attn.qkv.weight' in official and 'pos_embeder.token_projection.weight' in official
    converted = convert_xcit(official)
    assert set(converted) == set(sd)
    assert all(torch.equal(converted[k], sd[k]) for k in sd)
    again = convert_xcit(converted)
    assert all(torch.equal(again[k], sd[k]) for k in sd)


def test_pretrained_init_cfg_loads_a_timm_layout_checkpoint(tmp_path):
    src = SoftFreeXCiT(**TINY)
    path = str(tmp_path / 'xcit.pth')
    torch.save({'state_dict': {'backbone.' + k: v for k, v in src.state_dict().items()}}, path)
    dst = SoftFreeXCiT(init_cfg=dict(type='Pretrained', checkpoint=path), **TINY)
    dst.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k


# ------------------------------------------------------------------------------------------- training helpers
def test_frozen_stages_freeze_stem_and_first_blocks_and_stay_in_eval_after_train():
    model = SoftFreeXCiT(frozen_stages=2, **TINY).train()
    frozen = [model.patch_embed, model.pos_embed, model.blocks[0], model.blocks[1]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(not m.training for f in frozen for m in f.modules())
    assert all(p.requires_grad for p in model.blocks[2].parameters()) and model.blocks[2].training


def test_get_layer_depth_follows_mmpretrain_vision_transformer_convention():
    from mmpretrain.models.backbones import VisionTransformer
    model = SoftFreeXCiT(**TINY)
    vit = VisionTransformer(arch=dict(embed_dims=32, num_layers=4, num_heads=4, feedforward_channels=64),
                            img_size=32, patch_size=16)
    pairs = [('patch_embed.proj.0.0.weight', 'patch_embed.projection.weight'), ('pos_embed.token_projection.weight',
             'pos_embed'), ('blocks.0.attn.qkv.weight', 'layers.0.attn.qkv.weight'),
             ('blocks.3.gamma1', 'layers.3.ln1.weight'), ('fpn1.0.weight', 'ln1.weight')]
    for ours, theirs in pairs:
        assert model.get_layer_depth('backbone.' + ours, 'backbone.') == \
            vit.get_layer_depth('backbone.' + theirs, 'backbone.'), ours
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (5, 6)


def test_bad_arguments_raise_errors_naming_the_value_and_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown arch 'xl'; valid archs: t12, s12, s24, m24"):
        SoftFreeXCiT(arch='xl')
    with pytest.raises(ValueError, match=r'list of 3 kernel configs but the model has 4 layers'):
        SoftFreeXCiT(attn_cfg=['poly'] * 3, **TINY)
    with pytest.raises(ValueError, match=r'patch_size must be 16 or 8, got 14'):
        SoftFreeXCiT(patch_size=14, **TINY)
    with pytest.raises(ValueError, match=r"unknown out_type 'raw'; valid: featmap, cls_token"):
        SoftFreeXCiT(out_type='raw', **TINY)
    with pytest.raises(ValueError, match=r'out_indices must be four increasing block indices in \[0, 3\]'):
        SoftFreeXCiT(**dict(TINY, out_indices=(0, 1, 2, 7)))
    with pytest.raises(KeyError, match=r"unknown attention type .*polly.*valid types: .*poly"):
        SoftFreeXCiT(attn_cfg='polly', **TINY)
    with pytest.raises(TypeError, match=r'unexpected keyword argument'):
        SoftFreeXCiT(windowsize=7, **TINY)


# ------------------------------------------------------------------------------------------- downstream
BACKBONE = dict(type='SoftFreeXCiT', attn_cfg='poly', drop_path_rate=0.1, **TINY)


@pytest.mark.parametrize('runner', [run_mask_rcnn, run_upernet, run_classifier])
def test_downstream_model_trains_a_step_with_xcit_backbone(runner):
    backbone = dict(BACKBONE, out_type='cls_token') if runner is run_classifier else dict(BACKBONE)
    model = runner(backbone, (32,) * 4)  # every block feeds one 32-channel output
    assert type(model.backbone) is SoftFreeXCiT
    for name, p in model.backbone.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
