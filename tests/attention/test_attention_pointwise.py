"""relu and sigmoid kernels: A = relu(S) / N * keep and A = sigmoid(S - log N) * keep."""
import math

import pytest
import torch

from softfree_mm.attention import build_attention

F64 = torch.float64


def _rand(*shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype)


def _relu(x, n):
    return max(x, 0.0) / n


def _sigmoid(x, n):
    return 1.0 / (1.0 + math.exp(-(x - math.log(n))))


REFERENCE = {'relu': _relu, 'sigmoid': _sigmoid}


def reference(name, q, k, v, s=None, bias=None, mask=None):
    """The formula one weight at a time in float64; N counts the row's valid keys."""
    b_, h_, nq, d = q.shape
    nk = k.shape[2]
    full = (b_, h_, nq, nk)
    bias = torch.zeros(full, dtype=F64) if bias is None else bias.to(F64).expand(full)
    keep = torch.ones(full, dtype=torch.bool) if mask is None else mask.expand(full)
    act = REFERENCE[name]
    a = torch.zeros(full, dtype=F64)
    for b in range(b_):
        for h in range(h_):
            sh = d ** -0.5 if s is None else s
            for i in range(nq):
                n = int(keep[b, h, i].sum())
                for j in range(nk):
                    if keep[b, h, i, j]:
                        a[b, h, i, j] = act(sh * float(q[b, h, i] @ k[b, h, j]) + float(bias[b, h, i, j]), n)
    return a, a @ v


@pytest.mark.parametrize('name', ['relu', 'sigmoid'])
@pytest.mark.parametrize('case', ['plain', 'bias_and_mask', 'float_scale'])
def test_pointwise_forward_and_matrix_match_the_written_out_formula(name, case):
    q, k, v = _rand(2, 2, 5, 4, seed=1), _rand(2, 2, 7, 4, seed=2), _rand(2, 2, 7, 3, seed=3)
    s, bias, mask = None, None, None
    if case == 'bias_and_mask':
        bias = _rand(2, 5, 7, seed=4)
        mask = _rand(2, 2, 5, 7, seed=5) > 0  # per-row key counts differ, so N differs per row
        mask[..., 0] = True
    elif case == 'float_scale':
        s = 0.9
    kern = build_attention(name, num_heads=2, head_dim=4)
    a_ref, out_ref = reference(name, q, k, v, s, bias, mask)
    torch.testing.assert_close(kern.attention_matrix(q, k, scale=s, bias=bias, mask=mask), a_ref,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v, scale=s, bias=bias, mask=mask), out_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('name', ['relu', 'sigmoid'])
def test_pointwise_masked_key_equals_deleted_key_row_by_row(name):
    kern = build_attention(name)
    q, k, v = _rand(1, 2, 6, 4, seed=10), _rand(1, 2, 9, 4, seed=11), _rand(1, 2, 9, 3, seed=12)
    bias = _rand(1, 2, 6, 9, seed=13)
    mask = _rand(1, 1, 6, 9, seed=14) > -0.3
    mask[..., 0] = True
    out = kern(q, k, v, bias=bias, mask=mask)
    for i in range(6):
        keep = mask[0, 0, i]
        alone = kern(q[:, :, i:i + 1], k[:, :, keep], v[:, :, keep], bias=bias[:, :, i:i + 1, keep])
        torch.testing.assert_close(out[:, :, i:i + 1], alone, rtol=1e-12, atol=1e-12)


def test_sigmoid_of_zero_scores_is_one_over_n_plus_one():
    """S = 0 gives sigmoid(-log N) = 1 / (1 + N) for every valid key: the -log N bias counts valid keys only."""
    kern = build_attention('sigmoid')
    q, k = torch.zeros(1, 1, 2, 4), _rand(1, 1, 10, 4, dtype=torch.float32)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 4:] = False
    a = kern.attention_matrix(q, k, mask=mask)
    torch.testing.assert_close(a[0, 0, 0], torch.full((10,), 1 / 11))
    torch.testing.assert_close(a[0, 0, 1, :4], torch.full((4,), 1 / 5))
    assert torch.all(a[0, 0, 1, 4:] == 0)


def test_relu_weights_are_zero_for_negative_scores_and_divided_by_n():
    kern = build_attention('relu')
    q = torch.ones(1, 1, 1, 1)
    k = torch.tensor([-2.0, -1.0, 0.5, 3.0]).view(1, 1, 4, 1)
    a = kern.attention_matrix(q, k, scale=1.0)
    torch.testing.assert_close(a.flatten(), torch.tensor([0.0, 0.0, 0.5, 3.0]) / 4)


@pytest.mark.parametrize('name', ['relu', 'sigmoid'])
def test_pointwise_row_without_valid_key_is_zero_not_nan(name):
    kern = build_attention(name)
    q, k, v = _rand(1, 1, 3, 4, seed=20), _rand(1, 1, 5, 4, seed=21), _rand(1, 1, 5, 4, seed=22)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2] = False
    out = kern(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.all(out[:, :, 2] == 0)


@pytest.mark.parametrize('name', ['relu', 'sigmoid'])
def test_pointwise_float16_large_scores_stay_finite_with_gradients(name):
    kern = build_attention(name)
    d = 4
    direction = torch.nn.functional.normalize(_rand(1, 1, 1, d, seed=30), dim=-1)
    q = (direction * math.sqrt(60 * math.sqrt(d))).expand(1, 1, 4, d)
    k = torch.cat([q, -q], dim=2)
    q, k, v = (t.half().clone().requires_grad_(True) for t in (q, k, _rand(1, 1, 8, d, seed=31)))
    out = kern(q, k, v)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    out.float().square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize('name', ['relu', 'sigmoid'])
def test_pointwise_kernels_take_only_the_path_arguments(name):
    with pytest.raises(TypeError, match=r"'degree'.*valid arguments: \['impl', 'explicit_mib'\]"):
        build_attention(dict(type=name, degree=2))
