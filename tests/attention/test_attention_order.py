"""The association rule: every kernel with two orders, ``(phi(q) phi(k)^T) v`` and ``phi(q) (phi(k)^T v)``, takes the
one with fewer weighted multiply-adds for the call's shapes (``dispatch.order``); both orders give the same output;
``impl`` and ``SOFTFREE_ATTN_IMPL`` force either; ``flops()`` counts the order that runs."""
import pytest
import torch

from softfree_mm.attention import build_attention, dispatch, list_attentions

F64 = torch.float64
# the token geometry (N >> d) and XCiT's channel geometry (its "tokens" are a head's d_h channels, its "head_dim" the
# image's N tokens): d_h = 8, N = 144
TOKENS = dict(nq=144, nk=144, d=8, hw=(12, 12))
CHANNELS = dict(nq=8, nk=8, d=144, hw=None)


def _two_order_kernels():
    """Every registered kernel that declares two orders (read from the registry, so a new one is tested too)."""
    out = []
    for name in list_attentions():
        cfg = dict(type=name, local_residual=False) if name == 'inline' else \
            dict(type=name, local_conv=False) if name == 'flatten' else dict(type=name)
        kern = build_attention(cfg, num_heads=2, head_dim=8)
        if kern.order_costs(16, 16, 8, 8) is not None:
            out.append(cfg)
    return out


KERNELS = _two_order_kernels()


def _qkv(nq, nk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, d, generator=g, dtype=F64) * 0.5 for n in (nq, nk, nk))


def _kernel(cfg, impl, d):
    args = dict(cfg, impl=impl)
    return build_attention(args, num_heads=2, head_dim=d if cfg['type'] in ('performer', 'flatten') else None)


def test_every_kernel_with_a_factorised_form_declares_two_orders():
    names = {c['type'] for c in KERNELS}
    assert {'linear', 'efficient', 'taylor', 'cosformer', 'performer', 'flatten', 'inline', 'poly'} <= names
    assert not names & {'softmax', 'relu', 'sigmoid', 'soft', 'nystrom', 'synthesizer'}


@pytest.mark.parametrize('cfg', KERNELS, ids=lambda c: c['type'])
def test_auto_takes_the_factorised_order_over_tokens_and_the_explicit_one_over_channels(cfg):
    if cfg['type'] == 'poly':
        cfg = dict(cfg, degree=1)  # degree 3 builds C(d + 2, 3) features: explicit in both geometries at these sizes
    for geo, want in ((TOKENS, 'factorised'), (CHANNELS, 'explicit')):
        kern = _kernel(cfg, 'auto', geo['d'])
        assert kern.order(geo['nq'], geo['nk'], geo['d'], geo['d']) == want
        explicit, factorised = kern.order_costs(geo['nq'], geo['nk'], geo['d'], geo['d'])
        assert (explicit < factorised) == (want == 'explicit')
        assert kern.order(geo['nq'], geo['nk'], geo['d'], geo['d'], masked=True) == 'explicit'


@pytest.mark.parametrize('geo', [TOKENS, CHANNELS], ids=['tokens', 'channels'])
@pytest.mark.parametrize('cfg', KERNELS, ids=lambda c: c['type'])
def test_both_orders_give_the_same_output_and_the_forced_one_runs(cfg, geo, monkeypatch):
    if cfg['type'] in ('performer', 'flatten') and geo is CHANNELS:
        pytest.skip('built with a fixed head_dim, so it does not fit channel attention (the support table says no)')
    if cfg['type'] == 'poly' and geo is CHANNELS:
        cfg = dict(cfg, degree=1)  # degree 3 over 144 "channels" would build C(146, 3) features a row: seconds
    q, k, v = _qkv(geo['nq'], geo['nk'], geo['d'])
    outs = {}
    for impl in dispatch.ORDERS:
        kern = _kernel(cfg, impl, geo['d']).to(F64)
        ran = []
        if impl == 'factorised':  # the factorised order never builds the Nq x Nk matrix
            monkeypatch.setattr(kern, '_matrix', lambda *a, **kw: ran.append('explicit'))
        outs[impl] = kern(q, k, v, hw=geo['hw'])
        assert not ran
    torch.testing.assert_close(outs['explicit'], outs['factorised'], rtol=1e-9, atol=1e-9)


