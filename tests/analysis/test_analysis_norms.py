"""Attention norms (polynomial attention, arXiv 2410.18613): the closed-form score Jacobians against autograd, and the paper's claims.

Guards: for every kernel with a score map, the test's own map S -> A (plain formulas) reproduces the kernel's
``attention_matrix``, and the closed-form per-row Jacobian norms equal autograd's Jacobian of that map (which is
block diagonal over rows); kernels without a score map raise NoScoreMap instead of giving a number; softmax keeps
||A||_F <= sqrt(N) and the Jacobian norm <= 2 sqrt(N) even on extreme scores; poly with c = 1/sqrt(N) grows like
sqrt(N) (log-log slope 1/2, the Gaussian-moment prediction), poly with a fixed c like N.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from softfree_mm.analysis.norms import (NoScoreMap, gaussian_score_moment, jacobian_row_sq, matrix_norms,
                                        norms_vs_n, poly_theory)
from softfree_mm.attention import build_attention

B, H, NQ, NK, D = 2, 2, 5, 6, 4


def _inputs(seed=0, mask=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, NQ, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, NK, D, generator=g, dtype=torch.float64)
    m = None
    if mask:
        m = torch.rand(B, 1, NQ, NK, generator=g) > 0.35
        m[..., 0] = True  # every row keeps a key
    return q, k, m


def _keep(m):
    return torch.ones(1, 1, NQ, NK, dtype=torch.float64) if m is None else m.double()


# each case: kernel config, the score map S(q, k) and the reference A = f(S) written from the formulas
def _dot(q, k, m, kern):
    return q @ k.transpose(-2, -1) / math.sqrt(D)


def _phi_dot(phi):
    return lambda q, k, m, kern: phi(q) @ phi(k).transpose(-2, -1)


def _taylor_s(q, k, m, kern):
    return 1.0 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)


def _softmax_a(s, m, kern):
    s = s.masked_fill(~m, float('-inf')) if m is not None else s
    return torch.softmax(s, -1)


def _poly_a(p, c=None):
    def f(s, m, kern):
        n = _keep(m).sum(-1, keepdim=True)
        coef = n.rsqrt() if c is None else c
        return coef * s ** p * _keep(m)
    return f


def _relu_a(s, m, kern):
    keep = _keep(m)
    return torch.relu(s) / keep.sum(-1, keepdim=True) * keep


def _sigmoid_a(s, m, kern):
    keep = _keep(m)
    return torch.sigmoid(s - torch.log(keep.sum(-1, keepdim=True))) * keep


def _normalised_a(eps):
    def f(s, m, kern):
        s = s * _keep(m)
        return s / (s.sum(-1, keepdim=True) + eps)
    return f


def _inline_s(q, k, m, kern):
    return q @ k.transpose(-2, -1) / math.sqrt(D)


def _inline_a(s, m, kern):
    keep = _keep(m)
    n = keep.sum(-1, keepdim=True)
    mean = (s * keep).sum(-1, keepdim=True) / n
    return (s / n + (1.0 - mean) / n) * keep


CASES = {
    'softmax': (dict(type='softmax'), _dot, _softmax_a),
    'poly3': (dict(type='poly', degree=3), _dot, _poly_a(3)),
    'poly1': (dict(type='poly', degree=1), _dot, _poly_a(1)),
    'poly2_fixed': (dict(type='poly', degree=2, scale=0.25), _dot, _poly_a(2, 0.25)),
    'relu': (dict(type='relu'), _dot, _relu_a),
    'sigmoid': (dict(type='sigmoid'), _dot, _sigmoid_a),
    'linear': (dict(type='linear'), _phi_dot(lambda x: F.elu(x) + 1.0), _normalised_a(1e-6)),
    'linear_relu': (dict(type='linear', feature_map='relu'), _phi_dot(torch.relu), _normalised_a(1e-6)),
    'taylor': (dict(type='taylor'), _taylor_s, _normalised_a(0.0)),
    'inline': (dict(type='inline', local_residual=False), _inline_s, _inline_a),
}


def _autograd_row_sq(f, s, m, kern):
    """Squared Frobenius norms of the per-row blocks of autograd's Jacobian dA/dS; asserts off-row blocks are 0."""
    jac = torch.autograd.functional.jacobian(lambda x: f(x, m, kern), s)  # (B, H, NQ, NK, B, H, NQ, NK)
    jac = jac.reshape(B * H * NQ, NK, B * H * NQ, NK)
    eye = torch.eye(B * H * NQ, dtype=torch.bool)
    assert jac.permute(0, 2, 1, 3)[~eye].abs().max() == 0  # a row depends on its own scores only
    diag = jac.permute(0, 2, 1, 3)[eye]  # (rows, NK, NK)
    return (diag ** 2).sum((-2, -1)).reshape(B, H, NQ)


@pytest.mark.parametrize('mask', [False, True], ids=['nomask', 'mask'])
@pytest.mark.parametrize('case', list(CASES))
def test_closed_form_score_jacobian_equals_autograd(case, mask):
    cfg, score, f = CASES[case]
    q, k, m = _inputs(1, mask)
    kern = build_attention(cfg, num_heads=H, head_dim=D)
    s = score(q, k, m, kern)
    a_ref = f(s, m, kern)
    a_kern = kern.attention_matrix(q, k, scale=None, mask=m)
    torch.testing.assert_close(a_kern, a_ref, rtol=1e-10, atol=1e-12)  # the score map is the kernel's
    got = jacobian_row_sq(kern, q, k, mask=m)
    torch.testing.assert_close(got, _autograd_row_sq(f, s, m, kern), rtol=1e-9, atol=1e-12)


