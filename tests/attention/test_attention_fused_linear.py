"""The fused bidirectional linear-attention kernel (attention/fused_linear.py): linear (elu+1, relu), x/sqrt(N)
(poly degree 1) and InLine's injective linear part in their factorised order.

Without CUDA the Triton programs run under TRITON_INTERPRET=1 on CPU tensors. Guards: values and gradients of q, k, v
equal an independent reference (the N x N matrix, then A @ v, in float64) for every form and feature map, at sizes
that are no multiple of a block (and smaller than one), spanning several key chunks whose partial states are added,
head_dim 24 to 128, in fp32, bf16 and fp16; through the kernels the fused call is taken (counted launches) and equals
the torch path in value and gradient, a masked call never takes it (a key-masked one stays on the torch path in its
factorised order, a general mask takes the explicit one; masked key = deleted key); a
variant whose first-use check fails is not used, says so once, and the call still returns the torch path's numbers;
without the interpreter a CPU call never launches it. And poly's path choice reads its inputs' device.
"""
import logging

import pytest
import torch

from softfree_mm.attention import build_attention
from softfree_mm.attention import fused_linear as fl

TOL = {torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 1e-2}


@pytest.fixture
def interp(monkeypatch):
    pytest.importorskip('triton')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.delenv('SOFTFREE_ATTN_IMPL', raising=False)
    fl.reset()
    yield torch.device('cpu')
    fl.reset()


def _ref64(q, k, v, form, feature, alpha, beta, eps):
    """The formula written out in float64: phi, the full matrix, its normaliser, A @ v."""
    q, k, v = (t.double() for t in (q, k, v))
    phi = {'identity': lambda x: x, 'relu': torch.relu,
           'elu+1': lambda x: torch.where(x > 0, x + 1, torch.exp(x))}[feature]
    a = phi(q) @ phi(k).transpose(-2, -1)
    rows = a.sum(-1, keepdim=True)
    if form == 'normalised':
        a = a / (rows + eps)
    elif form == 'plain':
        a = alpha * a
    else:  # InLine: rows sum to one by subtraction
        a = alpha * a + (1 - alpha * rows) * beta
    return a @ v


def _rel(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max() / b.detach().double().abs().max())


@pytest.mark.parametrize('form,feature,d,dv,n,dtype', [
    ('normalised', 'elu+1', 24, 40, 83, torch.float32),   # 5 blocks + 3 rows: several chunks, the last partial
    ('normalised', 'relu', 32, 32, 9, torch.float32),     # fewer rows than a block
    ('plain', 'identity', 64, 48, 70, torch.bfloat16),
    ('injective', 'identity', 128, 128, 37, torch.float16),
    ('injective', 'relu', 40, 24, 83, torch.float32),
    ('normalised', 'elu+1', 24, 40, 51, torch.bfloat16),
])
def test_values_and_gradients_equal_the_explicit_formula(interp, form, feature, d, dv, n, dtype):
    g = torch.Generator().manual_seed(1)
    b, h = 2, 3
    q, k, v = ((torch.randn(b, h, n, c, generator=g) * 0.5).to(dtype).requires_grad_(True) for c in (d, d, dv))
    alpha, beta, eps = (0.8 / n, 1.0 / n, 1e-6) if form == 'injective' else (0.25, 1.0, 1e-6)
    out = fl.fused_linear(q, k, v, form, feature, alpha, beta, eps)
    assert out is not None and out.dtype == dtype and out.shape == (b, h, n, dv)
    dout = torch.randn(b, h, n, dv, generator=g).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = _ref64(*leaves, form, feature, alpha, beta, eps)
    want = torch.autograd.grad(ref, leaves, dout.double())
    for a, w in zip((out, *got), (ref, *want)):
        assert _rel(a, w) < TOL[dtype]
    assert [t.dtype for t in got] == [dtype] * 3


def test_the_key_pass_is_split_into_chunks_whose_states_add_up(interp):
    """batch 1 x 1 head: the key and query passes run as several programs (the interpreter's target of 4) whose
    partial states are added; the result is the one-chunk result's."""
    cfg = dict(fl.blocks(16, 16, torch.device('cpu')), feat=2, mode=0)
    assert fl._chunks(83, 1, cfg) == (32, 3) and fl._chunks(83, 8, cfg) == (96, 1)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 83, 16, generator=g) for _ in range(3))
    split = fl.FusedLinearAttention.apply(q, k, v, 'normalised', 'elu+1', 1.0, 1.0, 1e-6, dict(cfg, programs=4))
    whole = fl.FusedLinearAttention.apply(q, k, v, 'normalised', 'elu+1', 1.0, 1.0, 1e-6, dict(cfg, programs=1))
    assert _rel(split, whole) < 1e-6 and _rel(split, _ref64(q, k, v, 'normalised', 'elu+1', 1, 1, 1e-6)) < 1e-5


@pytest.mark.parametrize('cfg', [dict(type='linear'), dict(type='linear', feature_map='relu'),
                                 dict(type='poly', degree=1), dict(type='inline', local_residual=False),
                                 dict(type='inline', feature_map='relu', local_residual='head'),
                                 dict(type='inline')])
