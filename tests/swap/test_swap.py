"""swap_attention / SoftFreeSwap: kernels swapped into models we did not write (timm ViT, DeiT, DeiT-3, Swin, PVTv2,
XCiT; mmpretrain ViT, Swin; mmdet Swin, PVTv2, DETR decoder). References are the untouched models themselves (their
own implementation, same weights) and plain formulas written here."""
import copy
import pickle

import pytest
import torch

import softfree_mm  # noqa: F401  (registers SoftFreeSwap and the backbones)
from softfree_mm import swap_attention
from softfree_mm.analysis.swap_support import MODELS, build, kernel_cfg, outputs, randomize_
from softfree_mm.attention import kernel_class, list_attentions
from softfree_mm.swap import SwapError, restore_attention, swap_summary

from tests.helpers.models import build_in

# attention modules each tiny model holds, counted by hand from its config
ATTENTION_COUNT = {'timm ViT': 2, 'timm DeiT (distilled)': 2, 'timm DeiT-3 + registers': 2, 'timm Swin': 4,
                   'timm PVTv2': 2, 'timm XCiT': 3, 'mmpretrain ViT': 2, 'mmpretrain Swin': 4, 'mmdet Swin': 4,
                   'mmdet PVTv2': 4, 'mmdet DETR decoder': 4}
# kernels that take masks, biases, any grid-free layout and any length: they must fit every model
EVERYWHERE = ('softmax', 'poly', 'relu', 'sigmoid', 'linear', 'efficient', 'taylor')


def run(model, args):
    with torch.no_grad():
        return outputs(model(*args))


# ------------------------------------------------------------------------------------------------ parity
@pytest.mark.parametrize('name', list(MODELS))
def test_softmax_swap_equals_untouched_model_with_identical_state_dict(name):
    ref = build(name)
    model = copy.deepcopy(ref)
    assert swap_attention(model, 'softmax') is model
    summary = swap_summary(model)
    assert len(summary) == ATTENTION_COUNT[name]
    for rec in summary:  # the module keeps its class (a subclass is swapped in)
        module = model.get_submodule(rec['path'])
        assert isinstance(module, type(ref.get_submodule(rec['path'])))
    sd_ref, sd = ref.state_dict(), model.state_dict()
    assert list(sd) == list(sd_ref)
    assert all(torch.equal(sd[k], sd_ref[k]) for k in sd)
    args = MODELS[name][1](0)
    for a, b in zip(run(model, args), run(ref, args)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # the swapped forward is the one running: another kernel changes the outputs
    poly = swap_attention(copy.deepcopy(ref), 'poly')
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(run(poly, args), run(ref, args)))


# ------------------------------------------------------------------------------------------------ every kernel
@pytest.mark.parametrize('name', list(MODELS))
def test_every_kernel_fits_with_finite_gradients_or_is_refused_naming_module_and_reason(name):
    torch.manual_seed(0)  # the kernels' own initialisation
    base = build(name)
    paths = None
    for kernel in list_attentions():
        model = copy.deepcopy(base)
        keys = list(model.state_dict())
        try:
            swap_attention(model, kernel_cfg(kernel))
        except SwapError as e:
            assert kernel not in EVERYWHERE, f'{name}: {kernel} refused: {e}'
            msg, cls = str(e), kernel_class(kernel)
            assert e.refusals and not swap_summary(model) and list(model.state_dict()) == keys  # nothing changed
            for where, code, why in e.refusals:
                path = where.split(' (')[0]
                model.get_submodule(path)  # a real module path
                assert f'{where}: {why}' in msg and f"'{kernel}'" in why
                # the reason agrees with what the kernel declares
                assert code in ('grid', 'mask', 'length', 'ties_qk', 'build'), (code, why)
                assert code != 'grid' or cls.needs_hw
                assert code != 'mask' or not cls.supports_mask
                assert code != 'length' or cls.fixed_length
                assert code != 'ties_qk' or kernel == 'soft'
            continue
        swapped = [m for m in model.modules() if hasattr(type(m), '_sf_original_class')]
        assert len(swapped) == ATTENTION_COUNT[name]
        model.train()
        loss = sum(o.square().mean() for o in outputs(model(*MODELS[name][1](1))))
        loss.backward()
        for m in swapped:
            for pname, p in m.named_parameters():
                if p.requires_grad:
                    assert p.grad is not None and torch.isfinite(p.grad).all(), f'{name}/{kernel}: {pname}'
            assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


