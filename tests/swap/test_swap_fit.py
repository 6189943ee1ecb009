"""One set of fit rules (softfree_mm.attention.fit) for our backbones and swapped foreign models, and the adapter
registration API (a new library's attention layout is one ``register`` call)."""
import copy
import os

import pytest
import torch
from torch import nn

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.analysis.swap_support import build
from softfree_mm.attention import build_attention, kernel_class, list_attentions
from softfree_mm.attention.fit import Site, misfit
from softfree_mm.models import SoftFreeSwin
from softfree_mm.swap import ADAPTERS, Layout, SwapError, register, swap_attention, swap_summary
from softfree_mm.swap.adapter import need
from softfree_mm.swap.attend import mix

TINY_SWIN = dict(embed_dims=16, depths=(2, 1, 1, 1), num_heads=(1, 1, 2, 2))


def _reason(msg: str, rule: str) -> str:
    """The reason text from where the rule's wording starts, to the end of its line."""
    line = next(ln for ln in msg.splitlines() if rule in ln)
    return line[line.index(rule):]


def test_backbone_and_swap_refuse_a_misfit_with_the_same_rule_wording_and_fitting_kernels():
    with pytest.raises(ValueError) as ours:
        SoftFreeSwin(arch=dict(TINY_SWIN), attn_cfg='nystrom')
    with pytest.raises(SwapError) as theirs:
        swap_attention(build('timm Swin'), 'nystrom')
    rule = 'it cannot honour a mask, but'
    ours_why, theirs_why = _reason(str(ours.value), rule), _reason(str(theirs.value), rule)
    fitting = ', '.join(n for n in list_attentions() if kernel_class(n).supports_mask)  # written from the abilities
    assert ours_why.endswith(f'kernels that can: {fitting}') and theirs_why.endswith(f'kernels that can: {fitting}')
    assert "SoftFreeSwin: attention kernel 'nystrom' cannot be used in stage 0" in str(ours.value)
    assert "attention kernel 'nystrom' cannot be used here: it cannot honour a mask" in str(theirs.value)

    with pytest.raises(ValueError) as ours:
        SoftFreeSwin(arch=dict(TINY_SWIN), attn_cfg='synthesizer', global_window=True)
    with pytest.raises(SwapError) as theirs:
        swap_attention(build('mmpretrain ViT'), 'synthesizer')
    rule = 'its learned weights are tied to token positions up to a fixed length (fixed_length), but'
    fitting = ', '.join(n for n in list_attentions() if not kernel_class(n).fixed_length)
    for msg in (str(ours.value), str(theirs.value)):
        assert _reason(msg, rule).endswith(f'kernels that fit: {fitting}')


@pytest.mark.parametrize('kernel', list_attentions())
def test_each_rule_refuses_exactly_the_kernels_that_lack_its_ability(kernel):
    cfg = {'synthesizer': dict(type='synthesizer', max_len=16)}.get(kernel, kernel)
    kern = build_attention(cfg, num_heads=2, head_dim=8)
    lacks = {'mask': not kern.supports_mask, 'length': kern.fixed_length, 'grid': kern.needs_hw,
             'ties_qk': bool(getattr(kern, 'tie_qk', False))}
    sites = {'mask': Site(masks='m'), 'length': Site(varying='v'), 'grid': Site(no_grid='g'),
             'ties_qk': Site(cross='c')}
    for code, site in sites.items():
        got, why = misfit(kern, site)
        assert (got == code) == lacks[code], (code, why)
        assert bool(why) == bool(got)
    assert misfit(kern, Site()) == ('', '')
    # prefix tokens beside the grid: refused only for a grid kernel and only when they have no kernel of their own
    assert misfit(kern, Site(prefix=2), prefix_kernel=False)[0] == ('prefix' if kern.needs_hw else '')
    assert misfit(kern, Site(prefix=2), prefix_kernel=True) == ('', '')


# ------------------------------------------------------------------------------------------------ registration
class ToyAttention(nn.Module):
    """A foreign attention layout no adapter knows: packed qkv, softmax, output projection."""

    def __init__(self, dim=16, num_heads=2):
        super().__init__()
        self.num_heads, self.qkv, self.proj = num_heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


def _toy_layout(m, path, model):
    need(m, 'qkv', 'proj', 'num_heads')
    return Layout(num_heads=m.num_heads, head_dim=m.qkv.in_features // m.num_heads, nq=5, nk=5,
                  scale=(m.qkv.in_features // m.num_heads) ** -0.5, no_grid='toy tokens have no grid',
                  varying='any length', where='toy tokens')


def _toy_forward(self, x):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    out = mix(self.kernel, q, k, v, None, q.shape[-1] ** -0.5, None, None, 0.0, self.training)
    return self.proj(out.transpose(1, 2).reshape(b, n, c))


def test_one_register_call_adds_a_layout_that_swaps_with_softmax_parity_and_the_fit_rules():
    key = f'{ToyAttention.__module__}.{ToyAttention.__qualname__}'
    ref = ToyAttention().eval()
    with pytest.raises(SwapError, match='no adapter for this attention layout'):
        swap_attention(copy.deepcopy(ref), 'softmax')
    register('toy attention', [key], _toy_layout, _toy_forward)
    try:
        model = swap_attention(copy.deepcopy(ref), 'softmax')
        x = torch.randn(2, 7, 16)
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert swap_summary(model)[0]['adapter'] == 'toy attention'
        with pytest.raises(SwapError) as info:  # the layout's demands go through the same rules
            swap_attention(copy.deepcopy(ref), 'inline')
        assert info.value.refusals[0][1] == 'grid' and 'toy tokens have no grid' in str(info.value)
    finally:
        del ADAPTERS[key]


def test_every_adapter_file_is_imported_and_registers_its_library():
    folder = os.path.join(os.path.dirname(softfree_mm.__file__), 'swap', 'adapters')
    files = {f[:-3] for f in os.listdir(folder) if f.endswith('.py') and f != '__init__.py'}
    registered = {ad.forward.__module__.rpartition('.')[2] for ad in ADAPTERS.values()}
    assert files <= registered, files - registered
    libraries = {t.split('.')[0] for t in ADAPTERS}
    assert {'timm', 'mmdet', 'mmseg', 'mmpretrain', 'mmcv'} <= libraries
