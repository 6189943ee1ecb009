"""SOFT's exact inverse option (``inverse='cholesky'``): the limit of the official Newton iteration, its cost, its
errors."""
import pytest
import torch

from softfree_mm.attention import build_attention
from softfree_mm.attention.soft import gaussian_kernel

F64 = torch.float64


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize('landmark_op,tie_qk,conv_size', [('conv', True, 3), ('avgpool', False, 0)])
def test_cholesky_equals_the_converged_newton_iteration_forward_matrix_and_gradients(landmark_op, tie_qk, conv_size):
    """Same weights, float64: 60 Newton steps (converged: the landmark kernel is well conditioned) against the
    Cholesky solve of K(L, L) + 0.01 I; outputs, matrices and the gradients of q, k, v and every weight."""
    torch.manual_seed(0)
    cfg = dict(type='soft', landmark_ratio=2, landmark_op=landmark_op, tie_qk=tie_qk, conv_size=conv_size)
    newton = build_attention(dict(cfg, newton_iters=60), num_heads=2, head_dim=8).double()
    chol = build_attention(dict(cfg, inverse='cholesky'), num_heads=2, head_dim=8).double()
    chol.load_state_dict(newton.state_dict(), strict=True)
    hw = (4, 6)
    q, k, v = (_rand(2, 2, 24, 8, seed=s).requires_grad_() for s in (1, 2, 3))
    lm = newton.landmarks(q.detach() * 8 ** -0.25, hw)
    assert torch.linalg.cond(gaussian_kernel(lm, lm) + 0.01 * torch.eye(lm.shape[2], dtype=F64)).max() < 1e3
    out_n, out_c = newton(q, k, v, hw=hw), chol(q, k, v, hw=hw)
    torch.testing.assert_close(out_c, out_n, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(chol.attention_matrix(q, k, hw=hw), newton.attention_matrix(q, k, hw=hw),
                               rtol=1e-9, atol=1e-10)
    w = _rand(*out_n.shape, seed=4)
    leaves_n = [q, k, v] + list(newton.parameters())
    leaves_c = [q, k, v] + list(chol.parameters())
    grads_n = torch.autograd.grad((out_n * w).sum(), leaves_n, allow_unused=True)
    grads_c = torch.autograd.grad((out_c * w).sum(), leaves_c, allow_unused=True)
    assert sum(g is not None for g in grads_c) == len(leaves_c) - (1 if tie_qk else 0)  # tied: k is unused
    for gn, gc in zip(grads_n, grads_c):
        assert (gn is None) == (gc is None)
        if gn is not None:
            torch.testing.assert_close(gc, gn, rtol=1e-8, atol=1e-9)


def test_cholesky_in_float32_and_bf16_keeps_the_dtype_and_compiles():
    kern = build_attention(dict(type='soft', landmark_ratio=2, inverse='cholesky', conv_size=3), num_heads=2,
                           head_dim=8)
    q, v = (_rand(1, 2, 20, 8, seed=s).float() for s in (5, 6))
    out = kern(q, q, v, hw=(4, 5))
    ref = kern.double()(q.double(), q.double(), v.double(), hw=(4, 5))
    kern.float()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    low = kern(q.bfloat16(), q.bfloat16(), v.bfloat16(), hw=(4, 5))
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    compiled = torch.compile(kern, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(q, q, v, hw=(4, 5)), out)


def test_cholesky_cost_by_hand():
    """16 x 16 grid, ratio 8: 4 landmarks from an 8 x 8 stride-8 conv over 8 channels; Gaussian kernels K(Q, L),
    K(L, L); Cholesky 4^3 / 6; K(L, Q) v, the two triangular solves (4^2 / 2 each per channel of v), K(Q, L) (.)."""
    newton = build_attention('soft', num_heads=1, head_dim=8)
    chol = build_attention(dict(type='soft', inverse='cholesky'), num_heads=1, head_dim=8)
    conv, gauss = 4 * 8 * 8 * 64, 256 * 4 * 8 + 4 * 4 * 8
    products = 256 * 4 * 8 + 4 * 4 * 8 + 256 * 4 * 8
    assert chol.flops(256, 256, 8, 8, hw=(16, 16)) == conv + gauss + 64 // 6 + products
    assert newton.flops(256, 256, 8, 8, hw=(16, 16)) == conv + gauss + 20 * 2 * 64 + products
    # at m = 1024 landmarks (a 256 x 256 grid, ratio 8) the inverse dominates: Cholesky is 240x cheaper there
    big_n = newton.flops(65536, 65536, 8, 8, hw=(256, 256))
    big_c = chol.flops(65536, 65536, 8, 8, hw=(256, 256))
    assert big_n - big_c == 40 * 1024 ** 3 - 1024 ** 3 // 6
    assert chol.complexity == 'cubic'  # still m^3 with a landmark ratio, a 240x smaller constant


def test_cholesky_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="unknown inverse 'lu'; valid: newton, cholesky"):
        build_attention(dict(type='soft', inverse='lu'), head_dim=4)
    with pytest.raises(ValueError, match="SOFT-Norm.*use inverse='newton'"):
        build_attention(dict(type='soft', inverse='cholesky', normalized=True), head_dim=4)