# ------------------------------------------------------------------------------------------------ refusals
def refusal(model, cfg, **kw):
    with pytest.raises(SwapError) as info:
        swap_attention(model, cfg, **kw)
    return str(info.value), {w.split(' (')[0]: (c, why) for w, c, why in info.value.refusals}


def test_refusals_name_the_module_and_the_reason():
    # a mask-less kernel in shifted windows: exactly the shifted blocks are refused
    msg, ref = refusal(build('timm Swin'), 'nystrom')
    assert set(ref) == {'layers.0.blocks.1.attn', 'layers.1.blocks.1.attn'}
    assert 'cannot honour a mask' in msg and 'shift_size=(2, 2)' in msg
    swap_attention(build('timm Swin'), 'nystrom', layers='layers.*.blocks.0.attn')  # non-shifted blocks take it
    msg, ref = refusal(build('mmdet Swin'), 'performer')
    assert set(ref) == {'stages.0.blocks.1.attn.w_msa', 'stages.1.blocks.1.attn.w_msa'} and 'shift_size=2' in msg

    # SOFT ties keys to queries: refused by that name in DETR's cross-attention
    msg, ref = refusal(build('mmdet DETR decoder'), 'soft')
    assert ref['layers.0.cross_attn'][0] == 'ties_qk' and 'ties keys to queries' in ref['layers.0.cross_attn'][1]
    assert 'memory' in ref['layers.1.cross_attn'][1]
    assert ref['layers.0.self_attn'][0] == 'grid'
    # linear-time kernels that take masks fit the cross-attention (Nq != Nk)
    swap_attention(build('mmdet DETR decoder'), 'linear', layers='*cross_attn')

    # grid kernels: spatial reduction, XCA's channels, class tokens without prefix attention
    msg, ref = refusal(build('timm PVTv2'), 'inline')
    assert set(ref) == {'stages.0.blocks.0.attn'} and 'spatial reduction (sr_ratio=2)' in msg
    msg, ref = refusal(build('mmdet PVTv2'), 'flatten')
    assert set(ref) == {'layers.0.1.0.attn', 'layers.1.1.0.attn'} and 'sr_ratio=4' in msg
    msg, ref = refusal(build('timm XCiT'), dict(type='inline', local_residual=True))
    assert 'blocks.0.attn' in ref and 'cls_attn_blocks.0.attn' in ref
    msg, ref = refusal(build('timm XCiT'), dict(type='soft', landmark_op='avgpool'))
    assert 'channels of a head' in ref['blocks.0.attn'][1] and ref['cls_attn_blocks.0.attn'][0] == 'ties_qk'
    msg, ref = refusal(build('timm DeiT-3 + registers'), 'inline', prefix_attention=None)
    assert set(ref) == {'blocks.0.attn', 'blocks.1.attn'} and '3 class/register token(s)' in msg

    # positional kernels where the token count follows the input size
    msg, ref = refusal(build('mmpretrain ViT'), dict(type='synthesizer', mix=True))
    assert 'takes any image size' in msg and set(ref) == {'layers.0.attn', 'layers.1.attn'}


def test_unknown_attention_layouts_are_errors_unless_left_out():
    from timm.models.vision_transformer import VisionTransformer
    vit = randomize_(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                       global_pool='map', num_classes=3))
    msg, ref = refusal(vit, 'poly')
    assert set(ref) == {'attn_pool'} and 'AttentionPoolLatent' in msg and 'no adapter' in msg
    swap_attention(vit, 'poly', layers='blocks.*')
    assert [r['path'] for r in swap_summary(vit)] == ['blocks.0.attn', 'blocks.1.attn']
    # our own backbones take a kernel through attn_cfg, not by swapping
    ours = build_in('mmdet', dict(type='SoftFreeSwin', arch=dict(embed_dims=16, depths=(1, 1, 1, 1),
                                                                num_heads=(1, 1, 2, 2))))
    msg, _ = refusal(ours, 'poly')
    assert "set that backbone's attn_cfg" in msg
    with pytest.raises(SwapError, match='no attention module found'):
        swap_attention(torch.nn.Linear(3, 3), 'poly')


