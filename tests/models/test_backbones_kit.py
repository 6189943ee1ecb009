"""The backbone kit (softfree_mm/models/backbones/base.py) and the one attention module hold alike for every family:
the default initialisation of the backbone's own layers (kernels keep theirs), checkpointing only in training,
presets named or given as dicts, one wording for arch and index errors."""
import math
import re

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

import softfree_mm  # noqa: F401  (registers the backbones)
import softfree_mm.models.attention as kernel_attention
from softfree_mm import models
from softfree_mm.attention import AttentionKernel, list_attentions
from softfree_mm.attention.base import mix
from softfree_mm.models.attention import KernelAttention

from tests.helpers.presets import TINY  # every registered backbone

FAMILIES = sorted(TINY)
# a kernel with parameters of its own (a Conv2d and a LayerNorm: the layer types the default init also touches)
# where the family's layout lets it in; XCA's channels have no grid: a synthesizer table there
OWN_PARAMS = {
    'SoftFreeXCiT': dict(attn_cfg=dict(type='synthesizer', mode='random', max_len=8)),
    'SoftFreePVT': dict(attn_cfg='soft', sr_ratios=(1, 1, 1, 1)),
    'SoftFreePVTv2': dict(attn_cfg='soft', sr_ratios=(1, 1, 1, 1)),
    'SoftFreeSwin': dict(attn_cfg='soft', global_window=True),
    'SoftFreeCSWin': dict(attn_cfg='soft', global_window=True),
    'SoftFreeSOFT': dict(),  # the official SOFT kernels in stages 1-3
}
MARK = 0.375  # what the kernels are made to hold before the backbone's initialisation runs


def build(name, **kw):
    return getattr(models, name)(**dict(TINY[name], **kw))


def own_modules(model):
    owned = {id(m) for k in model.modules() if isinstance(k, AttentionKernel) for m in k.modules()}
    return [m for m in model.modules() if id(m) not in owned]


def assert_trunc_normal(w: torch.Tensor, std: float, what: str):
    """Mean 0 and standard deviation ``std`` within what ``w.numel()`` samples allow (5 sigma), inside the absolute
    bounds [-2, 2] of timm's trunc_normal_ (as the official code calls it: truncation far out in the tails, so
    about 4.6 % of the values lie beyond 2 std, as for a plain normal)."""
    w = w.detach().double().flatten()
    n = w.numel()
    assert abs(w.mean().item()) < 5 * std / math.sqrt(n), what
    assert abs(w.std().item() / std - 1) < 5 / math.sqrt(2 * n), what
    assert w.abs().max().item() <= 2.0, what
    tail = (w.abs() > 2 * std).double().mean().item()
    assert abs(tail - 0.0455) < 5 * math.sqrt(0.0455 * 0.9545 / n), what


@pytest.fixture
def marked_kernels(monkeypatch):
    """Every kernel a KernelAttention builds holds MARK in all its parameters right after it is built."""
    build_attention = kernel_attention.build_attention

    def marked(*args, **kwargs):
        kern = build_attention(*args, **kwargs)
        with torch.no_grad():
            for p in kern.parameters():
                p.fill_(MARK)
        return kern

    monkeypatch.setattr(kernel_attention, 'build_attention', marked)


@pytest.mark.parametrize('name', FAMILIES)
def test_default_init_draws_the_backbones_own_layers_and_leaves_the_kernels_theirs(name, marked_kernels):
    torch.manual_seed(0)
    model = build(name, **OWN_PARAMS[name])
    assert model.init_cfg is None
    kernels = [k for k in model.modules() if isinstance(k, AttentionKernel)]
    assert any(list(k.parameters()) for k in kernels), 'kernels here own parameters'
    linears, norms = _check_default_init(model, kernels, name, 'at build')
    with torch.no_grad():  # init_weights() without an init_cfg runs the same initialisation again (every family)
        for m in linears + norms:
            m.weight.zero_()
    model.init_weights()
    _check_default_init(model, kernels, name, 'after init_weights()')