def test_the_kernels_take_it_in_their_factorised_order_with_the_torch_paths_numbers(interp, monkeypatch, cfg):
    g = torch.Generator().manual_seed(3)
    b, h, n, d = 2, 2, 64, 16
    q, k, v = (torch.randn(b, h, n, d, generator=g) * 0.5 for _ in range(3))
    kw = dict(hw=(8, 8))
    if cfg['type'] == 'inline' and cfg.get('local_residual', 'channel') == 'channel':
        kw['context'] = torch.randn(b, h * d, generator=g)
    dout = torch.randn(b, h, n, d, generator=g)
    kern = build_attention(cfg, num_heads=h, head_dim=d)

    def run():
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = kern(*leaves, **kw)
        return out, torch.autograd.grad(out, leaves, dout)

    before = dict(fl.LAUNCHES)
    fused, fused_grads = run()
    assert fl.LAUNCHES['forward'] > before['forward'] and fl.LAUNCHES['backward'] > before['backward']
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    before = dict(fl.LAUNCHES)
    plain, plain_grads = run()
    assert fl.LAUNCHES == before  # on CPU without the interpreter: never
    for a, w in zip((fused, *fused_grads), (plain, *plain_grads)):
        assert _rel(a, w) < 1e-5


@pytest.mark.parametrize('cfg', [dict(type='linear'), dict(type='poly', degree=1),
                                 dict(type='inline', local_residual=False)], ids=lambda c: c['type'])
def test_a_masked_call_never_takes_it_key_masked_stays_factorised_masked_key_equals_deleted_key(interp, cfg):
    """A key-only mask (1, 1, 1, Nk) keeps the factorised order on the torch path; a general mask takes the explicit
    order; neither launches the fused kernel, and a masked key is a deleted key."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=g) for _ in range(3))
    keep = torch.ones(1, 1, 1, 20, dtype=torch.bool)
    keep[..., 5] = False
    kern = build_attention(cfg, num_heads=2, head_dim=16)
    idx = [i for i in range(20) if i != 5]
    deleted = kern(q, k[:, :, idx], v[:, :, idx])
    for mask, order in ((keep, 'factorised order'), (keep.expand(1, 1, 20, 20), 'explicit order')):
        assert kern.describe_path(q, k, v, mask=mask).startswith(order)
        before = dict(fl.LAUNCHES)
        masked = kern(q, k, v, mask=mask)
        assert fl.LAUNCHES == before
        assert _rel(masked, deleted) < 1e-5


def test_a_variant_that_fails_its_check_is_not_used_and_says_so_once(interp, monkeypatch, caplog):
    """A wrong kernel (here: the check's reference made to disagree) is caught at first use; the call returns the
    torch path's numbers, the variant is not tried again, one log line names it and the cause."""
    monkeypatch.setattr(fl, 'reference', lambda *a, **k: _ref64(*a[:3], 'plain', 'identity', 2.0, 1.0, 0.0).float())
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))
    kern = build_attention(dict(type='linear'), num_heads=2, head_dim=16)
    calls = fl.LAUNCHES['forward']
    with caplog.at_level(logging.WARNING, logger='softfree_mm.attention'):
        out = kern(q, k, v)
        again = kern(q, k, v)
    lines = [r.getMessage() for r in caplog.records if 'fused normalised linear attention' in r.getMessage()]
    assert len(lines) == 1 and 'elu+1' in lines[0] and 'differs from the explicit formula' in lines[0]
    assert fl.LAUNCHES['forward'] == calls  # no call ran fused (the check's own launch is not a call's)
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    want = kern(q, k, v)
    assert torch.equal(out, want) and torch.equal(again, want)


def test_unsupported_calls_name_why():
    q = torch.randn(1, 1, 4, 8)
    assert fl.unsupported(q, q, q, 'normalised', 'elu+1').startswith('cpu tensors')
    assert "form 'causal'" in fl.unsupported(q, q, q, 'causal', 'elu+1')
    assert not fl.allowed(torch.empty(1, device='meta'))


def test_polys_path_choice_reads_its_inputs_device(monkeypatch):
    """At N = 65536, d = 64 the CPU weight of a monomial feature takes the factorised order and the CUDA weight the
    quadratic one: a choice that ignored the device (weighing CUDA as a CPU) would not see it. Here the CUDA weight
    is given to the 'meta' device, whose tensors cost nothing."""
    from softfree_mm.attention import poly
    kern = build_attention(dict(type='poly', degree=3), num_heads=4, head_dim=64)
    q = torch.empty(1, 4, 65536, 64, device='meta')
    cpu = torch.empty(1, 4, 8, 64)
    assert kern.order(65536, 65536, 64, 64, False, 'cpu') == 'factorised'
    monkeypatch.setitem(poly.FEATURE_WEIGHT, 'meta', poly.FEATURE_WEIGHT['cuda'])
    assert kern.uses_factorised(q, q, q) is False
    monkeypatch.setitem(poly.FEATURE_WEIGHT, 'meta', poly.FEATURE_WEIGHT['cpu'])
    assert kern.uses_factorised(q, q, q) is True
    assert cpu.device.type == 'cpu'
