"""SoftFreeCSWin: registry builds for every kernel, strides/shapes at odd sizes, gradients, bf16, stripe attention
and LePE against a direct computation, padding invariance, official-layout conversion, freezing, checkpointing,
layer depths, errors, and the three downstream models (Mask R-CNN, UperNet, ImageClassifier)."""
import os
import types

import pytest
import torch

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.attention import kernel_class, list_attentions
from softfree_mm.models.backbones.cswin import SoftFreeCSWin
from softfree_mm.models.backbones.cswin_convert import convert_cswin

from tests.helpers.models import build_in, run_classifier, run_mask_rcnn, run_upernet, strided_shapes

SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
KERNELS = list_attentions()
TINY = SoftFreeCSWin.family.tiny['arch']  # stripes of 1, 2, 4 and the last stage global
CHANNELS = (16, 32, 64, 128)


# ------------------------------------------------------------------------------------------- every kernel
@pytest.mark.parametrize('kernel', KERNELS)
def test_every_kernel_builds_in_all_registries_with_strided_shapes_finite_grads_and_bf16(kernel):
    cfg = dict(type='SoftFreeCSWin', arch=dict(TINY), attn_cfg=kernel, drop_path_rate=0.1)
    if kernel_class(kernel).fixed_length:  # stripe lengths and the global stage grow with the input size
        with pytest.raises(ValueError, match=rf"SoftFreeCSWin: attention kernel '{kernel}' cannot be used in "
                                             r"stage 0.*varies with the input size"):
            build_in('mmdet', cfg)
        pytest.skip(f'{kernel}: tied to fixed positions, refused where token counts vary (refusal asserted)')
    if not kernel_class(kernel).supports_mask:
        # stripes wider than 1 pad odd grids and mask the pad keys: such a kernel must be refused there
        with pytest.raises(ValueError, match=rf"SoftFreeCSWin: attention kernel '{kernel}' cannot be used in "
                                             r"stage 1 \(stripes of width 2.*global_window=True"):
            build_in('mmdet', cfg)
        cfg['global_window'] = (False, True, True, False)  # stripe width 1 never pads: stage 0 keeps stripes
    models = [build_in(scope, cfg) for scope in SCOPES]
    assert all(type(m) is SoftFreeCSWin for m in models)
    model = models[0].train()
    assert model.out_channels == CHANNELS
    x = torch.randn(1, 3, 67, 85)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == strided_shapes(1, CHANNELS, 67, 85)
    sum(o.square().mean() for o in outs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f'{kernel}: no/non-finite grad for {name}'
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
    assert all(torch.isfinite(o.float()).all() for o in outs)


def test_tiny_preset_channels_and_small_preset_shapes_at_200x333():
    tiny = SoftFreeCSWin(arch='tiny')
    assert tiny.out_channels == (64, 128, 256, 512) and tiny.depths == (1, 2, 21, 1)
    assert tiny.num_heads == (2, 4, 8, 16) and tiny.stripe_widths == (1, 2, 7, 7)
    assert len(tiny.stages[3].blocks[0].branches) == 1 and len(tiny.stages[2].blocks[0].branches) == 2
    # CSWin-T: 23M parameters with its 1000-class head (512 * 1000 + 1000); ours has 3 more output norms
    n = sum(p.numel() for p in tiny.parameters()) + 513_000 - 2 * (64 + 128 + 256)
    assert n == pytest.approx(23e6, rel=0.03)
    assert SoftFreeCSWin.arch_zoo['base'] == dict(embed_dims=96, depths=(2, 4, 32, 2), num_heads=(4, 8, 16, 32),
                                                  stripe_widths=(1, 2, 7, 7))
    model = SoftFreeCSWin(arch=dict(TINY)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 200, 333))
    assert [tuple(o.shape) for o in outs] == strided_shapes(1, CHANNELS, 200, 333)


