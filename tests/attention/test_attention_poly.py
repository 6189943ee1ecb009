"""poly kernel: A = c * S^p * keep, c = 1/sqrt(N) or a fixed float, with a factorised O(N M dv) path."""
import math
import re

import numpy as np
import pytest
import torch

from softfree_mm.attention import build_attention
from softfree_mm.attention import poly as poly_module

F64 = torch.float64


def _rand(*shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype)


def reference_poly(q, k, v, p, c='sqrt_n', s=None, bias=None, mask=None):
    """The formula written out row by row in float64: out_i = sum_j c_i (s q_i.k_j + b_ij)^p keep_ij v_j."""
    b_, h_, nq, d = q.shape
    nk = k.shape[2]
    full = (b_, h_, nq, nk)
    bias = torch.zeros(full, dtype=F64) if bias is None else bias.to(F64).expand(full)
    keep = torch.ones(full, dtype=torch.bool) if mask is None else mask.expand(full)
    a = torch.zeros(full, dtype=F64)
    for b in range(b_):
        for h in range(h_):
            sh = d ** -0.5 if s is None else (float(s[h]) if torch.is_tensor(s) else s)
            for i in range(nq):
                n = int(keep[b, h, i].sum())
                ci = (1.0 / math.sqrt(max(n, 1))) if c == 'sqrt_n' else c
                for j in range(nk):
                    if keep[b, h, i, j]:
                        score = sh * float(q[b, h, i].double() @ k[b, h, j].double()) + float(bias[b, h, i, j])
                        a[b, h, i, j] = ci * score ** p
    return a, a @ v.double()


@pytest.mark.parametrize('p', [1, 2, 3])
@pytest.mark.parametrize('case', ['plain', 'bias_and_mask', 'head_temperature', 'fixed_c'])
def test_poly_forward_and_matrix_match_the_written_out_formula(p, case):
    q, k, v = _rand(2, 2, 5, 4, seed=1), _rand(2, 2, 6, 4, seed=2), _rand(2, 2, 6, 3, seed=3)
    c, s, bias, mask = 'sqrt_n', None, None, None
    if case == 'bias_and_mask':
        bias = _rand(2, 5, 6, seed=4)  # (h, Nq, Nk), as a relative position bias
        mask = _rand(2, 1, 5, 6, seed=5) > 0  # per-row key counts differ, so c = 1/sqrt(N) differs per row
    elif case == 'head_temperature':
        s = torch.tensor([0.7, 1.9], dtype=F64)  # XCiT-style per-head scale
    elif case == 'fixed_c':
        c = 0.25
    kern = build_attention(dict(type='poly', degree=p, scale=c), num_heads=2, head_dim=4)
    a_ref, out_ref = reference_poly(q, k, v, p, c, s, bias, mask)
    torch.testing.assert_close(kern.attention_matrix(q, k, scale=s, bias=bias, mask=mask), a_ref,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v, scale=s, bias=bias, mask=mask), out_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('p', [1, 2, 3, 4])