def test_bad_arguments_are_clear_errors():
    vit = build('timm ViT')
    with pytest.raises(KeyError, match="unknown attention type 'polly'.*valid types: .*poly"):
        swap_attention(vit, 'polly')
    with pytest.raises(TypeError, match=r"attn_cfg\[1\].*unknown argument\(s\) \['degre'\]"):
        swap_attention(vit, ['poly', dict(type='poly', degre=2)])
    with pytest.raises(SwapError, match=r'list of 3 kernel configs.*2 selected attention module'):
        swap_attention(vit, ['poly', 'poly', 'poly'])
    with pytest.raises(SwapError, match=r"pattern 'block.*' matches no attention module.*0: blocks.0.attn"):
        swap_attention(vit, 'poly', layers='block.*')
    with pytest.raises(SwapError, match='index 5 is out of range.*2 attention modules'):
        swap_attention(vit, 'poly', layers=[5])
    with pytest.raises(TypeError, match='layers entries must be ints'):
        swap_attention(vit, 'poly', layers=[1.0])
    with pytest.raises(KeyError, match='prefix_attention'):
        swap_attention(vit, 'inline', prefix_attention='softmaxx')
    assert not swap_summary(vit)


@pytest.mark.parametrize('kernel', ['polly', 'qqzx'])  # a near miss of a kernel's name, a name like none
def test_an_unknown_kernel_is_one_error_naming_the_argument_and_every_valid_kernel(kernel):
    vit = build('timm ViT')
    unknown = f"unknown attention type {kernel!r}; valid types: {', '.join(list_attentions())}"
    for kwargs, where in ((dict(attn_cfg=kernel), 'attn_cfg'), (dict(attn_cfg=['poly', kernel]), 'attn_cfg[1]'),
                          (dict(attn_cfg='inline', prefix_attention=kernel), 'prefix_attention')):
        with pytest.raises(KeyError) as e:
            swap_attention(vit, **kwargs)
        assert e.value.args[0] == f'swap_attention: {where}: {unknown}'
    assert not swap_summary(vit)


# ------------------------------------------------------------------------------------------------ class tokens
def test_grid_kernel_gets_patch_tokens_on_their_grid_and_prefix_tokens_attend_over_all_through_softmax():
    vit = build('timm DeiT-3 + registers')  # 1 class + 2 register tokens, 4x4 patches at 32x32
    attn = vit.blocks[0].attn
    swap_attention(vit, 'inline', layers=[0])
    x = torch.randn(2, 3 + 16, 32)
    with torch.no_grad():
        q, k, v = attn.qkv(x).reshape(2, 19, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        assert attn.kernel.takes_context  # InLine's official residual: predicted from the mean patch input
        grid = attn.kernel(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], hw=(4, 4), scale=16 ** -0.5,
                           context=x[:, 3:].mean(1))
        prefix = torch.softmax(q[:, :, :3] @ k.transpose(-2, -1) * 16 ** -0.5, dim=-1) @ v  # plain formula
        expect = attn.proj(torch.cat([prefix, grid], dim=2).transpose(1, 2).reshape(2, 19, 32))
        torch.testing.assert_close(attn(x), expect, atol=1e-5, rtol=1e-5)
        # no patch query reads a prefix token
        y = x.clone()
        y[:, :3] += 1.0
        torch.testing.assert_close(attn(y)[:, 3:], attn(x)[:, 3:])
    assert any('3 prefix token(s) attend over all tokens through softmax' in n for n in swap_summary(vit)[0]['notes'])


def test_grid_follows_the_input_size_in_dynamic_timm_and_mmpretrain_vits():
    from timm.models.vision_transformer import VisionTransformer
    vit = randomize_(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                       dynamic_img_size=True, num_classes=3)).eval()
    seen = []
    swap_attention(vit, dict(type='soft', landmark_ratio=2))
    kern = vit.blocks[0].attn.kernel
    kern.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs['hw']), with_kwargs=True)
    for size in ((32, 40), (48, 24)):
        with torch.no_grad():
            vit(torch.randn(1, 3, *size))
    assert seen == [(4, 5), (6, 3)]
    mm = build('mmpretrain ViT')
    swap_attention(mm, 'inline')
    seen.clear()
    mm.layers[0].attn.kernel.register_forward_pre_hook(lambda m, a, kw: seen.append(kw['hw']), with_kwargs=True)
    with torch.no_grad():
        mm(torch.randn(1, 3, 40, 24))
    assert seen == [(5, 3)]
    restore_attention(mm)  # and the grid hook goes with the swap
    assert not mm.patch_embed._forward_hooks and not hasattr(mm.patch_embed, '_sf_grid_context')


