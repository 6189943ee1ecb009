"""SOFT attention as the official code: Newton inverses, the Nystrom formula against a plain reference (scaled q,
landmarks from it, regularised inverse), landmark grids, dtypes, errors."""
import math

import pytest
import torch

from softfree_mm.attention import build_attention
from softfree_mm.attention.soft import gaussian_kernel, newton_inverse, newton_inverse_norm

B, H, D = 2, 2, 8
F64 = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def qkv(n, seed=0, dv=D):
    return rand(B, H, n, D, seed=seed), rand(B, H, n, D, seed=seed + 1), rand(B, H, n, dv, seed=seed + 2)


def gauss(a, b, s):
    """exp(-s/2 |a_i - b_j|^2), from explicit squared distances."""
    return torch.exp(-0.5 * s * torch.cdist(a, b) ** 2)


def ref_landmarks(kern, q, hw):
    """Landmarks written cell by cell from the (scaled) q: cells of ratio x ratio tokens, H // ratio of them per axis
    ('floor', at least one) or ceil(H / ratio) ('ceil'); for 'avgpool' the mean of the cell's tokens; for 'conv' the
    zero-padded cell contracted with the one (d, d, r, r) conv weight all heads share (no bias), then LayerNorm over
    head_dim and exact GELU."""
    b, h, n, d = q.shape
    gh, gw = hw
    r = kern.landmark_ratio
    if kern.landmark_cells == 'floor':
        mh, mw = max(1, gh // r), max(1, gw // r)
    else:
        mh, mw = -(-gh // r), -(-gw // r)
    grid = q.permute(0, 1, 3, 2).reshape(b, h, d, gh, gw)
    cells = []
    for y in range(0, mh * r, r):
        for x in range(0, mw * r, r):
            if kern.landmark_op == 'avgpool':
                cells.append(grid[..., y:y + r, x:x + r].mean((-2, -1)))
            else:
                patch = torch.zeros(b, h, d, r, r, dtype=F64)
                part = grid[..., y:y + r, x:x + r]
                patch[..., :part.shape[-2], :part.shape[-1]] = part
                w = kern.landmark_conv.weight.to(F64)
                cells.append(torch.einsum('oiyx,bhiyx->bho', w, patch))
    lm = torch.stack(cells, -2)  # (b, h, m, d)
    if kern.landmark_op == 'conv':
        mu = lm.mean(-1, keepdim=True)
        var = ((lm - mu) ** 2).mean(-1, keepdim=True)
        ln = kern.landmark_norm
        lm = (lm - mu) / torch.sqrt(var + ln.eps) * ln.weight.to(F64) + ln.bias.to(F64)
        lm = 0.5 * lm * (1 + torch.erf(lm / math.sqrt(2)))
    return lm


def ref_conv_matrix(kern, hw):
    """The depthwise conv on v as an (h, N, N) matrix, entry by entry: row (y, x) takes weight w[h, 0, dy + c,
    dx + c] from column (y + dy, x + dx) when that cell lies on the grid (zero padding), c = conv_size // 2."""
    gh, gw = hw
    w = kern.v_conv.weight.to(F64)
    c = kern.conv_size // 2
    mat = torch.zeros(w.shape[0], gh * gw, gh * gw, dtype=F64)
    for y in range(gh):
        for x in range(gw):
            for dy in range(-c, c + 1):
                for dx in range(-c, c + 1):
                    if 0 <= y + dy < gh and 0 <= x + dx < gw:
                        mat[:, y * gw + x, (y + dy) * gw + x + dx] = w[:, 0, dy + c, dx + c]
    return mat


def ref_matrix(kern, q, k, hw, normalized=False, s=D ** -0.5):
    """The official order: q' = q s^(1/2) first, landmarks from q', K = exp(-|a - b|^2 / 2) on q' and the
    landmarks; the exact inverse of K(L, L) + 0.01 I (plain) or of K(L, L), normalised by its degrees (Norm)."""
    q = q * math.sqrt(s)
    lm = ref_landmarks(kern, q, hw)
    kll = gauss(lm, lm, 1.0)
    m = kll.shape[-1]
    if normalized:
        dinv = torch.diag_embed(kll.sum(-1) ** -0.5)
        inv = dinv @ torch.linalg.inv(kll) @ dinv
    else:
        inv = torch.linalg.inv(kll + 0.01 * torch.eye(m, dtype=F64))
    keys = q if kern.tie_qk else k * math.sqrt(s)
    a = gauss(q, lm, 1.0) @ inv @ gauss(lm, keys, 1.0)
    if kern.conv_size:
        a = a + ref_conv_matrix(kern, hw)
    return a, torch.linalg.cond(kll)


def test_newton_inverses_match_linalg_float64():
    lm = rand(3, 6, 4, seed=5) * 1.5
    p = gaussian_kernel(lm, lm, 0.5)
    assert torch.linalg.cond(p).max() < 50  # well conditioned: 20 steps converge
    eye = torch.eye(6, dtype=F64)
    torch.testing.assert_close(newton_inverse(p, 20), torch.linalg.inv(p + 0.01 * eye), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(newton_inverse_norm(p, 20), torch.linalg.inv(p), rtol=1e-9, atol=1e-10)


def test_newton_inverse_starts_where_the_official_code_does():
    """One step shows the start: 2 V0 - V0 P V0 from V0 = alpha P, alpha = 1.8 / (max row sum)^2 per matrix on
    P = K + 0.01 I (plain); for Norm alpha = 2 / (max row sum over every matrix)^2, halved until
    max column sum |I - P V0| <= 1.01, on the unregularised K."""
    lm = rand(2, 5, 3, seed=6)
    p = gaussian_kernel(lm, lm, 1.0)
    eye = torch.eye(5, dtype=F64)
    pr = p + 0.01 * eye
    v0 = (1.8 / p.sum(-1).amax(-1) ** 2)[:, None, None] * pr
    torch.testing.assert_close(newton_inverse(p, 1), 2 * v0 - v0 @ pr @ v0)
    alpha = 2 / p.sum(-1).max() ** 2
    while (eye - p @ (alpha * p)).abs().sum(-2).max() > 1.01:
        alpha = alpha / 2
    v0 = alpha * p
    torch.testing.assert_close(newton_inverse_norm(p, 1), 2 * v0 - v0 @ p @ v0)
    # the Norm start couples the matrices of one call, as the official code: another second matrix changes the first
    other = torch.stack([p[0], gaussian_kernel(lm[1] * 0.01, lm[1] * 0.01, 1.0)])
    assert not torch.allclose(newton_inverse_norm(other, 1)[0], newton_inverse_norm(p[:1], 1)[0])


@pytest.mark.parametrize('lead', [(), (3,), (2, 3)], ids=['one', 'batch', 'batch_heads'])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_newton_batched_form_takes_the_loops_steps_on_the_cpu(lead, dtype):
    """The batched form (CUDA's default: the matrices as one bmm batch, ``2 V - V (P V)`` in one baddbmm) runs on
    the CPU too and gives the iterates the steps written out here give, for any leading dims: plain SOFT from its
    per-matrix start, SOFT-Norm from its shared start, with the Norm inverse's gradient through the steps."""
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == F64 else dict(rtol=1e-4, atol=1e-5)
    lm = rand(*lead, 6, 4, seed=9)
    p = gaussian_kernel(lm, lm, 0.5).to(dtype)
    eye = torch.eye(6, dtype=dtype)
    pr = p + 0.01 * eye
    for iters in (0, 1, 7, 20):
        v = (1.8 / p.sum(-1).amax(-1) ** 2)[..., None, None] * pr
        for _ in range(iters):
            v = 2 * v - v @ pr @ v
        for batched in (False, True):
            torch.testing.assert_close(newton_inverse(p, iters, batched=batched), v, **tol)
    alpha, halved = 2 / p.sum(-1).max() ** 2, 1.0
    while (eye - p @ (alpha * halved * p)).abs().sum(-2).max() > 1.01:
        halved /= 2
    g = rand(*p.shape, seed=10).to(dtype)
    grads = []
    for batched in (None, False, True):  # None: the CPU's own choice (the loop)
        pn = p.clone().requires_grad_()
        # the start's scale follows the largest row sum (with its gradient); the halving is a constant
        v, ref = newton_inverse_norm(pn, 7, batched=batched), 2 / pn.sum(-1).max() ** 2 * halved * pn
        for _ in range(7):
            ref = 2 * ref - ref @ pn @ ref
        torch.testing.assert_close(v, ref, **tol)
        grads.append(torch.autograd.grad((v * g).sum(), pn)[0])
        expect = torch.autograd.grad((ref * g).sum(), pn)[0]
        torch.testing.assert_close(grads[-1], expect, **tol)
    torch.testing.assert_close(grads[2], grads[1], **tol)


def test_newton_inverse_backward_is_the_analytic_inverse_gradient():
    """The official backward: grad_P = -V^T g V^T with V the computed inverse (not the unrolled steps)."""
    lm = rand(1, 4, 3, seed=7)
    p = gaussian_kernel(lm, lm, 1.0).requires_grad_()
    g = rand(1, 4, 4, seed=8)
    v = newton_inverse(p, 20)
    (v * g).sum().backward()
    vd = v.detach()
    torch.testing.assert_close(p.grad, -(vd.transpose(-2, -1) @ g @ vd.transpose(-2, -1)))


def test_gaussian_kernel_matches_distance_formula():
    a, b = rand(2, 3, 7, 5, seed=1), rand(2, 3, 4, 5, seed=2)
    torch.testing.assert_close(gaussian_kernel(a, b, 0.3), gauss(a, b, 0.3))


@pytest.mark.parametrize('landmark_op,normalized,tie_qk,hw,conv_size,cells', [
    ('conv', False, True, (4, 6), 3, 'floor'),
    ('conv', True, True, (5, 7), 0, 'floor'),
    ('conv', False, True, (5, 7), 5, 'ceil'),
    ('avgpool', False, False, (5, 7), 3, 'ceil'),
    ('avgpool', True, True, (4, 4), 0, 'floor'),
])
def test_forward_and_matrix_match_plain_reference_with_linalg_inverse(landmark_op, normalized, tie_qk, hw, conv_size,
                                                                      cells):
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2, landmark_op=landmark_op, normalized=normalized,
                                tie_qk=tie_qk, conv_size=conv_size, landmark_cells=cells), num_heads=H, head_dim=D)
    n = hw[0] * hw[1]
    q, k, v = qkv(n)
    # landmarks spread apart (pooled q scaled up) so that K(L, L) is well conditioned and 20 Newton steps reach
    # the exact inverse
    s = D ** -0.5
    if landmark_op == 'avgpool':
        q, k = q * 3, k * 3
    ref, cond = ref_matrix(kern, q, k, hw, normalized, s)
    assert cond.max() < 100
    torch.testing.assert_close(kern.attention_matrix(q, k, hw=hw, scale=s), ref, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(kern(q, k, v, hw=hw, scale=s), ref @ v, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize('conv_size', [0, 3])
def test_forward_equals_matrix_times_v(conv_size):
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2, conv_size=conv_size), num_heads=H, head_dim=D)
    q, k, v = qkv(20, dv=5)
    torch.testing.assert_close(kern(q, k, v, hw=(4, 5)), kern.attention_matrix(q, k, hw=(4, 5)) @ v,
                               rtol=1e-12, atol=1e-12)


def test_defaults_shared_landmark_conv_without_bias_and_official_3x3_conv_on_v_on_request():
    kern = build_attention('soft', num_heads=3, head_dim=8)
    assert kern.landmark_ratio == 8 and kern.newton_iters == 20 and kern.tie_qk and kern.conv_size == 0
    assert kern.landmark_cells == 'floor' and not kern.normalized
    assert kern.landmark_conv.weight.shape == (8, 8, 8, 8) and kern.landmark_conv.bias is None
    assert not hasattr(kern, 'v_conv')  # the bare METHODS formula
    official = build_attention(dict(type='soft', conv_size=3), num_heads=3, head_dim=8)
    assert official.v_conv.weight.shape == (3, 1, 3, 3) and official.v_conv.bias is None


def test_conv_on_v_is_zero_padded_per_head_and_shared_by_the_head_channels():
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2, conv_size=3), num_heads=H, head_dim=D)
    v = torch.zeros(1, H, 12, 3, dtype=F64)
    v[0, :, 0, :] = torch.tensor([1.0, 2.0, -1.0], dtype=F64)  # one impulse in the corner cell (0, 0) of a 3x4 grid
    out = kern.conv_v(v, (3, 4))
    w = kern.v_conv.weight.to(F64)
    for head in range(H):
        got = out[0, head].reshape(3, 4, 3)
        # the impulse spreads to cells (y, x) with y, x in {0, 1}: weight w[1 - y, 1 - x] (flipped) times v
        for y in range(3):
            for x in range(4):
                expect = w[head, 0, 1 - y, 1 - x] * v[0, head, 0] if y < 2 and x < 2 else torch.zeros(3, dtype=F64)
                torch.testing.assert_close(got[y, x], expect)


