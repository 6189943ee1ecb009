"""InLine attention: the formula, both local residuals (official per channel, ours per head), masks, injectivity,
dtypes, errors."""
import pytest
import torch
import torch.nn.functional as F

from softfree_mm.attention import build_attention

B, H, D = 2, 2, 8
F64 = torch.float64


def rand(*shape, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype)


def qkv(n, dtype=F64, dv=D, seed=0):
    return rand(B, H, n, D, dtype=dtype, seed=seed), rand(B, H, n, D, dtype=dtype, seed=seed + 1), \
        rand(B, H, n, dv, dtype=dtype, seed=seed + 2)


def reference_linear_part(q, k, phi, s, keep=None):
    """A_ij = s/N phi(q_i).phi(k_j) + (1 - s phi(q_i).mean_j phi(k_j)) / N over the kept keys, written per row."""
    fq, fk = phi(q), phi(k)
    nq, nk = q.shape[2], k.shape[2]
    a = torch.zeros(q.shape[0], q.shape[1], nq, nk, dtype=F64)
    for i in range(nq):
        sel = torch.ones(nk, dtype=torch.bool) if keep is None else keep[i]
        n = int(sel.sum())
        if n == 0:
            continue
        kbar = fk[:, :, sel].mean(2)  # (B, h, d)
        dots = (fq[:, :, i:i + 1] * fk).sum(-1)  # (B, h, Nk)
        row = s / n * dots + (1 - s * (fq[:, :, i] * kbar).sum(-1, keepdim=True)) / n
        a[:, :, i] = row * sel
    return a


def reference_residual(kern, k, v, hw):
    """The per-head local residual written independently: per-head 1x1 convs on the mean key token as einsums, then one
    3x3 Conv2d per (sample, head) with zero padding over v's channels."""
    b, h, n, d = k.shape
    conv1, conv2 = kern.residual[0], kern.residual[2]
    kbar = k.mean(2)  # (B, h, d)
    w1 = conv1.weight.to(F64).view(h, d, d)  # per head: out d x in d
    hid = F.gelu(torch.einsum('hoi,bhi->bho', w1, kbar) + conv1.bias.to(F64).view(h, d))
    w2 = conv2.weight.to(F64).view(h, 9, d)
    r = torch.einsum('hoi,bhi->bho', w2, hid) + conv2.bias.to(F64).view(h, 9)  # (B, h, 9)
    dv = v.shape[-1]
    grid = v.reshape(b * h, hw[0], hw[1], dv).permute(0, 3, 1, 2).reshape(1, b * h * dv, hw[0], hw[1])
    weight = r.reshape(b * h, 1, 3, 3).repeat_interleave(dv, dim=0)
    out = F.conv2d(grid, weight, padding=1, groups=b * h * dv)
    return out.reshape(b * h, dv, n).permute(0, 2, 1).reshape(b, h, n, dv)


def reference_channel_residual(kern, context, v, hw):
    """The official residual, as the official code computes it: the context (B, C) through the grouped 1x1 convs
    (written as per-head einsums), the 9C outputs cut into one 3x3 kernel per channel (rows 9c..9c+8 for channel c),
    one Conv2d per (sample, channel) over v laid out (B*C, H, W) with zero padding."""
    b, h, n, d = v.shape
    conv1, conv2 = kern.residual[0], kern.residual[2]
    x = context.view(b, h, d)
    hid = F.gelu(torch.einsum('hoi,bhi->bho', conv1.weight.to(F64).view(h, d, d), x) + conv1.bias.to(F64).view(h, d))
    r = torch.einsum('hoi,bhi->bho', conv2.weight.to(F64).view(h, 9 * d, d), hid) + conv2.bias.to(F64).view(h, 9 * d)
    weight = r.reshape(b * h * d, 1, 3, 3)
    grid = v.permute(0, 1, 3, 2).reshape(1, b * h * d, hw[0], hw[1])
    out = F.conv2d(grid, weight, padding=1, groups=b * h * d)
    return out.reshape(b, h, d, n).permute(0, 1, 3, 2)