# ------------------------------------------------------------------------------------------- semantics
def _stripe_spans(n, stripe):
    """The [start, stop) spans of real tokens along an axis of n tokens cut into stripes of ``stripe`` (at most n)
    after padding it symmetrically (the odd pad token at the end) to whole stripes: every stripe keeps only its real
    tokens (pad keys are masked, pad queries dropped)."""
    width = min(stripe, n)
    pad = -n % width
    starts = range(-(pad // 2), n, width)
    return [(max(a, 0), min(a + width, n)) for a in starts]


def _reference_block(blk, x, stripe):
    """The CSWin block written out stripe by stripe (softmax), each stripe holding only its real tokens: its LePE
    convolves the stripe's values zero padded at its edges, as the zero pad tokens around them are."""
    _, h, w, c = x.shape
    qkv = blk.qkv(blk.norm1(x))[0].view(h, w, 3, c)
    halves = []
    for b, br in enumerate(blk.branches):
        cb = c // len(blk.branches)
        q, k, v = (qkv[:, :, i, b * cb:(b + 1) * cb] for i in range(3))
        heads, d = br.num_heads, cb // br.num_heads
        if len(blk.branches) == 1:
            regions = [(slice(0, h), slice(0, w))]
        elif b == 0:  # first half of the heads: vertical stripes (full height)
            regions = [(slice(0, h), slice(*span)) for span in _stripe_spans(w, stripe)]
        else:  # second half: horizontal stripes (full width)
            regions = [(slice(*span), slice(0, w)) for span in _stripe_spans(h, stripe)]
        out = torch.zeros(h, w, cb)
        for rs, cs in regions:
            qs, ks, vs = (t[rs, cs].reshape(-1, heads, d).transpose(0, 1) for t in (q, k, v))
            o = torch.softmax(qs @ ks.transpose(1, 2) * d ** -0.5, dim=-1) @ vs  # (heads, n, d)
            o = o.transpose(0, 1).reshape(-1, cb)
            lepe = br.lepe(v[rs, cs].permute(2, 0, 1)[None])[0].permute(1, 2, 0).reshape(-1, cb)
            out[rs, cs] = (o + lepe).view(out[rs, cs].shape)
        halves.append(out)
    x = x + blk.proj(torch.cat(halves, -1))[None]
    return x + blk.mlp(blk.norm2(x))


# (stage, grid): stripes dividing the grid; padded both ways; one stripe along one axis (the grid thinner than the
# stripe) and several, padded, along the other, both ways; the global stage
STRIPE_GRIDS = [(1, (8, 12)), (1, (9, 11)), (1, (1, 5)), (1, (7, 1)), (2, (3, 10)), (2, (10, 3)), (2, (4, 9)),
                (3, (5, 7))]


@pytest.mark.parametrize('stage,hw', STRIPE_GRIDS, ids=[f'stage{i}-{h}x{w}' for i, (h, w) in STRIPE_GRIDS])
def test_stripe_block_equals_direct_stripe_by_stripe_computation(stage, hw):
    torch.manual_seed(0)
    model = SoftFreeCSWin(arch=dict(TINY), drop_path_rate=0.0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        blk = model.stages[stage].blocks[0]
        dim = model.embed_dims[stage]
        x = torch.randn(1, *hw, dim)
        torch.testing.assert_close(blk(x), _reference_block(blk, x, TINY['stripe_widths'][stage]),
                                   atol=1e-5, rtol=1e-5)


def _pad_slots(hw, stripe_width, direction):
    """(nW, N) bool: which stripe slots hold pad tokens; the grid is padded symmetrically (test's own code)."""
    h, w = hw
    sh, sw = (h, min(stripe_width, w)) if direction == 0 else (min(stripe_width, h), w)
    ph, pw = (-h) % sh, (-w) % sw
    pad = torch.ones(h + ph, w + pw, dtype=torch.bool)
    pad[ph // 2:ph // 2 + h, pw // 2:pw // 2 + w] = False
    hp, wp = pad.shape
    return pad.view(hp // sh, sh, wp // sw, sw).permute(0, 2, 1, 3).reshape(-1, sh * sw)


@pytest.mark.parametrize('kernel', ['softmax', 'linear'])
def test_values_in_padded_stripe_slots_change_no_valid_output(kernel):
    torch.manual_seed(0)
    model = SoftFreeCSWin(arch=dict(TINY), attn_cfg=kernel, drop_path_rate=0.0).eval()
    x = torch.randn(1, 3, 67, 85)  # grids 9x11 (stripe 2) and 5x6 (stripe 4): padded in both directions
    grids = {1: (9, 11), 2: (5, 6)}
    with torch.no_grad():
        ref = model(x)

    def run_with(perturb):
        handles = []
        for i, hw in grids.items():
            for b, br in enumerate(model.stages[i].blocks[0].branches):
                pad = _pad_slots(hw, TINY['stripe_widths'][i], b)
                assert pad.any()

                def hook(mod, args, kwargs, pad=pad):
                    sel = perturb(pad)  # (nW, N) -> (B * nW, 1, N, 1)
                    sel = sel.repeat(args[0].shape[0] // sel.shape[0], 1)[:, None, :, None]
                    return tuple(t + 50.0 * sel for t in args), kwargs
                handles.append(br.kernel.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            with torch.no_grad():
                return model(x)
        finally:
            for hnd in handles:
                hnd.remove()

    for o, r in zip(run_with(lambda pad: pad), ref):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)

    def one_valid(pad):  # control: the same perturbation on one real token changes the outputs
        sel = torch.zeros_like(pad)
        sel[0, (~pad[0]).nonzero()[0]] = True
        return sel
    assert not torch.allclose(run_with(one_valid)[1], ref[1], atol=1e-3)


def test_global_window_gives_one_branch_with_all_heads_the_whole_grid_without_mask():
    model = SoftFreeCSWin(arch=dict(TINY), attn_cfg='linear', global_window=True).eval()
    seen = []
    assert all(len(blk.branches) == 1 for s in model.stages for blk in s.blocks)  # as the official 'I' stages
    for br in model.stages[1].blocks[0].branches:
        br.kernel.register_forward_hook(
            lambda m, args, kwargs, out: seen.append((args[0].shape, kwargs['hw'], kwargs['mask'])),
            with_kwargs=True)
    with torch.no_grad():
        model(torch.randn(1, 3, 67, 85))
    assert seen == [(torch.Size([1, 2, 9 * 11, 16]), (9, 11), None)]


# ------------------------------------------------------------------------------------------- conversion
def official_layout(embed_dims, depths, num_heads, num_classes=1000, segmentation=False):
    """Names and shapes of the official CSWin release (models/cswin.py module names), random tensors."""
    g = torch.Generator().manual_seed(0)
    shapes = {'stage1_conv_embed.0.weight': (embed_dims, 3, 7, 7), 'stage1_conv_embed.0.bias': (embed_dims,),
              'stage1_conv_embed.2.weight': (embed_dims,), 'stage1_conv_embed.2.bias': (embed_dims,)}
    dim = embed_dims
    for s, depth in enumerate(depths, start=1):
        last = s == len(depths)
        for j in range(depth):
            pre = f'stage{s}.{j}.'
            shapes.update({pre + 'qkv.weight': (3 * dim, dim), pre + 'qkv.bias': (3 * dim,),
                           pre + 'norm1.weight': (dim,), pre + 'norm1.bias': (dim,),
                           pre + 'proj.weight': (dim, dim), pre + 'proj.bias': (dim,),
                           pre + 'norm2.weight': (dim,), pre + 'norm2.bias': (dim,),
                           pre + 'mlp.fc1.weight': (4 * dim, dim), pre + 'mlp.fc1.bias': (4 * dim,),
                           pre + 'mlp.fc2.weight': (dim, 4 * dim), pre + 'mlp.fc2.bias': (dim,)})
            for b in range(1 if last else 2):
                half = dim if last else dim // 2
                shapes[pre + f'attns.{b}.get_v.weight'] = (half, 1, 3, 3)
                shapes[pre + f'attns.{b}.get_v.bias'] = (half,)
        if segmentation:
            shapes[f'norm{s}.weight'] = shapes[f'norm{s}.bias'] = (dim,)
        if not last:
            shapes.update({f'merge{s}.conv.weight': (2 * dim, dim, 3, 3), f'merge{s}.conv.bias': (2 * dim,),
                           f'merge{s}.norm.weight': (2 * dim,), f'merge{s}.norm.bias': (2 * dim,)})
            dim *= 2
    if not segmentation:
        shapes.update({'norm.weight': (dim,), 'norm.bias': (dim,), 'head.weight': (num_classes, dim),
                       'head.bias': (num_classes,)})
    return {k: torch.randn(v, generator=g) for k, v in shapes.items()}


@pytest.mark.parametrize('segmentation', [False, True])
def test_official_layout_round_trips_through_convert_and_the_model(segmentation):
    arch = dict(TINY, depths=(1, 2, 1, 1))
    official = official_layout(arch['embed_dims'], arch['depths'], arch['num_heads'], segmentation=segmentation)
    ours = convert_cswin(official)
    model = SoftFreeCSWin(arch=arch)
    missing, unexpected = model.load_state_dict(ours, strict=False)
    assert unexpected == []
    assert sorted(missing) == ([] if segmentation else
                               [f'norm{i}.{p}' for i in range(3) for p in ('bias', 'weight')])
    back = model.state_dict()
    placed = {k: v for k, v in official.items() if not k.startswith('head.')}
    assert len(ours) == len(placed)
    for k, v in ours.items():
        assert torch.equal(back[k], v), k
    assert convert_cswin(back).keys() == back.keys()  # ours passes through
    assert torch.equal(back['stages.1.blocks.1.branches.1.lepe.weight'], official['stage2.1.attns.1.get_v.weight'])
    assert torch.equal(back['stages.2.downsample.conv.weight'], official['merge2.conv.weight'])
    if segmentation:
        assert torch.equal(back['norm0.weight'], official['norm1.weight'])
    else:
        assert torch.equal(back['norm3.weight'], official['norm.weight'])


def test_pretrained_init_cfg_loads_an_official_file_through_the_converter(tmp_path):
    official = official_layout(16, TINY['depths'], TINY['num_heads'])
    path = os.path.join(tmp_path, 'cswin_official.pth')
    torch.save({'state_dict_ema': official}, path)
    # a classifier takes the release's final norm as its norm3; a feature pyramid (detection / segmentation) leaves
    # norm3 at its initialisation, as the official segmentation code (its per-output norms share no name with it)
    for out_indices in ((3,), (0, 1, 2, 3)):
        model = SoftFreeCSWin(arch=dict(TINY), out_indices=out_indices,
                              init_cfg=dict(type='Pretrained', checkpoint=path))
        model.init_weights()
        sd = model.state_dict()
        for k, v in convert_cswin(official).items():
            if k.startswith('norm3.') and out_indices != (3,):
                init = torch.ones_like(v) if k.endswith('weight') else torch.zeros_like(v)
                assert torch.equal(sd[k], init) and not torch.equal(v, init), k
            else:
                assert torch.equal(sd[k], v), k


# ------------------------------------------------------------------------------------------- options
def test_frozen_stages_stay_frozen_and_in_eval_after_train():
    model = SoftFreeCSWin(arch=dict(TINY), frozen_stages=1, drop_path_rate=0.1).train()
    frozen = [model.patch_embed, model.stages[0], model.norm0]
    for m in frozen:
        assert not m.training and all(not p.requires_grad for p in m.parameters())
    for m in (model.stages[1], model.norm1):
        assert m.training and all(p.requires_grad for p in m.parameters())
    sum(o.sum() for o in model(torch.randn(1, 3, 64, 64))).backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())


def test_get_layer_depth_matches_mmpretrain_swin_convention():
    from mmpretrain.models.backbones import SwinTransformer
    model = SoftFreeCSWin(arch=dict(TINY, depths=(1, 2, 2, 1)))
    ref = types.SimpleNamespace(depths=model.depths)
    for name, _ in model.named_parameters():
        p = name.split('.')
        mm_name = name
        if p[0] == 'stages' and p[2] == 'downsample':  # mmpretrain keeps the merge at the end of stage i-1
            mm_name = '.'.join(['stages', str(int(p[1]) - 1), 'downsample', 'norm'])
        assert model.get_layer_depth('backbone.' + name, 'backbone.') == \
            SwinTransformer.get_layer_depth(ref, 'backbone.' + mm_name, 'backbone.'), name


def test_bad_arguments_raise_errors_naming_the_value_and_valid_choices():
    with pytest.raises(ValueError, match=r"unknown arch 'huge'; valid archs: tiny, small, base"):
        SoftFreeCSWin(arch='huge')
    with pytest.raises(ValueError, match=r'attn_cfg is a list of 2 kernel configs but the model has 4 stages'):
        SoftFreeCSWin(arch=dict(TINY), attn_cfg=['inline', 'softmax'])
    with pytest.raises(ValueError, match=r'num_heads=3 and dims=16 must be even'):
        SoftFreeCSWin(arch=dict(TINY, num_heads=(3, 2, 4, 4)))
    with pytest.raises(ValueError, match=r"an arch dict needs the keys embed_dims, depths, num_heads, stripe_widths"):
        SoftFreeCSWin(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4)))
    with pytest.raises(TypeError, match=r'unexpected keyword argument'):
        SoftFreeCSWin(arch=dict(TINY), split_size=(1, 2, 7, 7))


# ------------------------------------------------------------------------------------------- downstream
BACKBONE = dict(type='SoftFreeCSWin', arch=dict(TINY), attn_cfg=['inline', 'inline', 'softmax', 'softmax'],
                drop_path_rate=0.1)


@pytest.mark.parametrize('runner', [run_mask_rcnn, run_upernet, run_classifier])
def test_downstream_model_trains_a_step_with_cswin_backbone(runner):
    model = runner(dict(BACKBONE), CHANNELS)
    assert type(model.backbone) is SoftFreeCSWin
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.backbone.parameters())