def _check_default_init(model, kernels, name, when):
    own = own_modules(model)
    linears = [m for m in own if isinstance(m, nn.Linear)]
    assert_trunc_normal(torch.cat([m.weight.flatten() for m in linears]), 0.02, f'{name} Linear weights {when}')
    for m in linears:
        assert m.bias is None or not m.bias.any(), (name, when)
    norms = [m for m in own if isinstance(m, nn.LayerNorm)]
    assert norms and all(bool((m.weight == 1).all() and not m.bias.any()) for m in norms), (name, when)
    if name.startswith('SoftFreePVT'):  # the official PVT init: normal(0, sqrt(2 / fan_out)) convs, zero bias
        for m in (m for m in own if isinstance(m, nn.Conv2d) and m.weight.numel() >= 2000):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            w = m.weight.detach().double()
            assert abs(w.std().item() / math.sqrt(2 / fan_out) - 1) < 5 / math.sqrt(2 * w.numel()), (name, m)
            assert m.bias is None or not m.bias.any()
    for k in kernels:
        assert all(bool((p == MARK).all()) for p in k.parameters()), (name, when, k.name)
    return linears, norms


@pytest.mark.parametrize('name', FAMILIES)
def test_gradient_checkpointing_runs_in_training_only(name, monkeypatch):
    calls = []
    checkpoint = torch.utils.checkpoint.checkpoint

    def counted(*args, **kwargs):
        calls.append(1)
        return checkpoint(*args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, 'checkpoint', counted)
    model = build(name, with_cp=True)
    x = torch.randn(1, 3, 64, 64)
    model.eval()
    outs = model(x)  # gradients enabled: the features require them
    assert any(o.requires_grad for o in outs) and not calls
    model.train()
    sum(o.mean() for o in model(x)).backward()
    assert calls


@pytest.mark.parametrize('name', FAMILIES)
def test_checkpointing_changes_neither_outputs_nor_grads(name):
    torch.manual_seed(0)
    a = build(name, drop_path_rate=0.0).train()
    b = build(name, drop_path_rate=0.0, with_cp=True).train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 64, 80)
    oa, ob = a(x), b(x)
    for u, w in zip(oa, ob):
        torch.testing.assert_close(u, w)
    sum(o.sum() for o in oa).backward()
    sum(o.sum() for o in ob).backward()
    grads = dict(b.named_parameters())
    assert any(p.grad is not None for p in a.parameters())
    for n, p in a.named_parameters():
        torch.testing.assert_close(p.grad, grads[n].grad, msg=n)


PRESETS = {  # a preset with the options it sets, and size overrides that keep its structure
    'SoftFreeXCiT': ('t12', dict(embed_dims=32, num_heads=4, depth=4, out_indices=(0, 1, 2, 3),
                                 norm_cfg=dict(type='BN'))),
    'SoftFreePVT': ('inline_tiny', dict(embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1))),
    'SoftFreePVTv2': ('b2_li', dict(embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1))),
    'SoftFreeSwin': ('inline_tiny', dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))),
    'SoftFreeCSWin': ('inline_tiny', dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4))),
    'SoftFreeSOFT': ('tiny_norm', dict()),
}


@pytest.mark.parametrize('name', FAMILIES)
def test_arch_given_as_a_name_or_as_its_dict_builds_the_same_model(name):
    cls = getattr(models, name)
    arch, kw = PRESETS[name]
    assert not cls.arch_options or set(cls.arch_zoo[arch]) - set(cls.arch_keys), 'the preset sets options too'
    built = []
    for given in (arch, dict(cls.arch_zoo[arch])):
        torch.manual_seed(0)
        built.append(cls(arch=given, **kw))
    a, b = (m.state_dict() for m in built)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert repr(built[0]) == repr(built[1])


def _stage_count(name):
    return TINY[name]['depth'] if name == 'SoftFreeXCiT' else 4