PHI = {'identity': lambda x: x, 'relu': torch.relu, 'leakyrelu': lambda x: torch.where(x > 0, x, 0.01 * x),
       'exp': lambda x: torch.exp(0.2 * x)}


@pytest.mark.parametrize('feature_map', ['identity', 'relu', 'leakyrelu', 'exp'])
def test_matrix_and_forward_match_plain_formula(feature_map):
    kern = build_attention(dict(type='inline', feature_map=feature_map, local_residual=False))
    q, k, v = qkv(12)
    ref = reference_linear_part(q, k, PHI[feature_map], D ** -0.5)
    torch.testing.assert_close(kern.attention_matrix(q, k), ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kern(q, k, v), ref @ v, rtol=1e-10, atol=1e-12)


def test_rows_sum_to_one_and_weights_can_be_negative():
    kern = build_attention(dict(type='inline', local_residual=False))
    q, k, _ = qkv(10)
    a = kern.attention_matrix(q, k)
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
    assert (a < 0).any()


def test_head_residual_matches_per_head_conv2d_reference_on_non_square_grid():
    torch.manual_seed(0)
    # float32 parameters, float64 input
    kern = build_attention(dict(type='inline', local_residual='head'), num_heads=H, head_dim=D)
    hw = (3, 5)
    q, k, v = qkv(15, dv=6)
    out = kern(q, k, v, hw=hw)
    assert out.dtype == F64
    expected = reference_linear_part(q, k, PHI['identity'], D ** -0.5) @ v + reference_residual(kern, k, v, hw)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('use_mask', [False, True])
