"""Optional comparison kernels (nystrom, performer, cosformer, flatten) against plain float64 references.
Dtypes, autocast, compile and gradcheck are covered for every registered kernel by test_attention_properties.py."""
import math

import pytest
import torch
import torch.nn.functional as F

from softfree_mm.attention import build_attention

B, H, D = 2, 2, 8
F64 = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def qkv(n, seed=0, nk=None):
    nk = n if nk is None else nk
    return rand(B, H, n, D, seed=seed), rand(B, H, nk, D, seed=seed + 1), rand(B, H, nk, 5, seed=seed + 2)


def test_nystrom_matches_reference_with_segment_means_and_linalg_pinv():
    kern = build_attention(dict(type='nystrom', num_landmarks=4, pinv_iters=10))
    # tokens clustered by segment around distinct centres: the landmark softmax block is well conditioned
    centres = 2 * rand(B, H, 4, 1, D, seed=7)
    q = (centres + 0.3 * rand(B, H, 4, 3, D, seed=8)).reshape(B, H, 12, D)
    k = (centres + 0.3 * rand(B, H, 4, 2, D, seed=9)).reshape(B, H, 8, D)
    v = rand(B, H, 8, 5, seed=10)
    s = D ** -0.5
    lq = q.reshape(B, H, 4, 3, D).mean(3)  # 4 segments of 3 queries
    lk = k.reshape(B, H, 4, 2, D).mean(3)  # 4 segments of 2 keys
    k2 = torch.softmax(s * lq @ lk.transpose(-2, -1), -1)
    assert torch.linalg.cond(k2).max() < 20
    ref = torch.softmax(s * q @ lk.transpose(-2, -1), -1) @ torch.linalg.pinv(k2) @ \
        torch.softmax(s * lq @ k.transpose(-2, -1), -1)
    torch.testing.assert_close(kern.attention_matrix(q, k), ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(kern(q, k, v), ref @ v, rtol=1e-8, atol=1e-10)


def test_nystrom_with_a_landmark_per_token_is_softmax_attention():
    kern = build_attention(dict(type='nystrom', num_landmarks=64, pinv_iters=10))
    q, _, v = qkv(6)
    k = q  # softmax(s q q^T) is diagonally dominant: well conditioned, so A pinv(A) A = A is reached
    ref = torch.softmax(D ** -0.5 * q @ k.transpose(-2, -1), -1)
    assert torch.linalg.cond(ref).max() < 20
    torch.testing.assert_close(kern.attention_matrix(q, k), ref, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(kern(q, k, v), ref @ v, rtol=1e-7, atol=1e-9)


def test_performer_matches_explicit_positive_features():
    kern = build_attention(dict(type='performer', num_features=16, eps=0.0), num_heads=H, head_dim=D)
    q, k, v = qkv(10)
    s = D ** -0.5
    w = kern.projection.to(F64)

    def phi(x):
        x = x * s ** 0.5
        return torch.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(16)

    num = phi(q) @ phi(k).transpose(-2, -1)
    ref = num / num.sum(-1, keepdim=True)
    torch.testing.assert_close(kern.attention_matrix(q, k), ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v), ref @ v, rtol=1e-9, atol=1e-12)


def test_performer_with_many_features_approximates_softmax_and_is_seeded():
    kern = build_attention(dict(type='performer', num_features=2048, seed=3), num_heads=H, head_dim=D)
    again = build_attention(dict(type='performer', num_features=2048, seed=3), num_heads=H, head_dim=D)
    assert torch.equal(kern.projection, again.projection)
    q, k, _ = qkv(10)
    q, k = 0.5 * q, 0.5 * k
    ref = torch.softmax(D ** -0.5 * q @ k.transpose(-2, -1), -1)
    assert (kern.attention_matrix(q, k) - ref).abs().max() < 0.05  # Monte Carlo error ~ 1/sqrt(m)
    # the first d rows of the projection are orthogonal
    w = kern.projection[:D].to(F64)
    gram = w @ w.T
    torch.testing.assert_close(gram - torch.diag(torch.diag(gram)), torch.zeros(D, D, dtype=F64), atol=1e-5, rtol=0)


def test_cosformer_matches_per_pair_cos_reweighting():
    kern = build_attention(dict(type='cosformer', eps=0.0))
    q, k, v = qkv(7, nk=9)
    big_m = 9
    i = torch.arange(1, 8, dtype=F64).view(7, 1)
    j = torch.arange(1, 10, dtype=F64).view(1, 9)
    num = (F.relu(q) @ F.relu(k).transpose(-2, -1)) * torch.cos(math.pi / 2 * (i - j) / big_m)
    ref = num / num.sum(-1, keepdim=True)
    torch.testing.assert_close(kern.attention_matrix(q, k), ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v), ref @ v, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ref.sum(-1), torch.ones(B, H, 7, dtype=F64))


def test_flatten_matches_focused_features_plus_per_head_conv():
    torch.manual_seed(0)
    kern = build_attention('flatten', num_heads=H, head_dim=D)
    with torch.no_grad():
        kern.scale.normal_()
    q, k, v = qkv(12)
    hw = (3, 4)
    sp = F.softplus(kern.scale.detach().to(F64))

    def phi(x):
        x = (F.relu(x) + 1e-6) / sp
        p = x ** 3
        return p / p.norm(dim=-1, keepdim=True) * x.norm(dim=-1, keepdim=True)

    num = phi(q) @ phi(k).transpose(-2, -1)
    linear = (num / (num.sum(-1, keepdim=True) + 1e-6)) @ v
    grid = v.reshape(B * H, 3, 4, 5).permute(0, 3, 1, 2).reshape(1, B * H * 5, 3, 4)
    wconv = kern.conv_weight.detach().to(F64).view(H, 1, 3, 3)
    weight = wconv.repeat(B, 1, 1, 1).repeat_interleave(5, dim=0)  # (B*H*5, 1, 3, 3), sample-major
    conv = F.conv2d(grid, weight, padding=1, groups=B * H * 5).reshape(B, H, 5, 12).transpose(-2, -1)
    out = kern(q, k, v, hw=hw)
    torch.testing.assert_close(out, linear + conv, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(out, kern.attention_matrix(q, k, hw=hw) @ v, rtol=1e-10, atol=1e-12)


def test_extra_errors_name_the_bad_value():
    with pytest.raises(ValueError, match='performer: the random projection needs head_dim'):
        build_attention('performer')
    with pytest.raises(ValueError, match='flatten: .*needs num_heads and head_dim'):
        build_attention('flatten')
    with pytest.raises(ValueError, match='num_landmarks must be an int >= 1, got 0'):
        build_attention(dict(type='nystrom', num_landmarks=0))
    kern = build_attention('flatten', num_heads=H, head_dim=D)
    q, k, v = qkv(12)
    with pytest.raises(ValueError, match='Nq=6 and Nk=12'):
        kern(q[:, :, :6], k, v, hw=(2, 3))
    with pytest.raises(ValueError, match='bias'):
        build_attention('cosformer')(q, k, v, bias=torch.zeros(12, 12))