# ------------------------------------------------------------------------------------------------ configs per stage
def test_attn_cfg_per_stage_or_per_layer_and_layers_selection():
    swin = build('timm Swin')
    swap_attention(swin, ['poly', dict(type='relu')])  # 2 stages
    assert [r['kernel'] for r in swap_summary(swin)] == ['poly', 'poly', 'relu', 'relu']
    swap_attention(swin, ['softmax', 'linear', 'taylor', 'efficient'])  # one per module; replaces the kernels
    assert [r['kernel'] for r in swap_summary(swin)] == ['softmax', 'linear', 'taylor', 'efficient']
    rel = swin.layers[0].blocks[1].attn.relative_position_bias_table
    assert not rel.requires_grad  # linear takes no bias: the table is kept, frozen
    restore_attention(swin)
    assert rel.requires_grad and not swap_summary(swin) and type(swin.layers[0].blocks[0].attn).__name__ == \
        'WindowAttention'
    swap_attention(swin, dict(type='poly', degree=2), layers=['layers.1.*', 0])
    assert [(r['index'], r['path']) for r in swap_summary(swin)] == [
        (0, 'layers.0.blocks.0.attn'), (2, 'layers.1.blocks.0.attn'), (3, 'layers.1.blocks.1.attn')]
    assert swap_summary(swin)[0]['kernel'] == 'poly(degree=2)'


def test_softmax_swap_then_restore_gives_the_original_model_back_and_pickles():
    ref = build('mmdet Swin')
    model = swap_attention(copy.deepcopy(ref), 'poly')
    x = torch.randn(1, 3, 64, 72)
    clone = pickle.loads(pickle.dumps(model))
    for a, b in zip(run(clone, (x,)), run(model, (x,))):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert swap_summary(clone) == swap_summary(model)
    restore_attention(model)
    for a, b in zip(run(model, (x,)), run(ref, (x,))):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# a kernel on the token grid (prefix tokens through a second kernel), one that takes no bias (bias tables frozen
# while swapped) and a plain one: each adds its own state to the module, which restore must take away again
RESWAP_KERNELS = ('inline', 'linear', 'poly')


def _tree(model):
    """Everything a swap may touch, module by module: class, attribute names, children, hooks, parameters with
    their requires_grad, buffers."""
    return [(path, type(m), sorted(vars(m)), list(m._modules), len(m._forward_hooks), len(m._forward_pre_hooks),
             [(n, p.requires_grad) for n, p in m.named_parameters(recurse=False)], list(m._buffers))
            for path, m in model.named_modules()]


def _assert_same_tree(model, ref, what):
    got, want = _tree(model), _tree(ref)
    assert [g[0] for g in got] == [w[0] for w in want], what
    for g, w in zip(got, want):
        assert g == w, f'{what}: {g[0] or "the model"} differs'


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize('name', list(MODELS))
def test_restore_gives_the_original_module_tree_back_and_the_model_swaps_again(name):
    ref = build(name)
    args = MODELS[name][1](0)
    expect = run(ref, args)
    added = set()
    for kernel in RESWAP_KERNELS:
        model = copy.deepcopy(ref)
        torch.manual_seed(0)  # the kernel's own initialisation, the same in both swaps
        try:
            swap_attention(model, kernel)
        except SwapError:  # refused: nothing was changed
            _assert_same_tree(model, ref, f'{kernel} refused')
            continue
        originals = dict(ref.named_modules())
        for path, m in model.named_modules():  # the children a swap adds to its modules
            if hasattr(type(m), '_sf_original_class'):
                added.update(set(m._modules) - set(originals[path]._modules))
        first = run(model, args)
        for round_ in range(2):
            restore_attention(model)
            _assert_same_tree(model, ref, f'{kernel}, restore {round_ + 1}')
            _same_state(model, ref)
            for a, b in zip(run(model, args), expect):
                torch.testing.assert_close(a, b, atol=0, rtol=0)
            torch.manual_seed(0)
            swap_attention(model, kernel)  # a restored model takes a kernel as a fresh one does
            for a, b in zip(run(model, args), first):
                torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert 'kernel' in added, f'{name}: no kernel was swapped in'
    if name in ('timm ViT', 'timm DeiT (distilled)', 'timm DeiT-3 + registers', 'mmpretrain ViT'):
        assert 'prefix_kernel' in added  # class tokens: the grid kernel came with a prefix kernel


