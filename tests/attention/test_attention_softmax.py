"""softmax: the explicit CPU path for small masked / biased / tiny matrices equals the fused SDPA path."""
import pytest
import torch
import torch.nn.functional as F

from softfree_mm.attention import build_attention
from softfree_mm.attention import softmax as softmax_module


def _rand(*shape, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)


def _sdpa_reference(q, k, v, bias, mask):
    """softmax with masked keys deleted; rows with no key are zero (PyTorch's SDPA gives NaN there)."""
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5 + bias
    a = torch.softmax(s.masked_fill(~mask, float('-inf')), -1).nan_to_num(0.0)
    return a @ v


def test_explicit_cpu_path_equals_the_formula_forward_and_backward_with_empty_rows():
    """Swin-like: (windows, heads, 49, 49) with a per-head bias and a per-window mask; one query row keeps no key
    (zero row, zero gradients), one key is seen by nobody."""
    kern = build_attention('softmax')
    q, k, v = (_rand(6, 3, 49, 8, seed=s) for s in (1, 2, 3))
    bias = _rand(1, 3, 49, 49, seed=4)
    mask = torch.rand(6, 1, 49, 49, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[:, :, 7] = False
    mask[..., 11] = False
    assert q.shape[2] * k.shape[2] <= softmax_module.EXPLICIT_CPU_ELEMENTS  # the explicit path runs
    out = kern(q, k, v, bias=bias, mask=mask)
    ref = _sdpa_reference(q, k, v, bias, mask)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.all(out[:, :, 7] == 0)
    w = _rand(*out.shape, seed=6).detach()
    got = torch.autograd.grad((out * w).sum(), (q, k, v, bias))
    expect = torch.autograd.grad((ref * w).sum(), (q, k, v, bias))
    for g, e in zip(got, expect):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)
    assert torch.all(got[0][:, :, 7] == 0) and torch.all(got[1][:, :, 11] == 0)


def test_explicit_path_gradcheck_with_bias_and_mask():
    kern = build_attention('softmax')
    q, k, v = (_rand(1, 2, 9, 4, seed=s) for s in (10, 11, 12))
    bias = _rand(2, 9, 9, seed=13)
    mask = torch.rand(9, 9, generator=torch.Generator().manual_seed(14)) > 0.4
    mask[3] = False
    assert torch.autograd.gradcheck(lambda a, b, c, e: kern(a, b, c, bias=e, mask=mask), (q, k, v, bias),
                                    eps=1e-6, atol=1e-5, fast_mode=True)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_explicit_and_fused_paths_agree_with_a_tensor_scale(dtype, monkeypatch):
    """XCiT-like: (B, heads, 48 channels, N tokens) with a per-head temperature, no mask: the explicit path
    (tiny matrix) against SDPA (forced by making no matrix tiny)."""
    kern = build_attention('softmax')
    q, k, v = (_rand(2, 4, 48, 64, seed=s, dtype=dtype) for s in (20, 21, 22))
    scale = torch.rand(4, 1, 1, generator=torch.Generator().manual_seed(23)).add(0.5).to(dtype)
    explicit = kern(q, k, v, scale=scale)
    monkeypatch.setattr(softmax_module, 'TINY_CPU_ELEMENTS', 0)
    fused = kern(q, k, v, scale=scale)
    assert explicit.dtype == fused.dtype == dtype
    ref = F.scaled_dot_product_attention(q.double() * scale.double(), k.double(), v.double(), scale=1.0)
    if dtype == torch.float32:
        torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(explicit.double(), ref, rtol=1e-5, atol=1e-5)
    else:  # bf16: the explicit path works in float32 inside, so it is at least as close to the exact value
        err_explicit = float((explicit.double() - ref).abs().max())
        err_fused = float((fused.double() - ref).abs().max())
        assert err_explicit <= 2e-2 and err_explicit <= err_fused + 1e-3, (err_explicit, err_fused)
