"""Properties every registered attention kernel must have. Parametrised over the registry, so a new kernel is
tested by being registered. Per-family formula references live in test_attention_<family>.py."""
import math

import pytest
import torch

from softfree_mm.attention import (ATTENTION, build_attention, kernel_arguments, kernel_class, list_attentions,
                                   normalize_cfg)

KERNELS = list_attentions()
B, H, GRID, D = 2, 2, (4, 4), 8
N = GRID[0] * GRID[1]
REQUIRED = {'softmax', 'poly', 'relu', 'sigmoid', 'linear', 'efficient', 'taylor', 'inline', 'soft', 'synthesizer'}


def _qkv(dtype=torch.float64, seed=0, n=N, nk=None, d=D, b=B, h=H, amp=1.0):
    g = torch.Generator().manual_seed(seed)
    nk = n if nk is None else nk
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * amp
    k = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64) * amp
    v = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _build(name, **over):
    torch.manual_seed(0)
    cfg = dict(type=name, **over)
    kern = build_attention(cfg, num_heads=H, head_dim=D)
    for p in kern.parameters():  # make learned parts non-trivial (some start at zero)
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return kern


def _no_residual(name):
    """Variant of a kernel whose output does not depend on the token grid (so a key can be deleted)."""
    return dict(local_residual=False) if 'local_residual' in kernel_arguments(name) else {}


def test_registry_lists_the_required_kernels():
    assert REQUIRED <= set(KERNELS), f'missing: {REQUIRED - set(KERNELS)}'


@pytest.mark.parametrize('name', KERNELS)
def test_declared_abilities_are_valid(name):
    kern = _build(name)
    assert isinstance(kern.supports_bias, bool) and isinstance(kern.supports_mask, bool)
    assert isinstance(kern.needs_hw, bool) and isinstance(kern.fixed_length, bool)
    assert kern.complexity in ('linear', 'quadratic', 'cubic')


@pytest.mark.parametrize('name', KERNELS)
def test_bare_type_builds_from_string_and_dict(name):
    a = build_attention(name, num_heads=H, head_dim=D)
    b = build_attention(dict(type=name), num_heads=H, head_dim=D)
    assert type(a) is type(b) is ATTENTION.get(name)