def test_tied_keys_give_symmetric_matrix_ignoring_k():
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2), num_heads=H, head_dim=D)
    q, k, _ = qkv(16)
    a = kern.attention_matrix(q, k)
    torch.testing.assert_close(a, a.transpose(-2, -1))
    torch.testing.assert_close(a, kern.attention_matrix(q, -k))


@pytest.mark.parametrize('hw,floor_m,ceil_m', [((5, 7), 1, 1), ((25, 42), 3 * 5, 4 * 6), ((9, 8), 1, 2)])
@pytest.mark.parametrize('landmark_op', ['conv', 'avgpool'])
@pytest.mark.parametrize('cells', ['floor', 'ceil'])
def test_odd_grids_with_ratio_8_give_floor_or_ceil_landmarks(hw, floor_m, ceil_m, landmark_op, cells):
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_op=landmark_op, landmark_cells=cells), num_heads=1, head_dim=4)
    expected_m = floor_m if cells == 'floor' else ceil_m
    n = hw[0] * hw[1]
    q, v = rand(1, 1, n, 4, seed=1), rand(1, 1, n, 4, seed=2)
    assert kern.landmarks(q, hw).shape == (1, 1, expected_m, 4)
    out = kern(q, q, v, hw=hw)
    assert out.shape == v.shape and torch.isfinite(out).all()