def test_attention_dropout_is_kept_in_training():
    from timm.models.vision_transformer import VisionTransformer
    vit = randomize_(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3,
                                       attn_drop_rate=0.5))
    swap_attention(vit, 'linear')
    x = torch.randn(1, 3, 32, 32)
    vit.train()
    a, b = vit(x), vit(x)
    assert (a - b).abs().max() > 1e-4  # dropout acts on the weights
    vit.eval()
    torch.testing.assert_close(vit(x), vit(x))
    # the explicit path (A, dropout, A @ v + the part A cannot hold) equals the kernel's own forward at p -> 0
    from softfree_mm.attention import build_attention
    from softfree_mm.swap.attend import mix
    kern = build_attention('inline', num_heads=2, head_dim=8)  # official per-channel residual: not all in A
    q, k, v = torch.randn(3, 2, 2, 16, 8).unbind(0)
    ctx = torch.randn(2, 16)
    torch.testing.assert_close(mix(kern, q, k, v, (4, 4), None, None, None, 1e-12, True, ctx),
                               kern(q, k, v, hw=(4, 4), context=ctx), atol=1e-5, rtol=1e-5)


def test_detr_cross_attention_masked_memory_equals_deleted_memory():
    dec = build('mmdet DETR decoder')
    swap_attention(dec, dict(type='poly', degree=3))
    q, mem, _, qp, kp, pad = MODELS['mmdet DETR decoder'][1](0)
    with torch.no_grad():
        full = dec(q, mem, mem, qp, kp, pad)[:, 1]
        cut = dec(q[1:], mem[1:, :9], mem[1:, :9], qp[1:], kp[1:, :9], pad[1:, :9])[:, 0]
    torch.testing.assert_close(full, cut, atol=1e-5, rtol=1e-5)


def test_torch_compile_works_on_a_swapped_timm_vit():
    from timm.models.vision_transformer import VisionTransformer
    vit = randomize_(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3))
    swap_attention(vit.eval(), 'inline')  # the grid kernel on the patches, softmax rows for the class token
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(vit, backend='aot_eager', fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), vit(x), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ registry wrapper
TINY_SWIN = dict(type='mmdet.SwinTransformer', embed_dims=16, depths=(2, 2), num_heads=(1, 2), window_size=4,
                 strides=(4, 2), out_indices=(0, 1))


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_softfreeswap_config_key_builds_the_inner_backbone_with_its_keys_and_swapped_kernel(scope):
    from mmdet.models.backbones import SwinTransformer
    model = build_in(scope, dict(type='SoftFreeSwap', backbone=dict(TINY_SWIN), attn_cfg=dict(type='poly', degree=3)))
    assert type(model) is SwinTransformer
    assert [r['kernel'] for r in swap_summary(model)] == ['poly(degree=3)'] * 4
    plain = build_in(scope, dict(TINY_SWIN))
    assert list(model.state_dict()) == list(plain.state_dict())


def test_softfreeswap_keeps_pretrained_init_and_frozen_stages_of_the_inner_backbone(tmp_path):
    plain = randomize_(build_in('mmdet', dict(TINY_SWIN)))
    ckpt = tmp_path / 'swin.pth'
    torch.save({'state_dict': {'backbone.' + k: v for k, v in plain.state_dict().items()}}, ckpt)
    inner = dict(TINY_SWIN, frozen_stages=1)
    model = build_in('mmdet', dict(type='SoftFreeSwap', backbone=inner, attn_cfg='linear',
                                   init_cfg=dict(type='Pretrained', checkpoint=str(ckpt))))
    model.init_weights()
    sd = model.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in plain.state_dict().items())
    model.train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert {n for n in frozen if not n.startswith(('patch_embed.', 'stages.0.', 'norm0.'))} == {
        'stages.1.blocks.0.attn.w_msa.relative_position_bias_table',  # unused by linear: kept, frozen
        'stages.1.blocks.1.attn.w_msa.relative_position_bias_table'}
    assert not model.stages[0].training and model.stages[1].training
    with pytest.raises(ValueError, match='init_cfg is given both'):
        build_in('mmdet', dict(type='SoftFreeSwap', backbone=dict(inner, init_cfg=dict(type='Pretrained',
                                                                                        checkpoint='a')),
                               attn_cfg='poly', init_cfg=dict(type='Pretrained', checkpoint='b')))
    with pytest.raises(TypeError, match="'backbone' must be a model config dict"):
        build_in('mmdet', dict(type='SoftFreeSwap', backbone='SwinTransformer', attn_cfg='poly'))