@pytest.mark.parametrize('name', FAMILIES)
def test_arch_and_index_errors_have_one_wording_in_every_family(name):
    cls = getattr(models, name)
    keys = ', '.join(cls.arch_keys)
    with pytest.raises(ValueError, match=rf"^{name}: unknown arch 'nope'; valid archs: "
                                         rf"{', '.join(cls.arch_zoo)} \(or a dict with {keys}\)$"):
        cls(arch='nope')
    with pytest.raises(ValueError, match=rf'^{name}: an arch dict needs the keys {keys}( and may add [a-z_, ]+)?; '
                                         r"got \['depth', 'embed_dims'\]$"):
        cls(arch=dict(embed_dims=8, depth=2))
    with pytest.raises(TypeError, match=rf'^{name}: arch must be a name \(.*\) or a dict with {keys}, got 3$'):
        cls(arch=3)
    n = _stage_count(name)
    unit = 'four increasing block' if name == 'SoftFreeXCiT' else 'stage'
    # one past the last index, one before the first negative one
    for bad in ([(0, 1, 2, n), (-n - 1, 1, 2, 3)] if name == 'SoftFreeXCiT' else [(n,), (-n - 1,), (0, -n - 1)]):
        with pytest.raises(ValueError, match=rf'^{name}: out_indices must be {unit} indices in \[0, {n - 1}\], '
                                             rf'got {re.escape(repr(bad))}; a negative index counts from the end '
                                             rf'\({-n}..-1\)$'):
            build(name, out_indices=bad)
    with pytest.raises(ValueError, match=rf'^{name}: frozen_stages must be an int in \[-1, {n}\], got {n + 1}$'):
        cls(**dict(TINY[name], frozen_stages=n + 1))


@pytest.mark.parametrize('kernel', ['polly', 'qqzx'])  # a near miss of a kernel's name, a name like none
@pytest.mark.parametrize('name', FAMILIES)
def test_an_unknown_kernel_is_one_error_naming_it_where_it_is_and_every_valid_kernel(name, kernel):
    n = _stage_count(name)
    unit = 'layer' if name == 'SoftFreeXCiT' else 'stage'
    valid = ', '.join(list_attentions())
    for given, where in ((kernel, 0), (['softmax'] * (n - 1) + [dict(type=kernel)], n - 1)):
        with pytest.raises(KeyError) as e:
            build(name, attn_cfg=given)
        assert e.value.args[0] == (f'{name}: attn_cfg for {unit} {where}: unknown attention type {kernel!r}; '
                                   f'valid types: {valid}')


@pytest.mark.parametrize('name', FAMILIES)
def test_negative_out_indices_count_from_the_end_as_in_mmpretrain(name):
    """Every negative index down to -num (the first stage / block) is the index num places later: the same
    outputs as the model given the non-negative indices."""
    n = _stage_count(name)
    if name == 'SoftFreeXCiT':  # four increasing blocks
        cases = [((-4, -3, -2, -1), (n - 4, n - 3, n - 2, n - 1)), ((-n, 1, 2, -1), (0, 1, 2, n - 1))]
    else:
        cases = [(tuple(range(-n, 0)), tuple(range(n))), ((-n, -1), (0, n - 1)), ((-1, 1), (n - 1, 1)), (-n, (0,))]
    x = torch.randn(1, 3, 32, 32)
    for given, same in cases:
        torch.manual_seed(0)
        a = build(name, out_indices=given).eval()
        torch.manual_seed(0)
        b = build(name, out_indices=same).eval()
        assert a.out_indices == b.out_indices == same and a.out_channels == b.out_channels, given
        with torch.no_grad():
            outs_a, outs_b = a(x), b(x)
        assert len(outs_a) == len(same)
        for u, w in zip(outs_a, outs_b):
            torch.testing.assert_close(u, w, rtol=0, atol=0)


@pytest.mark.parametrize('name', ['SoftFreeXCiT', 'SoftFreeSOFT'])
def test_norm_eval_keeps_the_batch_norms_in_eval_mode_while_the_rest_trains(name):
    model = build(name, norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert bns and not any(m.training for m in bns) and model.training
    assert all(m.training for m in build(name).train().modules() if isinstance(m, _BatchNorm))


@pytest.mark.parametrize('name', FAMILIES)
def test_every_kernel_sits_in_one_kernel_attention_module(name):
    model = build(name, **OWN_PARAMS[name])
    owners = [m for m in model.modules() if isinstance(getattr(m, 'kernel', None), AttentionKernel)]
    kernels = [k for k in model.modules() if isinstance(k, AttentionKernel)]
    assert owners and len(owners) == len(kernels)
    # XCiT's class-attention layers stay softmax (as the official model) and hold no kernel
    assert all(isinstance(m, KernelAttention) for m in owners)


def test_the_backbones_and_the_swap_adapters_share_one_kernel_call():
    from softfree_mm.swap import attend
    assert attend.mix is mix and kernel_attention.mix is mix