@pytest.mark.parametrize('name', KERNELS)
def test_output_equals_attention_matrix_times_v(name):
    kern = _build(name).double()
    q, k, v = _qkv()
    out = kern(q, k, v, hw=GRID)
    a = kern.attention_matrix(q, k, hw=GRID)
    assert a.shape == (B, H, N, N)
    rest = kern.residual_output(q, k, v, hw=GRID)  # what A cannot hold (InLine's per-channel residual)
    assert isinstance(kern.matrix_is_complete, bool) and (rest.abs().max() > 1e-6) == (not kern.matrix_is_complete)
    torch.testing.assert_close(out, a @ v + rest, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('name', [n for n in KERNELS if ATTENTION.get(n).supports_mask])
def test_output_equals_attention_matrix_times_v_with_mask(name):
    kern = _build(name).double()
    q, k, v = _qkv(seed=1)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(B, 1, N, N, generator=g) > 0.4
    mask |= torch.eye(N, dtype=torch.bool)  # every row keeps at least one key
    out = kern(q, k, v, hw=GRID, mask=mask)
    a = kern.attention_matrix(q, k, hw=GRID, mask=mask)
    torch.testing.assert_close(out, a @ v + kern.residual_output(q, k, v, hw=GRID, mask=mask), rtol=1e-9, atol=1e-10)
    # masked weights are exactly zero (multiplicative after the activation, -inf before softmax)
    assert torch.all(a.masked_select(~mask.expand_as(a)) == 0)


@pytest.mark.parametrize('name', [n for n in KERNELS if ATTENTION.get(n).supports_mask])
def test_masked_key_equals_deleted_key(name):
    """A key masked out for every query gives the output of the same input without that key (N, means and sums
    count valid keys only; position-tied logits move up as a deleted key's successors do). Keys removed from the
    start, the middle and the end."""
    kern = _build(name, **_no_residual(name)).double()
    q, k, v = _qkv(seed=2, n=12)
    for drop in ([11], [4], [0, 5, 6]):
        keep = [j for j in range(12) if j not in drop]
        mask = torch.ones(1, 1, 12, 12, dtype=torch.bool)
        mask[..., drop] = False
        out_masked = kern(q, k, v, mask=mask)
        out_deleted = kern(q, k[:, :, keep], v[:, :, keep])
        torch.testing.assert_close(out_masked, out_deleted, rtol=1e-9, atol=1e-10, msg=f'{name}: keys {drop}')
        a_masked = kern.attention_matrix(q, k, mask=mask)
        a_deleted = kern.attention_matrix(q, k[:, :, keep])
        torch.testing.assert_close(a_masked[..., keep], a_deleted, rtol=1e-9, atol=1e-10)
        assert (a_masked[..., drop] == 0).all()


@pytest.mark.parametrize('name', [n for n in KERNELS if ATTENTION.get(n).supports_mask])
def test_per_query_mask_equals_deleting_that_querys_keys(name):
    """Each query row with its own mask (as in shifted windows) gets the output of its own key subset."""
    kern = _build(name, **_no_residual(name)).double()
    q, k, v = _qkv(seed=3, n=10)
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(10, 10, generator=gen) > 0.4
    mask[:, 3] = True  # every row keeps at least one key
    out = kern(q, k, v, mask=mask)
    for i in (0, 4, 9):
        keep = mask[i].nonzero().flatten()
        row = kern(q, k[:, :, keep], v[:, :, keep])[:, :, i]  # all queries kept: query positions stay
        torch.testing.assert_close(out[:, :, i], row, rtol=1e-9, atol=1e-10, msg=f'{name}: row {i}')


@pytest.mark.parametrize('name', [n for n in KERNELS if not ATTENTION.get(n).supports_bias])
def test_bias_given_to_a_kernel_without_bias_is_an_error(name):
    kern = _build(name)
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match=rf"(?s)'{name}'.*bias"):
        kern(q, k, v, hw=GRID, bias=torch.zeros(N, N))


@pytest.mark.parametrize('name', [n for n in KERNELS if not ATTENTION.get(n).supports_mask])
def test_mask_given_to_a_kernel_without_mask_is_an_error(name):
    kern = _build(name)
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match=rf"(?s)'{name}'.*mask"):
        kern(q, k, v, hw=GRID, mask=torch.ones(N, N, dtype=torch.bool))