def test_num_landmarks_picks_adaptive_grid_with_aspect_ratio():
    kern = build_attention(dict(type='soft', num_landmarks=15, landmark_op='avgpool'))
    q = rand(1, 2, 12 * 20, 3, seed=4)
    lm = kern.landmarks(q, (12, 20))
    assert lm.shape == (1, 2, 15, 3)  # a 3 x 5 grid
    cell = q.view(1, 2, 12, 20, 3)[:, :, 0:4, 0:4].mean((2, 3))  # the first adaptive cell
    torch.testing.assert_close(lm[:, :, 0], cell)
    conv = build_attention(dict(type='soft', num_landmarks=15), num_heads=2, head_dim=3)
    assert conv.landmarks(q, (12, 20)).shape == (1, 2, 15, 3)


@pytest.mark.parametrize('conv_size', [0, 3])
def test_gradcheck_float64_tiny(conv_size):
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2, conv_size=conv_size), num_heads=1, head_dim=2)
    q, v = rand(1, 1, 8, 2, seed=1).requires_grad_(), rand(1, 1, 8, 1, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c: kern(a, a, c, hw=(2, 4)), (q, v))


@pytest.mark.parametrize('dtype', [torch.float32, F64, torch.bfloat16, torch.float16])
def test_dtypes_return_input_dtype_and_stay_finite_at_scores_60(dtype):
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2), num_heads=H, head_dim=D)
    q, k, v = qkv(16)
    q = q * math.sqrt(60 * D ** 0.5 / (q * q).sum(-1).max())  # s * |q|^2 up to 60
    q, v = q.to(dtype).requires_grad_(), v.to(dtype).requires_grad_()
    out = kern(q, q, v)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()


