"""linear, efficient and taylor kernels: O(N) factorised path without a mask, explicit A with one."""
import math

import pytest
import torch
import torch.nn.functional as F

from softfree_mm.attention import build_attention

F64 = torch.float64
NAMES = ['linear', 'linear_relu', 'efficient', 'taylor']


def _rand(*shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype)


def _build(name, **kw):
    if name == 'linear_relu':
        return build_attention(dict(type='linear', feature_map='relu'), **kw)
    return build_attention(name, **kw)


def _weight_fn(name, k_all, keep_row):
    """For one (batch, head): a function q_i -> unnormalised weights over keys, from the written-out formula."""
    if name == 'linear':
        return lambda qi: [float((F.elu(qi) + 1) @ (F.elu(kj) + 1)) for kj in k_all]
    if name == 'linear_relu':
        return lambda qi: [float(qi.relu() @ kj.relu()) for kj in k_all]
    if name == 'taylor':
        return lambda qi: [1.0 + float(qi @ kj) / float(qi.norm() * kj.norm()) for kj in k_all]
    # efficient: sum_c softmax_d(q_i)_c * exp(k_jc) / sum_{valid j'} exp(k_j'c)
    valid = [kj for kj, ok in zip(k_all, keep_row) if ok]
    den = [sum(math.exp(float(kj[c])) for kj in valid) for c in range(k_all.shape[-1])]

    def eff(qi):
        sq = [math.exp(float(x)) for x in qi]
        sq = [x / sum(sq) for x in sq]
        return [sum(sq[c] * math.exp(float(kj[c])) / den[c] for c in range(len(den))) for kj in k_all]
    return eff


def reference(name, q, k, v, mask=None):
    """A row by row in float64 with sums over the row's valid keys; linear adds eps = 1e-6 to its denominator,
    efficient's weights are already normalised."""
    b_, h_, nq, _ = q.shape
    nk = k.shape[2]
    full = (b_, h_, nq, nk)
    keep = torch.ones(full, dtype=torch.bool) if mask is None else mask.expand(full)
    a = torch.zeros(full, dtype=F64)
    for b in range(b_):
        for h in range(h_):
            for i in range(nq):
                w = _weight_fn(name, k[b, h], keep[b, h, i])(q[b, h, i])
                w = [wj if keep[b, h, i, j] else 0.0 for j, wj in enumerate(w)]
                den = {'linear': sum(w) + 1e-6, 'linear_relu': sum(w) + 1e-6, 'taylor': sum(w), 'efficient': 1.0}
                a[b, h, i] = torch.tensor(w, dtype=F64) / den[name]
    return a, a @ v


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('masked', [False, True])
def test_forward_and_matrix_match_the_written_out_formula(name, masked):
    q, k, v = _rand(2, 2, 5, 4, seed=1), _rand(2, 2, 7, 4, seed=2), _rand(2, 2, 7, 3, seed=3)
    mask = None
    if masked:
        mask = _rand(2, 2, 5, 7, seed=4) > 0
        mask[..., 0] = True
    kern = _build(name, num_heads=2, head_dim=4)
    a_ref, out_ref = reference(name, q, k, v, mask)
    torch.testing.assert_close(kern.attention_matrix(q, k, mask=mask), a_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v, mask=mask), out_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('name', NAMES)