def test_the_environment_forces_an_order_on_every_kernel_with_two(monkeypatch):
    kern = build_attention('linear')
    assert kern.order(8, 8, 144, 144) == 'explicit'
    monkeypatch.setenv(dispatch.IMPL_ENV, 'factorised')
    assert kern.order(8, 8, 144, 144) == 'factorised'
    assert kern.order(8, 8, 144, 144, masked=True) == 'explicit'  # a mask leaves no choice
    assert kern.flops(8, 8, 144, 144) == (8 + 8) * 144 * 144 + 8 * 144
    monkeypatch.setenv(dispatch.IMPL_ENV, 'fused')  # a quadratic path of the pointwise kernels: the rule decides
    assert kern.order(144, 144, 8, 8) == 'factorised' and kern.order(8, 8, 144, 144) == 'explicit'
    assert build_attention(dict(type='poly', degree=1)).order(144, 144, 8, 8) == 'explicit'  # poly: its quadratic path
    monkeypatch.setenv(dispatch.IMPL_ENV, 'explicit')
    assert build_attention(dict(type='poly', degree=1)).order(144, 144, 8, 8) == 'explicit'
    assert build_attention('inline', num_heads=2, head_dim=8).order(144, 144, 8, 8) == 'explicit'


def test_relu_and_sigmoid_take_factorised_from_the_environment_as_auto(monkeypatch):
    monkeypatch.setenv(dispatch.IMPL_ENV, 'factorised')
    q, k, v = _qkv(16, 16, 8)
    for name in ('relu', 'sigmoid'):
        ref = build_attention(dict(type=name, impl='explicit'))(q, k, v)
        torch.testing.assert_close(build_attention(name)(q, k, v), ref)


@pytest.mark.parametrize('cfg', KERNELS, ids=lambda c: c['type'])
def test_flops_count_the_order_that_runs(cfg):
    kern = _kernel(cfg, 'auto', 144)
    nq, nk, d = 8, 8, 144
    explicit = _kernel(cfg, 'explicit', d).flops(nq, nk, d, d)
    factorised = _kernel(cfg, 'factorised', d).flops(nq, nk, d, d)
    assert explicit < factorised  # channel geometry: the N x N product k^T v is the expensive one
    assert kern.flops(nq, nk, d, d) == explicit


@pytest.mark.parametrize('name,bad', [('linear', 'tiled'), ('inline', 'fused'), ('cosformer', 'fast'),
                                      ('relu', 'factorised'), ('performer', None)])
def test_an_impl_the_kernel_has_not_is_refused_at_build_naming_the_valid_ones(name, bad):
    with pytest.raises(ValueError, match=rf"{name}: impl must be one of .*'explicit'.*got {bad!r}"):
        build_attention(dict(type=name, impl=bad), num_heads=2, head_dim=8)


@pytest.mark.parametrize('cfg', [dict(type='inline'), dict(type='inline', local_residual='head'),
                                 dict(type='flatten', local_conv=True)], ids=['channel', 'head', 'flatten_conv'])
def test_the_local_terms_are_added_in_either_order(cfg):
    """InLine's residuals and FLatten's conv do not depend on the order: both orders still agree with them on."""
    q, k, v = _qkv(36, 36, 8)
    kern = build_attention(cfg, num_heads=2, head_dim=8).double()  # one set of learned weights for both orders
    outs = []
    for impl in dispatch.ORDERS:
        kern.impl = impl
        assert kern.order(36, 36, 8, 8) == impl
        outs.append(kern(q, k, v, hw=(6, 6)))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-9)