def test_softfreeswap_inside_a_downstream_classifier():
    cls = build_in('mmpretrain', dict(
        type='ImageClassifier',
        backbone=dict(type='SoftFreeSwap', attn_cfg='inline', backbone=dict(
            type='VisionTransformer', img_size=32, patch_size=8, out_type='cls_token',
            arch=dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64))),
        head=dict(type='LinearClsHead', num_classes=3, in_channels=32)))
    assert len(swap_summary(cls.backbone)) == 2
    out = cls(torch.randn(2, 3, 32, 40), mode='tensor')
    assert out.shape == (2, 3) and torch.isfinite(out).all()


# ------------------------------------------------------------------------------------------------ more layouts
def _parity(ref, args, kernel='softmax', **kw):
    model = swap_attention(copy.deepcopy(ref), kernel, **kw)
    assert list(model.state_dict()) == list(ref.state_dict())
    for a, b in zip(run(model, args), run(ref, args)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    return model


def test_softmax_swap_equals_timm_attention_with_masks_gates_norms_and_linear_sra():
    from timm.layers import Attention
    from timm.models.pvt_v2 import PyramidVisionTransformerV2
    # a bare timm Attention (the model is the module): qk-norm, scale-norm, gate, an SDPA bool mask, causal
    attn = randomize_(Attention(32, num_heads=2, qk_norm=True, scale_norm=True, gated=True,
                                norm_layer=torch.nn.LayerNorm)).eval()
    x = torch.randn(2, 7, 32)
    keep = torch.rand(2, 1, 7, 7) > 0.3
    keep[..., 0] = True
    model = _parity(attn, (x, keep))
    with torch.no_grad():
        torch.testing.assert_close(model(x, is_causal=True), attn(x, is_causal=True), atol=1e-5, rtol=1e-5)
    # timm ViT handed an attention mask (its blocks pass it to every layer)
    vit = build('timm ViT')
    mask = torch.rand(17, 17) > 0.3
    mask |= torch.eye(17, dtype=torch.bool)
    swapped = swap_attention(copy.deepcopy(vit), 'softmax')
    img = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(swapped.forward_features(img, mask), vit.forward_features(img, mask),
                                   atol=1e-5, rtol=1e-5)
    # PVTv2-li: keys pooled to 7x7 (linear SRA)
    pvt = randomize_(PyramidVisionTransformerV2(depths=(1, 1), embed_dims=(16, 32), num_heads=(1, 2),
                                                mlp_ratios=(2, 2), linear=True, num_classes=3)).eval()
    _parity(pvt, (torch.randn(1, 3, 64, 72),))


def test_softmax_swap_equals_mmseg_swin_and_segformer():
    x = (torch.randn(1, 3, 64, 72),)
    swin = randomize_(build_in('mmseg', dict(type='SwinTransformer', embed_dims=16, depths=(2, 2), num_heads=(1, 2),
                                             window_size=4, strides=(4, 2), out_indices=(0, 1))))
    swin.eval()
    _parity(swin, x)
    mit = randomize_(build_in('mmseg', dict(type='MixVisionTransformer', embed_dims=8, num_layers=[1, 1, 1, 1],
                                            num_heads=[1, 1, 2, 2], sr_ratios=[4, 2, 1, 1])))
    mit.eval()
    model = _parity(mit, x)
    assert len(swap_summary(model)) == 4
    swap_attention(model, 'inline', layers=['layers.2.*', 'layers.3.*'])  # the stages without spatial reduction