@pytest.mark.parametrize('name', [n for n in KERNELS if ATTENTION.get(n).supports_bias])
def test_bias_is_added_to_the_scores(name):
    """A bias reaches the weights, and the output still equals A @ v with it."""
    kern = _build(name).double()
    q, k, v = _qkv(seed=4)
    bias = torch.randn(H, N, N, dtype=torch.float64)
    a0 = kern.attention_matrix(q, k, hw=GRID)
    a1 = kern.attention_matrix(q, k, hw=GRID, bias=bias)
    assert not torch.allclose(a0, a1)
    torch.testing.assert_close(kern(q, k, v, hw=GRID, bias=bias), a1 @ v, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('name', KERNELS)
def test_gradcheck_float64(name):
    torch.manual_seed(0)
    kern = build_attention(name, num_heads=1, head_dim=4).double()
    for p in kern.parameters():
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    q, k, v = _qkv(n=9, b=1, h=1, d=4, seed=5)
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: kern(a, b, c, hw=(3, 3)), (q, k, v), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


@pytest.mark.parametrize('name', KERNELS)
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_runs_in_each_dtype_and_keeps_it(name, dtype):
    kern = _build(name)
    q, k, v = _qkv(dtype)
    out = kern(q, k, v, hw=GRID)
    assert out.dtype == dtype and out.shape == (B, H, N, D)
    assert torch.isfinite(out).all()
    ref = kern.double()(*_qkv(), hw=GRID)
    tol = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 0.1, torch.float16: 0.02}[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize('name', KERNELS)
@pytest.mark.parametrize('amp_dtype', [torch.bfloat16, torch.float16])
def test_autocast_large_scores_stay_finite(name, amp_dtype):
    """Scores up to +-60 under autocast: outputs and gradients finite (sensitive parts run in float32)."""
    kern = _build(name)
    # |s * q.k| reaches ~60: q, k with norm sqrt(60 * sqrt(D)) along a shared direction
    q, k, v = _qkv(torch.float32, seed=6)
    q = q / q.norm(dim=-1, keepdim=True) * math.sqrt(60 * math.sqrt(D))
    k = torch.cat([q[:, :, : N // 2], -q[:, :, N // 2:]], dim=2).detach().clone()
    s = (q @ k.transpose(-1, -2)) * D ** -0.5
    assert s.abs().max() > 55
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    with torch.autocast('cpu', dtype=amp_dtype):
        out = kern(q, k, v, hw=GRID)
    assert torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert v.grad is not None
    for t in (q, k, v):  # q or k get no gradient where a kernel ignores them (soft ties k to q; synthesizer)
        assert t.grad is None or torch.isfinite(t.grad).all()
    for p in kern.parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all()


@pytest.mark.parametrize('name', KERNELS)
@pytest.mark.parametrize('regime', ['large_scores', 'small_scores'])
def test_float16_overflow_shows_as_inf_never_clamped(name, regime):
    """float16 in, float16 out: the result is the float32 computation on the same inputs cast back plainly, so a value
    beyond 65504 is inf (fp16 loss scaling finds overflow by inf / NaN), never one saturated at 65504."""
    big = torch.finfo(torch.float16).max
    kern = _build(name, **(dict(conv_size=3) if name == 'soft' else {}))
    q, k, v = _qkv(torch.float32, seed=6, amp=0.1 if regime == 'small_scores' else 1.0)
    if regime == 'large_scores':  # |s q.k| up to 60
        q = q / q.norm(dim=-1, keepdim=True) * math.sqrt(60 * math.sqrt(D))
        k = torch.cat([q[:, :, : N // 2], -q[:, :, N // 2:]], dim=2)
    v = v.sign() * 6e4  # values near the top of float16's range
    q16, k16, v16 = (t.half() for t in (q, k, v))
    out = kern(q16, k16, v16, hw=GRID)
    ref = kern(q16.float(), k16.float(), v16.float(), hw=GRID)
    assert out.dtype == torch.float16
    assert torch.equal(torch.isinf(out), torch.isinf(ref.half())), 'inf exactly where float32 overflows float16'
    assert not ((out.abs() == big) & (ref.abs() > 65520)).any(), 'an overflow was clamped to 65504'
    if name in ('poly', 'soft') and regime == ('large_scores' if name == 'poly' else 'small_scores'):
        assert torch.isinf(out).any()  # these inputs do overflow: the check above is not vacuous


@pytest.mark.parametrize('name', KERNELS)
def test_torch_compile_fullgraph(name):
    """No graph break anywhere in a kernel (fullgraph=True); the inductor build of two kernels is in
    test_torch_compile_inductor."""
    torch._dynamo.reset()  # every kernel shares AttentionKernel.forward: keep under dynamo's recompile limit
    kern = _build(name)
    q, k, v = _qkv(torch.float32)
    compiled = torch.compile(kern, fullgraph=True, backend='aot_eager')
    torch.testing.assert_close(compiled(q, k, v, hw=GRID), kern(q, k, v, hw=GRID), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', ['poly', 'inline'])
def test_torch_compile_inductor(name):
    torch._dynamo.reset()
    kern = _build(name)
    q, k, v = _qkv(torch.float32)
    compiled = torch.compile(kern, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, hw=GRID), kern(q, k, v, hw=GRID), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('name', [n for n in KERNELS if ATTENTION.get(n).complexity == 'linear'
                                  or 'degree' in kernel_arguments(n)])
def test_linear_time_path_runs_without_building_the_matrix(name):
    """Without bias and mask, linear-time kernels (and poly p=1) never build the (Nq, Nk) matrix."""
    over = dict(degree=1) if 'degree' in kernel_arguments(name) else {}
    kern = _build(name, **over)
    assert kern.complexity == 'linear'

    def refuse(*args, **kwargs):
        raise AssertionError('the quadratic path ran')

    kern._matrix = refuse
    q, k, v = _qkv(torch.float32, n=64 * 64, d=D, b=1)
    out = kern(q, k, v, hw=(64, 64))
    assert out.shape == (1, H, 64 * 64, D) and torch.isfinite(out).all()


@pytest.mark.parametrize('name', ['softmx', 'nope', 'qqzx'])  # a near miss of a kernel's name, names like none
def test_unknown_type_is_named_with_every_valid_type_on_every_entry(name):
    expect = f"unknown attention type {name!r}; valid types: {', '.join(list_attentions())}"
    for call in (lambda: build_attention(dict(type=name), num_heads=H, head_dim=D), lambda: build_attention(name),
                 lambda: normalize_cfg(name), lambda: kernel_class(name), lambda: kernel_arguments(name)):
        with pytest.raises(KeyError) as e:
            call()
        assert e.value.args[0] == expect


@pytest.mark.parametrize('name', KERNELS)
def test_unknown_argument_is_an_error_naming_it(name):
    with pytest.raises(TypeError, match=r"typo_arg.*valid arguments"):
        build_attention(dict(type=name, typo_arg=1), num_heads=H, head_dim=D)


@pytest.mark.parametrize('name', [n for n in KERNELS if ATTENTION.get(n).needs_hw])
def test_hw_that_does_not_match_n_is_an_error(name):
    kern = _build(name)
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match=r'hw=\(3, 5\).*N=16'):
        kern(q, k, v, hw=(3, 5))


def test_softmax_frobenius_norm_is_at_most_sqrt_n():
    kern = build_attention('softmax')
    for n in (4, 49, 300):
        q, k, _ = _qkv(n=n, seed=n, amp=3.0)
        a = kern.attention_matrix(q, k)
        assert (a.flatten(2).norm(dim=-1) <= math.sqrt(n) + 1e-9).all()
        # and rows sum to one
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))


def test_softmax_sdpa_path_equals_explicit_path_with_tensor_scale_bias_and_mask():
    kern = build_attention('softmax')
    q, k, v = _qkv(torch.float32, seed=7)
    scale = torch.rand(H, 1, 1) + 0.5  # XCiT-style per-head temperature
    bias = torch.randn(H, N, N)
    mask = torch.rand(N, N) > 0.3
    mask |= torch.eye(N, dtype=torch.bool)
    out = kern(q, k, v, scale=scale, bias=bias, mask=mask)
    s = (q @ k.transpose(-1, -2)) * scale + bias
    ref = torch.softmax(s.masked_fill(~mask, float('-inf')), -1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_bad_mask_dtype_and_shape_are_errors():
    kern = build_attention('softmax')
    q, k, v = _qkv(torch.float32)
    with pytest.raises(TypeError, match='bool'):
        kern(q, k, v, mask=torch.ones(N, N))
    with pytest.raises(ValueError, match='does not broadcast'):
        kern(q, k, v, mask=torch.ones(N, N + 1, dtype=torch.bool))


def test_negative_scale_argument_is_an_error():
    kern = build_attention('softmax')
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match='scale must be > 0, got -1'):
        kern(q, k, v, scale=-1.0)