def test_forward_equals_matrix_times_v_including_head_residual(use_mask):
    torch.manual_seed(0)
    kern = build_attention(dict(type='inline', local_residual=True), num_heads=H, head_dim=D)  # True = 'head'
    assert kern.local_residual == 'head' and kern.matrix_is_complete
    q, k, v = qkv(12)
    mask = (torch.rand(B, 1, 12, 12, generator=torch.Generator().manual_seed(3)) > 0.3) if use_mask else None
    if use_mask:
        assert (~mask).any() and mask.any()
    a = kern.attention_matrix(q, k, hw=(3, 4), mask=mask)
    torch.testing.assert_close(kern(q, k, v, hw=(3, 4), mask=mask), a @ v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('residual', ['channel', 'head'])
def test_all_true_mask_equals_no_mask_with_residual(residual):
    torch.manual_seed(0)
    kern = build_attention(dict(type='inline', local_residual=residual), num_heads=H, head_dim=D)
    q, k, v = qkv(16)  # 4 x 4: the square grid is implied
    full = torch.ones(16, 16, dtype=torch.bool)
    torch.testing.assert_close(kern(q, k, v, mask=full), kern(q, k, v), rtol=1e-10, atol=1e-12)


def test_channel_residual_matches_the_official_computation_from_the_context():
    torch.manual_seed(0)
    kern = build_attention('inline', num_heads=H, head_dim=D)  # the official form is the default
    assert kern.local_residual == 'channel' and kern.takes_context and not kern.matrix_is_complete
    assert kern.residual[2].weight.shape == (9 * H * D, D, 1)  # Conv1d(C, 9C, 1, groups=heads)
    hw = (3, 5)
    q, k, v = qkv(15)
    ctx = rand(B, H * D, seed=7)
    out = kern(q, k, v, hw=hw, context=ctx)
    linear = reference_linear_part(q, k, PHI['identity'], D ** -0.5) @ v
    torch.testing.assert_close(out, linear + reference_channel_residual(kern, ctx, v, hw), rtol=1e-9, atol=1e-11)
    # the contract: A is the linear part only, the rest is residual_output
    torch.testing.assert_close(kern.attention_matrix(q, k, hw=hw) @ v + kern.residual_output(q, k, v, hw=hw,
                                                                                             context=ctx),
                               out, rtol=1e-10, atol=1e-12)
    # (B, heads, head_dim) is the same context; without one, the mean key token stands in
    torch.testing.assert_close(kern(q, k, v, hw=hw, context=ctx.view(B, H, D)), out)
    torch.testing.assert_close(kern(q, k, v, hw=hw), kern(q, k, v, hw=hw, context=k.mean(2)), rtol=1e-12, atol=0)


@pytest.mark.parametrize('per_row', [False, True])
def test_channel_residual_under_mask_equals_matrix_plus_residual_output(per_row):
    torch.manual_seed(0)
    kern = build_attention('inline', num_heads=H, head_dim=D)
    q, k, v = qkv(12)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(B, 1, 12, 12, generator=g) > 0.3 if per_row else torch.rand(12, generator=g) > 0.3
    mask = mask | torch.eye(12, dtype=torch.bool) if per_row else mask
    ctx = None if per_row else rand(B, H * D, seed=4)
    out = kern(q, k, v, hw=(3, 4), mask=mask, context=ctx)
    a = kern.attention_matrix(q, k, hw=(3, 4), mask=mask)
    res = kern.residual_output(q, k, v, hw=(3, 4), mask=mask, context=ctx)
    torch.testing.assert_close(out, a @ v + res, rtol=1e-10, atol=1e-12)
    assert res.abs().max() > 1e-3


@pytest.mark.parametrize('residual', ['channel', 'head'])
def test_masked_pad_column_equals_the_unpadded_grid(residual):
    """A 3x4 grid whose last column is masked padding gives, on the real tokens, the 3x3 grid's output: the pad
    keys are deleted from the linear part and count as zero padding in the residual (context: mean of real keys)."""
    torch.manual_seed(0)
    kern = build_attention(dict(type='inline', local_residual=residual), num_heads=H, head_dim=D)
    q, k, v = qkv(9)
    pad = lambda t: torch.cat([t.view(B, H, 3, 3, -1), rand(B, H, 3, 1, t.shape[-1], seed=9)], 3).view(B, H, 12, -1)
    real = torch.ones(3, 4, dtype=torch.bool)
    real[:, 3] = False
    mask = real.flatten().view(1, 1, 1, 12) | torch.eye(12, dtype=torch.bool)  # a pad query sees itself only
    out = kern(pad(q), pad(k), pad(v), hw=(3, 4), mask=mask)[:, :, real.flatten()]
    torch.testing.assert_close(out, kern(q, k, v, hw=(3, 3)), rtol=1e-10, atol=1e-12)


def test_masked_key_equals_deleted_key():
    kern = build_attention(dict(type='inline', local_residual=False))
    q, k, v = qkv(9)
    keep = torch.ones(9, dtype=torch.bool)
    keep[[2, 7]] = False
    mask = keep.view(1, 1, 1, 9)
    out_masked = kern(q, k, v, mask=mask)
    out_deleted = kern(q, k[:, :, keep], v[:, :, keep])
    torch.testing.assert_close(out_masked, out_deleted, rtol=1e-10, atol=1e-12)
    # and the explicit rows over the valid keys still sum to one, the masked columns are zero
    a = kern.attention_matrix(q, k, mask=mask)
    assert a[..., ~keep].abs().max() == 0
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))