def test_synthesizer_jacobian_is_the_softmax_of_its_logits():
    kern = build_attention(dict(type='synthesizer', mode='random', max_len=8), num_heads=H, head_dim=D).double()
    q, k, _ = _inputs(2)
    logits = kern.table[:, :NQ, :NK].unsqueeze(0).expand(B, H, NQ, NK).clone()
    torch.testing.assert_close(kern.attention_matrix(q, k), torch.softmax(logits, -1))
    torch.testing.assert_close(jacobian_row_sq(kern, q, k), _autograd_row_sq(_softmax_a, logits, None, kern))


@pytest.mark.parametrize('name', ['efficient', 'soft', 'nystrom'])
def test_kernels_without_a_score_map_say_so_instead_of_a_number(name):
    kern = build_attention(dict(type=name), num_heads=H, head_dim=D)
    q = torch.randn(1, H, 16, D)
    with pytest.raises(NoScoreMap, match=name):
        jacobian_row_sq(kern, q, q, hw=(4, 4))
    res = matrix_norms(kern, dict(q=q, k=q, hw=(4, 4), scale=None, bias=None, mask=None))
    assert res['jac'] is None and torch.isfinite(res['fro']).all()


def test_matrix_norms_are_the_frobenius_norms_over_real_query_rows():
    q, k, m = _inputs(3, mask=True)
    kern = build_attention('softmax')
    valid = torch.tensor([[True, True, False, True, True], [True, False, False, True, True]])
    res = matrix_norms(kern, dict(q=q, k=k, hw=None, scale=None, bias=None, mask=m), valid)
    a = _softmax_a(_dot(q, k, m, kern), m, kern) * valid[:, None, :, None]
    torch.testing.assert_close(res['fro'], a.pow(2).sum((-2, -1)).sqrt())
    j = _autograd_row_sq(_softmax_a, _dot(q, k, m, kern), m, kern) * valid[:, None, :]
    torch.testing.assert_close(res['jac'], j.sum(-1).sqrt())
    keys = (m.double().sum(-1)[:, 0] * valid).sum(-1) / valid.sum(-1)  # mean valid keys per real row
    torch.testing.assert_close(res['keys'], keys[:, None].expand(B, H))


@pytest.mark.parametrize('score_scale', [1.0, 30.0])
def test_softmax_frobenius_norm_never_exceeds_sqrt_n_nor_its_jacobian_2_sqrt_n(score_scale):
    """Polynomial-attention paper: ||softmax(S)||_F <= sqrt(N) and ||J||_F <= 2 sqrt(N), for any scores (here also extreme ones)."""
    kern = build_attention('softmax')
    for n in (4, 16, 64):
        q = torch.randn(3, 2, n, 8) * score_scale
        k = torch.randn(3, 2, n, 8) * score_scale
        res = matrix_norms(kern, dict(q=q, k=k, hw=None, scale=None, bias=None, mask=None))
        assert (res['fro'] <= math.sqrt(n) * (1 + 1e-6)).all()
        assert (res['jac'] <= 2 * math.sqrt(n) * (1 + 1e-6)).all()
    # one-hot rows reach the bound exactly
    q = torch.eye(8).view(1, 1, 8, 8) * 1e4
    res = matrix_norms(kern, dict(q=q, k=q, hw=None, scale=1.0, bias=None, mask=None))
    assert abs(float(res['fro'][0, 0]) - math.sqrt(8)) < 1e-5


def test_poly_with_inverse_sqrt_n_grows_like_sqrt_n():
    """Polynomial-attention paper: x^3 / sqrt(N) has ||A||_F ~ sqrt(N E[S^6]) (log-log slope 1/2) and ||J||_F ~ sqrt(N); with a fixed
    constant it grows like N."""
    sides = (8, 16, 32)
    rows = norms_vs_n([dict(type='poly', degree=3), dict(type='poly', degree=3, scale=0.1)], sides, heads=2,
                      head_dim=16, batch=2)
    ns = [s * s for s in sides]

    def slope(label, key):
        ys = [r[key] for r in rows if r['kernel'] == label]
        return (math.log(ys[-1]) - math.log(ys[0])) / (math.log(ns[-1]) - math.log(ns[0])), ys

    s_fro, fro = slope('poly:degree=3', 'fro')
    s_jac, _ = slope('poly:degree=3', 'jac')
    assert 0.45 < s_fro < 0.55 and 0.45 < s_jac < 0.55, (s_fro, s_jac)
    for n, v in zip(ns, fro):
        assert abs(v / poly_theory(n, 3, 16)['fro'] - 1) < 0.2
    s_fixed, _ = slope('poly:degree=3,scale=0.1', 'fro')
    assert 0.95 < s_fixed < 1.05, s_fixed


def test_gaussian_score_moments_match_sampling():
    assert gaussian_score_moment(2, 7) == pytest.approx(1.0)
    assert gaussian_score_moment(6, 16) == pytest.approx(15 * 16 * 18 * 20 / 16 ** 3)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(200000, 8, generator=g, dtype=torch.float64), torch.randn(200000, 8, generator=g,
                                                                                 dtype=torch.float64)
    s = (q * k).sum(-1) / math.sqrt(8)
    assert float((s ** 4).mean()) == pytest.approx(gaussian_score_moment(4, 8), rel=0.05)
