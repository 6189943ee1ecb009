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

from softfree_mm.analysis.norms import gaussian_score_moment, norms_vs_n, poly_theory
from softfree_mm.attention import ATTENTION, AttentionKernel, ScoreMap, build_attention
from softfree_mm.engine.hooks.matrix_norms import JacobianSkipped, NoScoreMap, jacobian_row_sq, matrix_norms

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


def _performer_s(q, k, m, kern):
    # FAVOR+ features exp(w.x - |x|^2 / 2 - max) / sqrt(m) of x = q, k scaled by d^-1/4, the max over a query's
    # features and over all keys' (up to eps in the ratio, they cancel)
    def phi(x, dims):
        x = x * D ** -0.25
        e = x @ kern.projection.double().T - 0.5 * (x * x).sum(-1, keepdim=True)
        return torch.exp(e - e.amax(dims, keepdim=True)) / math.sqrt(kern.num_features)
    return phi(q, -1) @ phi(k, (-2, -1)).transpose(-2, -1)


def _cosformer_s(q, k, m, kern):
    i = torch.arange(1, NQ + 1, dtype=torch.float64).view(NQ, 1)
    j = torch.arange(1, NK + 1, dtype=torch.float64).view(1, NK)
    return torch.relu(q) @ torch.relu(k).transpose(-2, -1) * torch.cos(math.pi / 2 * (i - j) / max(NQ, NK))


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
    'performer': (dict(type='performer'), _performer_s, _normalised_a(1e-6)),
    'cosformer': (dict(type='cosformer'), _cosformer_s, _normalised_a(1e-6)),
}
UNMASKED = ('performer', 'cosformer')  # kernels without masks


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
    if mask and case in UNMASKED:
        pytest.skip(f'{case} takes no mask')
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
    assert kern.score_map(q, q, hw=(4, 4)) is None and kern.no_score_map
    with pytest.raises(NoScoreMap, match=name):
        jacobian_row_sq(kern, q, q, hw=(4, 4))
    res = matrix_norms(kern, dict(q=q, k=q, hw=(4, 4), scale=None, bias=None, mask=None))
    assert res['jac'] is None and res['note'] == f'{name}: {kern.no_score_map}' and torch.isfinite(res['fro']).all()


def _grid_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, 16, D, generator=g, dtype=torch.float64)
    return q, torch.randn(2, H, 16, D, generator=g, dtype=torch.float64)


@pytest.mark.parametrize('name', sorted(ATTENTION))
def test_every_declared_score_map_gives_the_kernels_matrix_and_its_closed_form_is_autograds(name):
    """Over the registry, each kernel's defaults (residuals and local convs included) on a 4x4 grid: the declared map
    reproduces attention_matrix, and its closed form equals autograd's rows of the same map."""
    from softfree_mm.engine.hooks.matrix_norms import autograd_row_sq
    kern = build_attention(dict(type=name, mix=True) if name == 'synthesizer' else name, num_heads=H,
                           head_dim=D).double()
    q, k = _grid_inputs(4)
    sm = kern.score_map(q, k, hw=(4, 4))
    if sm is None:
        assert kern.no_score_map, f'{name} gives no score map and no reason'
        return
    torch.testing.assert_close(sm.matrix(), kern.attention_matrix(q, k, hw=(4, 4)), rtol=1e-10, atol=1e-12)
    assert sm.row_jacobian_sq is not None, f'{name}: every built-in map has its closed form'
    torch.testing.assert_close(sm.row_jacobian_sq(sm.scores), autograd_row_sq(sm.weights, sm.scores),
                               rtol=1e-9, atol=1e-12)


class _SoftmaxByAutograd(AttentionKernel):
    """Softmax declared as a map without a closed form: the Jacobian must come from autograd."""

    name = 'softmax_by_autograd'

    def _score_map(self, q, k, hw, scale, bias, mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return ScoreMap(s, lambda x: torch.softmax(x, -1))

    def _matrix(self, q, k, hw, scale, bias, mask):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)


def test_a_map_without_closed_form_gets_autograds_jacobian_within_the_key_budget():
    q, k, _ = _inputs(5)
    kern = _SoftmaxByAutograd()
    want = jacobian_row_sq(build_attention('softmax'), q, k)
    torch.testing.assert_close(jacobian_row_sq(kern, q, k), want, rtol=1e-10, atol=1e-12)
    with pytest.raises(JacobianSkipped, match=f'Nk={NK} > max_autograd_keys={NK - 1}'):
        jacobian_row_sq(kern, q, k, max_autograd_keys=NK - 1)
    res = matrix_norms(kern, dict(q=q, k=k, hw=None, scale=None, bias=None, mask=None), max_autograd_keys=NK - 1)
    assert res['jac'] is None and 'max_autograd_keys' in res['note']


def test_a_kernel_that_declares_nothing_is_named_as_such():
    class Bare(AttentionKernel):
        name = 'bare'

        def _matrix(self, q, k, hw, scale, bias, mask):
            return torch.softmax(q @ k.transpose(-2, -1), -1)
    q, k, _ = _inputs(6)
    with pytest.raises(NoScoreMap, match="bare: the kernel declares no score map"):
        jacobian_row_sq(Bare(), q, k)


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