def test_bf16_autocast_gives_finite_outputs_and_grads():
    torch.manual_seed(0)
    kern = build_attention(dict(type='soft', landmark_ratio=2), num_heads=H, head_dim=D)
    q, _, v = (t.float().requires_grad_() for t in qkv(16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kern(q, q, v)
        out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in kern.parameters())


@pytest.mark.parametrize('conv_size', [0, 3])
def test_compiles_fullgraph(conv_size):
    torch.manual_seed(0)
    # few Newton steps: the loop is unrolled into the graph, and capture (no graph break) is what is checked
    kern = build_attention(dict(type='soft', landmark_ratio=2, normalized=True, newton_iters=2, conv_size=conv_size),
                           num_heads=H, head_dim=D)
    q, _, v = (t.float() for t in qkv(15))
    compiled = torch.compile(kern, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(q, q, v, hw=(3, 5)), kern(q, q, v, hw=(3, 5)))


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="landmark_op 'max'.*conv, avgpool"):
        build_attention(dict(type='soft', landmark_op='max'))
    with pytest.raises(ValueError, match="landmark_cells 'round'.*floor, ceil"):
        build_attention(dict(type='soft', landmark_cells='round'), head_dim=4)
    with pytest.raises(ValueError, match='needs head_dim'):
        build_attention('soft')
    with pytest.raises(ValueError, match='conv_size=3 .*needs num_heads'):
        build_attention(dict(type='soft', landmark_op='avgpool', conv_size=3))
    for bad in (2, -1, True, 1.0):
        with pytest.raises(ValueError, match=f'conv_size must be an odd positive int or 0.*got {bad!r}'):
            build_attention(dict(type='soft', conv_size=bad), num_heads=2, head_dim=4)
    with pytest.raises(ValueError, match='landmark_ratio must be a positive int, got 0'):
        build_attention(dict(type='soft', landmark_ratio=0, landmark_op='avgpool'))
    untied = build_attention(dict(type='soft', landmark_op='avgpool', tie_qk=False, conv_size=3), num_heads=H)
    q, k, v = qkv(12)
    with pytest.raises(ValueError, match=r'conv on v \(conv_size=3\).*Nq=6 and Nk=12'):
        untied(q[:, :, :6], k, v, hw=(2, 3))
    kern = build_attention(dict(type='soft', landmark_op='avgpool'))
    q, k, v = qkv(12)
    with pytest.raises(ValueError, match='bias'):
        kern(q, k, v, hw=(3, 4), bias=torch.zeros(12, 12))
    with pytest.raises(ValueError, match='mask'):
        kern(q, k, v, hw=(3, 4), mask=torch.ones(12, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match='N=12 is not a square; pass hw'):
        kern(q, k, v)
    with pytest.raises(ValueError, match='Nq=6, Nk=12'):
        kern(q[:, :, :6], k, v, hw=(2, 3))