def test_monomial_features_inner_product_is_the_power_of_the_dot_product(p):
    a, b = _rand(7, 3, seed=p), _rand(7, 3, seed=10 + p)
    fa = poly_module.monomial_features(a, p, weighted=True)
    fb = poly_module.monomial_features(b, p, weighted=False)
    assert fa.shape[-1] == math.comb(3 + p - 1, p)  # one feature per monomial, not 3^p
    torch.testing.assert_close((fa * fb).sum(-1), (a * b).sum(-1) ** p, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('p', [1, 2, 3])
def test_poly_factorised_path_equals_explicit_path(p, monkeypatch):
    kern = build_attention(dict(type='poly', degree=p))
    q, k, v = _rand(1, 2, 50, 2, seed=20), _rand(1, 2, 60, 2, seed=21), _rand(1, 2, 60, 3, seed=22)
    # d = 2 makes the factorised path the cheaper one at this size, so forward takes it
    assert kern.uses_factorised(q, k, v)
    explicit = kern.attention_matrix(q, k) @ v
    torch.testing.assert_close(kern(q, k, v), explicit, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kern.factorised(q, k, v), explicit, rtol=1e-12, atol=1e-12)
    # chunking over tokens (to bound the features' memory) changes nothing
    monkeypatch.setattr(poly_module, '_CHUNK_ELEMENTS', 7)
    torch.testing.assert_close(kern.factorised(q, k, v), explicit, rtol=1e-12, atol=1e-12)
    # a per-head tensor scale is folded into q on the factorised path
    s = torch.tensor([0.5, 1.5], dtype=F64)
    torch.testing.assert_close(kern(q, k, v, scale=s), kern.attention_matrix(q, k, scale=s) @ v,
                               rtol=1e-12, atol=1e-12)


def test_poly_factorised_backward_saves_no_features_and_its_gradients_are_the_explicit_paths():
    """With autograd the factorised path recomputes each chunk's monomial features in backward: what forward saves
    stays far below one copy of the (B, h, N, M) features, and the gradients are the explicit path's."""
    kern = build_attention(dict(type='poly', degree=3))
    q, k, v = (_rand(1, 2, 600, 8, seed=30 + i).requires_grad_(True) for i in range(3))
    assert kern.uses_factorised(q, k, v)
    features = q.shape[0] * q.shape[1] * q.shape[2] * kern.num_features(8) * q.element_size()
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = kern(q, k, v)
    assert sum(saved) < features / 3, (sum(saved), features)  # q, k, v and kv: about a fifth
    w = _rand(*out.shape, seed=40)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref = torch.autograd.grad(((kern.attention_matrix(q2, k2) @ v2) * w).sum(), (q2, k2, v2))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


def test_poly_path_choice_follows_the_flop_count():
    k3 = build_attention(dict(type='poly', degree=3))
    small = _rand(1, 1, 16, 32)
    big = torch.empty(1, 1, 20000, 8)
    assert not k3.uses_factorised(small, small, small)  # C(34, 3) = 5984 features > 16 keys
    assert k3.uses_factorised(big, big, big)  # C(10, 3) = 120 features << 20000 keys
    assert k3.uses_factorised(big, big, big, mask=torch.ones(1, 1, dtype=torch.bool))  # key-only: the order stays
    assert not k3.uses_factorised(big, big, big, mask=torch.ones(20000, 1, dtype=torch.bool))  # a row per query
    assert not k3.uses_factorised(big, big, big, bias=torch.zeros(1))
    explicit, factorised = k3.path_costs(16, 16, 32, 32)
    assert explicit == 16 * 16 * (32 + 32 + 3) and factorised > explicit
    # on a GPU a feature element weighs 2048 multiply-adds, not 8: at N = 65536, d = 64 the quadratic path (the
    # fused kernel there) is taken, the factorised one on a CPU
    m = k3.num_features(64)
    for device, weight in (('cpu', 8), ('cuda', 2048), ('mps', 8)):
        e, f = k3.path_costs(65536, 65536, 64, 64, device)
        assert (e, f) == (65536 ** 2 * 131, weight * 2 * 65536 * m * 2 + 2 * 65536 * m * 64), device
        assert (f < e) == (device != 'cuda')


def test_poly_complexity_is_linear_only_for_degree_one():
    assert build_attention(dict(type='poly', degree=1)).complexity == 'linear'
    assert build_attention(dict(type='poly', degree=3)).complexity == 'quadratic'


def test_poly_masked_key_equals_deleted_key_row_by_row():
    kern = build_attention('poly')
    q, k, v = _rand(1, 2, 6, 4, seed=30), _rand(1, 2, 9, 4, seed=31), _rand(1, 2, 9, 3, seed=32)
    mask = _rand(1, 1, 6, 9, seed=33) > -0.3
    mask[..., 0] = True
    mask[..., 8] = False
    k = k.clone()
    k[:, :, 8] = 1e6  # a key no row may see, with a huge value, changes nothing
    out = kern(q, k, v, mask=mask)
    for i in range(6):
        keep = mask[0, 0, i]
        alone = kern(q[:, :, i:i + 1], k[:, :, keep], v[:, :, keep])
        torch.testing.assert_close(out[:, :, i:i + 1], alone, rtol=1e-12, atol=1e-12)


def test_poly_row_without_valid_key_is_zero_not_nan():
    kern = build_attention('poly')
    q, k, v = _rand(1, 1, 3, 4, seed=40), _rand(1, 1, 5, 4, seed=41), _rand(1, 1, 5, 4, seed=42)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out = kern(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.all(out[:, :, 1] == 0) and torch.all(out[:, :, 0] != 0)


def test_poly_frobenius_norm_grows_like_sqrt_n():
    """q, k ~ N(0, 1), default score scale s = d^-1/2 (so s q.k has unit variance), p = 3, c = 1/sqrt(N):
    ||A||_F ~ sqrt(15 N); the log-log slope over N = 64..4096 is 1/2. A is built in row blocks."""
    kern = build_attention('poly')
    sizes = [64, 256, 1024, 4096]
    norms = []
    for n in sizes:
        per_seed = []
        for seed in range(3):
            q, k = _rand(1, 1, n, 4, seed=seed, dtype=torch.float32), _rand(1, 1, n, 4, seed=99 + seed,
                                                                            dtype=torch.float32)
            sq = sum(kern.attention_matrix(q[:, :, r:r + 1024], k).square().sum(dtype=F64) for r in range(0, n, 1024))
            per_seed.append(float(sq.sqrt()))
        norms.append(np.mean(per_seed))
    slope = np.polyfit(np.log(sizes), np.log(norms), 1)[0]
    assert abs(slope - 0.5) < 0.1, f'log-log slope {slope:.3f}, norms {norms}'


def test_poly_float16_overflow_is_inf_never_clamped_and_the_loss_scaler_backs_off():
    """Scores of 60 cubed (216000) exceed float16's 65504: the float16 output and the float16 gradients become inf
    (a plain cast of the float32 result), never a value clamped at 65504, so that fp16 loss scaling sees the
    overflow: torch's GradScaler skips the step and halves its scale."""
    kern = build_attention('poly')
    d = 4
    big = torch.finfo(torch.float16).max
    direction = torch.nn.functional.normalize(_rand(1, 1, 1, d, seed=50), dim=-1)
    q = (direction * math.sqrt(60 * math.sqrt(d))).expand(1, 1, 4, d)
    k = torch.cat([q, -q], dim=2)
    v = torch.cat([torch.ones(1, 1, 4, d), torch.zeros(1, 1, 4, d)], dim=2)  # no cancellation
    q16, k16, v16 = (t.half().clone().requires_grad_(True) for t in (q, k, v))
    ref = kern(q16.detach().float(), k16.detach().float(), v16.detach().float())  # same inputs, float32
    assert ref.abs().max() > big
    out = kern(q16, k16, v16)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, ref.half(), rtol=1e-3, atol=0)  # inf exactly where float32 overflows float16
    assert torch.isinf(out).any() and not (out.abs() == big).any()
    out.float().sum().backward()
    assert torch.isinf(v16.grad).any() and not (v16.grad.abs() == big).any()

    # the loss scaler trusts it: a step with an overflowed gradient is skipped and the scale halves
    weight = torch.nn.Parameter(torch.ones(d))
    opt = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    loss = kern(q16.detach(), k16.detach(), (v16.detach().float() * weight).half()).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 9 and torch.equal(weight.detach(), torch.ones(d))


def test_poly_under_bfloat16_autocast_runs_in_float32():
    kern = build_attention('poly')
    q, k, v = (_rand(1, 2, 8, 4, seed=s, dtype=torch.float32) for s in (60, 61, 62))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kern(q, k, v)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, kern(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize('degree', [0, -2, 2.5, True, '3'])
def test_poly_bad_degree_is_an_error_naming_it(degree):
    with pytest.raises(ValueError, match=re.escape(f"poly: degree must be an int >= 1, got {degree!r}")):
        build_attention(dict(type='poly', degree=degree))


@pytest.mark.parametrize('scale', [-1.0, 0, 'sqrt_N', float('inf'), None])
def test_poly_bad_scale_is_an_error_naming_it_and_the_options(scale):
    expected = r"poly: scale must be 'sqrt_n'.*or a float > 0; got " + re.escape(repr(scale))
    with pytest.raises(ValueError, match=expected):
        build_attention(dict(type='poly', scale=scale))


# ---------------------------------------------------------------------------------------------- qk_norm (our option)
def _standardise_by_hand(x):
    """Each row over the last dim: (x - mean) / sqrt(population variance + 1e-6), written out."""
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]
    return (x - mean) / torch.sqrt(var + 1e-6)


@pytest.mark.parametrize('p', [1, 3])
@pytest.mark.parametrize('case', ['plain', 'bias_and_mask', 'head_temperature'])
def test_poly_qk_norm_is_the_formula_on_standardised_rows(p, case):
    """qk_norm=True: the written-out formula on q and k standardised row by row (mean 0, variance 1 over the head
    dim), the matrix, the score map and forward alike."""
    q, k, v = _rand(2, 2, 5, 4, seed=51) * 7 + 3, _rand(2, 2, 6, 4, seed=52) * 0.2 - 1, _rand(2, 2, 6, 3, seed=53)
    s, bias, mask = None, None, None
    if case == 'bias_and_mask':
        bias, mask = _rand(2, 5, 6, seed=54), _rand(2, 1, 5, 6, seed=55) > 0
    elif case == 'head_temperature':
        s = torch.tensor([0.7, 1.9], dtype=F64)
    kern = build_attention(dict(type='poly', degree=p, qk_norm=True), num_heads=2, head_dim=4)
    a_ref, out_ref = reference_poly(_standardise_by_hand(q), _standardise_by_hand(k), v, p, 'sqrt_n', s, bias, mask)
    torch.testing.assert_close(kern.attention_matrix(q, k, scale=s, bias=bias, mask=mask), a_ref,
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kern.score_map(q, k, scale=s, bias=bias, mask=mask).matrix(), a_ref,
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kern(q, k, v, scale=s, bias=bias, mask=mask), out_ref, rtol=1e-10, atol=1e-10)
    # off (the default, the paper's): the raw q and k
    plain = build_attention(dict(type='poly', degree=p), num_heads=2, head_dim=4)
    torch.testing.assert_close(plain(q, k, v, scale=s, bias=bias, mask=mask),
                               reference_poly(q, k, v, p, 'sqrt_n', s, bias, mask)[1], rtol=1e-10, atol=1e-10)


def test_poly_qk_norm_bounds_the_output_however_q_and_k_grow():
    """The property the option is for: scaling q and k up (the score growth segmentation training shows) leaves
    the output unchanged with qk_norm and multiplies it by the cube of the factor without; every score stays within
    s * d = sqrt(d)."""
    q, k, v = _rand(1, 2, 40, 8, seed=60), _rand(1, 2, 40, 8, seed=61), _rand(1, 2, 40, 5, seed=62)
    normed = build_attention(dict(type='poly', degree=3, qk_norm=True))
    raw = build_attention(dict(type='poly', degree=3))
    # equal up to the variance's epsilon (1e-6 next to variances of 1 and 900)
    torch.testing.assert_close(normed(q * 30, k * 30, v), normed(q, k, v), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(raw(q * 30, k * 30, v), raw(q, k, v) * 30 ** 6, rtol=1e-9, atol=1e-3)
    s = normed.score_map(q * 30, k * 30).scores
    assert float(s.abs().max()) <= 8 ** 0.5 + 1e-9


def test_poly_qk_norm_paths_agree_and_gradients_match_the_explicit_path(monkeypatch):
    """The factorised, tiled and explicit paths give one output and one gradient with qk_norm, q and k gradients
    included (through the standardisation)."""
    q, k, v = (_rand(1, 2, 50, 2, seed=70 + i).requires_grad_(True) for i in range(3))
    w = _rand(1, 2, 50, 2, seed=74)
    outs, grads = {}, {}
    for impl in ('factorised', 'tiled', 'explicit'):
        kern = build_attention(dict(type='poly', degree=3, qk_norm=True, impl=impl))
        if impl == 'tiled':
            monkeypatch.setattr('softfree_mm.attention.dispatch.tile_for', lambda q, k: (16, 16))
        assert kern.path(q, k, v) == impl
        outs[impl] = kern(q, k, v)
        grads[impl] = torch.autograd.grad((outs[impl] * w).sum(), (q, k, v))
    for impl in ('factorised', 'tiled'):
        torch.testing.assert_close(outs[impl], outs['explicit'], rtol=1e-10, atol=1e-10)
        for g, r in zip(grads[impl], grads['explicit']):
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('value', [1, 'yes', None])
def test_poly_bad_qk_norm_is_an_error_naming_it(value):
    with pytest.raises(ValueError, match=re.escape(f'poly: qk_norm must be True or False, got {value!r}')):
        build_attention(dict(type='poly', qk_norm=value))


def test_poly_qk_norm_adds_no_parameters_and_its_memory_declares_the_standardised_rows():
    kern = build_attention(dict(type='poly', degree=3, qk_norm=True))
    assert not list(kern.parameters())
    plain = build_attention(dict(type='poly', degree=3))
    for nq, nk, d in ((64, 64, 32), (4096, 4096, 8)):
        saved, largest = kern.memory(nq, nk, d, d)
        saved0, largest0 = plain.memory(nq, nk, d, d)
        assert (saved - saved0, largest) == ((nq + nk) * d, largest0)