def test_factorised_path_equals_explicit_quadratic_path(name):
    """Without a mask forward never builds A; an all-True mask takes the explicit path: same output."""
    kern = _build(name)
    q, k, v = _rand(2, 3, 40, 8, seed=5), _rand(2, 3, 50, 8, seed=6), _rand(2, 3, 50, 5, seed=7)
    fast = kern(q, k, v)
    torch.testing.assert_close(fast, kern(q, k, v, mask=torch.ones(40, 50, dtype=torch.bool)),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast, kern.attention_matrix(q, k) @ v, rtol=1e-12, atol=1e-12)
    # and in float32 the two paths agree to float32 precision
    q32, k32, v32 = q.float(), k.float(), v.float()
    torch.testing.assert_close(kern(q32, k32, v32), kern(q32, k32, v32, mask=torch.ones(40, 50, dtype=torch.bool)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', NAMES)
def test_masked_key_equals_deleted_key_row_by_row(name):
    """Each row, with its own mask (as in Swin's shifted windows), gives the output of its valid keys alone;
    a key no row may see holds a huge value and still changes nothing (efficient's exp cannot underflow)."""
    kern = _build(name)
    q, k, v = _rand(1, 2, 6, 4, seed=8), _rand(1, 2, 9, 4, seed=9), _rand(1, 2, 9, 3, seed=10)
    mask = _rand(1, 1, 6, 9, seed=11) > -0.3
    mask[..., 0] = True
    mask[..., 8] = False
    k = k.clone()
    k[:, :, 8] = 1e4
    out = kern(q, k, v, mask=mask)
    for i in range(6):
        keep = mask[0, 0, i]
        alone = kern(q[:, :, i:i + 1], k[:, :, keep], v[:, :, keep])
        torch.testing.assert_close(out[:, :, i:i + 1], alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('name', NAMES)
def test_row_without_valid_key_is_zero_not_nan(name):
    kern = _build(name)
    q, k, v = _rand(1, 1, 3, 4, seed=12), _rand(1, 1, 5, 4, seed=13), _rand(1, 1, 5, 4, seed=14)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0] = False
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = kern(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.all(out[:, :, 0] == 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize('name', NAMES)
def test_score_scale_argument_is_accepted_and_ignored(name):
    kern = _build(name)
    q, k, v = _rand(1, 2, 6, 4, seed=15), _rand(1, 2, 6, 4, seed=16), _rand(1, 2, 6, 4, seed=17)
    torch.testing.assert_close(kern(q, k, v, scale=0.1), kern(q, k, v), rtol=0, atol=0)
    torch.testing.assert_close(kern(q, k, v, scale=torch.tensor([3.0, 0.2])), kern(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize('name', ['linear', 'efficient', 'taylor'])
def test_bias_is_an_error_naming_the_kernel_and_bias(name):
    kern = build_attention(name)
    q = _rand(1, 1, 4, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match=rf"'{name}' cannot take an additive score bias \(argument 'bias'\)"):
        kern(q, q, q, bias=torch.zeros(4, 4))
    with pytest.raises(ValueError, match=rf"'{name}'.*'bias'"):
        kern.attention_matrix(q, q, bias=torch.zeros(4, 4))


@pytest.mark.parametrize('bad', ['elu', 'softmax', None])
def test_bad_feature_map_is_an_error_listing_the_valid_ones(bad):
    with pytest.raises(ValueError, match=rf"linear: feature_map must be one of \('elu\+1', 'relu'\), got {bad!r}"):
        build_attention(dict(type='linear', feature_map=bad))


def test_taylor_weights_are_never_negative():
    """Keys pointing exactly away from a query give 1 + q^.k^ = 0 (up to rounding): clamped, never below zero."""
    kern = build_attention('taylor')
    q = _rand(1, 2, 8, 16, seed=18, dtype=torch.float32)
    k = torch.cat([-q * 3.7, q, _rand(1, 2, 8, 16, seed=19, dtype=torch.float32)], dim=2)
    a = kern.attention_matrix(q, k)
    assert (a >= 0).all()
    assert (a[..., :8].diagonal(dim1=-2, dim2=-1) < 1e-6).all()  # the antipodal key gets (almost) nothing
    torch.testing.assert_close(a.sum(-1), torch.ones(1, 2, 8))


@pytest.mark.parametrize('masked', [False, True])
def test_efficient_rows_sum_to_one(masked):
    kern = build_attention('efficient')
    q, k = _rand(2, 2, 10, 6, seed=20) * 3, _rand(2, 2, 12, 6, seed=21) * 3
    mask = None
    if masked:
        mask = _rand(2, 1, 10, 12, seed=22) > 0.5
        mask[..., 3] = True
    a = kern.attention_matrix(q, k, mask=mask)
    assert (a >= 0).all()
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 10, dtype=F64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('name', NAMES)
def test_linear_kernels_declare_linear_complexity_and_mask_support(name):
    kern = _build(name)
    assert kern.complexity == 'linear' and kern.supports_mask and not kern.supports_bias


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_inputs_keep_their_dtype_and_match_float64(name, dtype):
    kern = _build(name)
    q, k, v = _rand(1, 2, 16, 8, seed=23), _rand(1, 2, 16, 8, seed=24), _rand(1, 2, 16, 8, seed=25)
    mask = _rand(16, 16, seed=26) > 0
    mask |= torch.eye(16, dtype=torch.bool)
    for m in (None, mask):
        out = kern(q.to(dtype), k.to(dtype), v.to(dtype), mask=m)
        assert out.dtype == dtype
        tol = 2e-2 if dtype == torch.float16 else 6e-2
        torch.testing.assert_close(out.double(), kern(q, k, v, mask=m), rtol=tol, atol=tol)