def test_row_without_valid_key_gives_zero_output():
    kern = build_attention(dict(type='inline', local_residual=False))
    q, k, v = qkv(6)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[1] = False
    out = kern(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and out[:, :, 1].abs().max() == 0


def test_inline_is_injective_where_linear_relu_is_not():
    q, k, _ = qkv(8)
    q = q.abs()  # relu features of q and 2q then differ only by the factor 2
    inline = build_attention(dict(type='inline', local_residual=False))
    a1, a2 = inline.attention_matrix(q, k), inline.attention_matrix(2 * q, k)
    assert (a1 - a2).abs().amax(-1).min() > 1e-6  # every row differs
    linear = build_attention(dict(type='linear', feature_map='relu'))
    torch.testing.assert_close(linear.attention_matrix(q, k), linear.attention_matrix(2 * q, k))


def test_tensor_scale_per_head_matches_float_scale():
    kern = build_attention(dict(type='inline', local_residual=False))
    q, k, v = qkv(8)
    temp = torch.tensor([0.3, 1.7], dtype=F64)
    out = kern(q, k, v, scale=temp.view(H, 1, 1))
    for head in range(H):
        ref = kern(q[:, head:head + 1], k[:, head:head + 1], v[:, head:head + 1], scale=float(temp[head]))
        torch.testing.assert_close(out[:, head:head + 1], ref)


def test_flags_and_needs_hw_follows_local_residual():
    with_res = build_attention('inline', num_heads=H, head_dim=D)
    head = build_attention(dict(type='inline', local_residual='head'), num_heads=H, head_dim=D)
    without = build_attention(dict(type='inline', local_residual=False))
    assert with_res.needs_hw and head.needs_hw and not without.needs_hw
    assert with_res.takes_context and not head.takes_context and not without.takes_context
    assert not with_res.matrix_is_complete and head.matrix_is_complete and without.matrix_is_complete
    assert with_res.complexity == 'linear' and with_res.supports_mask and not with_res.supports_bias
    q, k, v = qkv(9)
    with pytest.raises(ValueError, match="'inline' takes no context"):
        head(q, k, v, context=k.mean(2))


@pytest.mark.parametrize('dtype', [torch.float32, F64, torch.bfloat16, torch.float16])
def test_dtypes_return_input_dtype_and_stay_finite_at_scores_60(dtype):
    torch.manual_seed(0)
    kern = build_attention('inline', num_heads=H, head_dim=D)
    q, k, v = qkv(16)
    s = (q @ k.transpose(-2, -1)) * D ** -0.5
    q = q * (60 / s.abs().max())  # scores up to +-60
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    out = kern(q, k, v)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_bf16_autocast_gives_finite_outputs_and_grads():
    torch.manual_seed(0)
    kern = build_attention('inline', num_heads=H, head_dim=D)
    q, k, v = (t.float().requires_grad_() for t in qkv(16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kern(q, k, v)
        out.float().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert all(torch.isfinite(p.grad).all() for p in kern.parameters())


@pytest.mark.parametrize('residual', ['channel', 'head'])
def test_gradcheck_float64_with_residual(residual):
    torch.manual_seed(0)
    kern = build_attention(dict(type='inline', local_residual=residual), num_heads=1, head_dim=3).double()
    q, k, v, ctx = (rand(1, 1, 4, 3, seed=i).requires_grad_() for i in range(4))
    assert torch.autograd.gradcheck(lambda a, b, c: kern(a, b, c, hw=(2, 2)), (q, k, v))
    if residual == 'channel':
        assert torch.autograd.gradcheck(lambda a, b, c, x: kern(a, b, c, hw=(2, 2), context=x[:, :, 0]),
                                        (q, k, v, ctx))


def test_compiles_fullgraph():
    torch.manual_seed(0)
    kern = build_attention('inline', num_heads=H, head_dim=D)
    q, k, v = (t.float() for t in qkv(12))
    ctx = rand(B, H * D, seed=5).float()
    compiled = torch.compile(kern, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(q, k, v, hw=(3, 4), context=ctx), kern(q, k, v, hw=(3, 4), context=ctx))


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="feature_map 'elu'.*identity, relu, leakyrelu, exp"):
        build_attention(dict(type='inline', feature_map='elu', local_residual=False))
    with pytest.raises(ValueError, match="local_residual must be 'channel' .*'head' .*got 'pixel'"):
        build_attention(dict(type='inline', local_residual='pixel'), num_heads=H, head_dim=D)
    with pytest.raises(ValueError, match='needs num_heads and head_dim'):
        build_attention('inline')
    kern = build_attention('inline', num_heads=H, head_dim=D)
    q, k, v = qkv(12)
    with pytest.raises(ValueError, match="bias"):
        kern(q, k, v, hw=(3, 4), bias=torch.zeros(12, 12))
    with pytest.raises(ValueError, match='N=12 is not a square; pass hw'):
        kern(q, k, v)
    with pytest.raises(ValueError, match='Nq=6 and Nk=12'):
        kern(q[:, :, :6], k, v, hw=(2, 3))
    with pytest.raises(TypeError, match="unknown argument.*'residual'"):
        build_attention(dict(type='inline', residual=False))
    with pytest.raises(ValueError, match=r'context must be \(B, C\) = \(2, 16\).*got \(2, 15\)'):
        kern(q, k, v, hw=(3, 4), context=torch.zeros(B, 15, dtype=F64))
    with pytest.raises(ValueError, match="'channel' .*head_dim=8 channels per head, got 5"):
        kern(q, k, v[..., :5], hw=(3, 4))


def test_mixed_input_dtypes_compute_in_the_wider_dtype():
    torch.manual_seed(0)
    kern = build_attention('inline', num_heads=H, head_dim=D)
    q, k, v = qkv(16)
    out = kern(q, k, v.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, kern(q, k, v.float().double()).float(), rtol=0, atol=0)


@pytest.mark.parametrize('residual', ['channel', 'head'])
def test_masked_keys_content_changes_nothing_residual_included(residual):
    """Masked key == deleted key for the local residual too: under a per-row mask, changing the masked keys' k and v
    leaves every output unchanged (the residual's weights come from the mean of each row's valid keys, not of all
    keys; a masked neighbour counts as zero)."""
    torch.manual_seed(0)
    kern = build_attention(dict(type='inline', local_residual=residual), num_heads=H, head_dim=D)
    q, k, v = qkv(12)
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(B, 1, 12, 12, generator=g) > 0.4
    mask |= torch.eye(12, dtype=torch.bool)  # every row keeps at least itself
    mask[:, :, :, [3, 8]] = False  # two keys no row may look at (among others the random mask hides)
    hidden = (~mask).all(dim=2).view(B, 1, 12, 1)  # (B, 1, Nk, 1): masked for every row
    assert hidden.sum() >= 2 * B
    k2 = torch.where(hidden, rand(B, H, 12, D, seed=40) * 5, k)
    v2 = torch.where(hidden, rand(B, H, 12, D, seed=41) * 5, v)
    out = kern(q, k, v, hw=(3, 4), mask=mask)
    torch.testing.assert_close(kern(q, k2, v2, hw=(3, 4), mask=mask), out, rtol=1e-10, atol=1e-12)
    # and the change is visible without the mask (the perturbation is not a no-op)
    assert not torch.allclose(kern(q, k2, v2, hw=(3, 4)), kern(q, k, v, hw=(3, 4)))


def test_a_subset_of_query_rows_gets_the_rows_of_the_full_matrix_with_the_official_residual():
    """The official 'channel' residual is outside A, so A's rows for a subset of the queries (attention transfer's
    sampled rows: fewer queries than keys, no grid for them) are the full matrix's rows; the 'head' residual, a term
    of A laid out on the queries' grid, still needs the full grid and says so."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    rows = torch.tensor([3, 0, 11])
    kern = build_attention(dict(type='inline', local_residual='channel'), num_heads=2, head_dim=8)
    full = kern.attention_matrix(q, k, hw=(4, 4))
    part = kern.attention_matrix(q[:, :, rows], k, hw=None)
    assert torch.allclose(part, full[:, :, rows], atol=1e-6)
    head = build_attention(dict(type='inline', local_residual='head'), num_heads=2, head_dim=8)
    with pytest.raises(ValueError, match='needs as many queries as keys'):
        head.attention_matrix(q[:, :, rows], k, hw=None)
