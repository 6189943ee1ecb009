"""Tiled pointwise attention (poly, relu, sigmoid): the same function and gradients as the explicit matrix, and no
tensor of size Nq x Nk anywhere in forward or backward."""
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from softfree_mm.attention import blocked, build_attention

F64 = torch.float64
CFGS = [dict(type='poly', degree=3), dict(type='poly', degree=2), dict(type='poly', degree=4, scale=0.3),
        dict(type='poly', degree=1), dict(type='relu'), dict(type='sigmoid')]


def _ids(cfg):
    return ','.join(f'{k}={v}' for k, v in cfg.items() if k != 'type') and \
        cfg['type'] + ':' + ','.join(f'{k}={v}' for k, v in cfg.items() if k != 'type') or cfg['type']


def _rand(*shape, seed=0, dtype=F64, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype).requires_grad_(grad)


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 16 rows x 8 keys: several tiles in both directions, even at these sizes."""
    monkeypatch.setattr(blocked, 'TILE_ELEMENTS', 0)
    monkeypatch.setattr(blocked, 'TILE_ROWS', 16)
    monkeypatch.setattr(blocked, 'TILE_COLS', 8)


def _explicit(kern, q, k, v, **kw):
    return kern.attention_matrix(q, k, **kw) @ v


CASES = {
    'plain': dict(),
    'full_bias': dict(bias=(3, 37, 21)),
    'key_row_bias': dict(bias=(1, 21)),  # one bias per key, broadcast over batch, heads and queries
    'per_batch_query_bias': dict(bias=(2, 1, 37, 1)),
    'mask_per_batch': dict(mask=(2, 1, 37, 21)),
    'bias_mask_float_scale': dict(bias=(3, 37, 21), mask=(37, 21), scale=0.7),
    'head_temperature': dict(bias=(3, 37, 21), scale='tensor'),
}


@pytest.mark.parametrize('case', list(CASES))
@pytest.mark.parametrize('cfg', CFGS, ids=_ids)
def test_tiled_forward_and_gradients_equal_the_explicit_matrix(cfg, case, small_tiles):
    """37 queries x 21 keys in 16 x 8 tiles (ragged last tiles); gradients reach q, k, v, the bias and the
    tensor scale, summed over the bias's broadcast dims."""
    kern = build_attention(cfg)
    spec = CASES[case]
    q, k, v = _rand(2, 3, 37, 4, seed=1, grad=True), _rand(2, 3, 21, 4, seed=2, grad=True), \
        _rand(2, 3, 21, 5, seed=3, grad=True)
    bias = _rand(*spec['bias'], seed=4, grad=True) if 'bias' in spec else None
    mask = None
    if 'mask' in spec:
        mask = _rand(*spec['mask'], seed=5) > -0.5
        mask[..., 3] = False  # a key nobody sees
        mask[..., 5, :] = False  # a query that sees no key: a zero row
    scale = spec.get('scale')
    if scale == 'tensor':
        scale = _rand(3, 1, 1, seed=6).abs().add(0.5).requires_grad_(True)
    leaves = [t for t in (q, k, v, bias, scale) if isinstance(t, torch.Tensor) and t.requires_grad]
    out = kern(q, k, v, scale=scale, bias=bias, mask=mask)
    ref = _explicit(kern, q, k, v, scale=scale, bias=bias, mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10 * ref.abs().max().item())
    w = _rand(*out.shape, seed=7)
    grads = torch.autograd.grad((out * w).sum(), leaves)
    expect = torch.autograd.grad((ref * w).sum(), leaves)
    for g, e in zip(grads, expect):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9 * e.abs().max().item())


# (Nq, Nk, (tile rows, tile cols)): last tiles of one query and of one key, a single query, a single key, tiles of
# one row and one column throughout, tiles larger than the matrix, and sizes that the tiles divide exactly
TILE_GRID = [(17, 17, (8, 8)), (1, 17, (8, 8)), (9, 1, (8, 8)), (1, 1, (4, 4)), (5, 7, (1, 1)), (3, 13, (2, 4)),
             (16, 24, (8, 8)), (6, 5, (16, 16)), (25, 9, (8, 1)), (4, 33, (1, 8))]
ACTIVATION_CASES = [('pow', 1), ('pow', 2), ('pow', 3), ('relu', 1), ('sigmoid', 1)]


def _plain_pointwise(kind, power, q, k, v, alpha, bias, shift, mask):
    """The whole (Nq, Nk) matrix written out: (g(alpha q k^T + bias + shift) * keep) @ v."""
    s = alpha * q @ k.transpose(-2, -1)
    s = s + (0 if bias is None else bias) + (0 if shift is None else shift)
    a = {'pow': lambda t: t ** power, 'relu': torch.relu, 'sigmoid': torch.sigmoid}[kind](s)
    if mask is not None:
        a = a * mask
    return a @ v


@pytest.mark.parametrize('extras', ['plain', 'bias_shift_mask', 'key_bias_mask'])
@pytest.mark.parametrize('kind,power', ACTIVATION_CASES)
@pytest.mark.parametrize('nq,nk,tile', TILE_GRID, ids=[f'{a}x{b}-tile{r}x{c}' for a, b, (r, c) in TILE_GRID])
def test_any_tile_shape_gives_the_explicit_matrix_forward_and_gradients(nq, nk, tile, kind, power, extras):
    """Every tile is visited once, whatever the sizes leave for the last tile (one query, one key, or all of
    them): the output and the gradients of q, k, v and the bias equal the plain formula's."""
    b, h, d, dv = 2, 2, 3, 2
    q, k, v = _rand(b, h, nq, d, seed=1, grad=True), _rand(b, h, nk, d, seed=2, grad=True), \
        _rand(b, h, nk, dv, seed=3, grad=True)
    bias = shift = mask = None
    if extras == 'bias_shift_mask':
        bias = _rand(b, h, nq, nk, seed=4, grad=True)
        shift = _rand(b, h, nq, 1, seed=5)
        mask = _rand(1, h, nq, nk, seed=6) > -0.5
        mask[..., -1] = False  # the last key (alone in its tile when nk % cols == 1) is hidden from every query
    elif extras == 'key_bias_mask':
        bias = _rand(1, nk, seed=7, grad=True)  # one per key, broadcast over batch, heads and queries
        mask = _rand(nq, nk, seed=8) > 0.0
        mask[-1] = True  # the last query sees every key
    alpha = 0.7
    out = blocked.tiled_pointwise(q, k, v, kind, power, alpha, bias, shift, mask, tile=tile)
    ref = _plain_pointwise(kind, power, q, k, v, alpha, bias, shift, mask)
    scale = ref.abs().max().item() + 1e-300
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12 * scale)
    leaves = [t for t in (q, k, v, bias) if t is not None]
    w = _rand(*ref.shape, seed=9)
    got = torch.autograd.grad((out * w).sum(), leaves)
    expect = torch.autograd.grad((ref * w).sum(), leaves)
    for name, g, e in zip('qkvb', got, expect):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10 * (e.abs().max().item() + 1e-300), msg=name)


class _LargestOutput(TorchDispatchMode):
    """Records the largest number of elements any operation produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize('cfg', [dict(type='poly', degree=3), dict(type='relu'), dict(type='sigmoid')], ids=_ids)
def test_no_operation_produces_an_nq_by_nk_tensor_and_only_inputs_are_saved(cfg):
    """Default tiles at Nq = Nk = 1024 with a padded-key mask and a per-key bias: every intermediate of forward
    and backward stays below a quarter of the matrix, and autograd holds nothing beyond its inputs."""
    kern = build_attention(cfg)
    n, d = 1024, 8
    q, k, v = (_rand(1, 2, n, d, seed=s, dtype=torch.float32, grad=True) for s in (1, 2, 3))
    bias = _rand(1, n, seed=4, dtype=torch.float32, grad=True)
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[:, -100:] = False
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with _LargestOutput() as watch, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = kern(q, k, v, bias=bias, mask=mask)
        out.square().sum().backward()
    matrix = 2 * n * n
    assert watch.largest < matrix / 4, f'an operation produced {watch.largest} elements (matrix: {matrix})'
    assert sum(saved) < 6 * q.numel() + 2 * n, f'autograd saved {sum(saved)} elements'
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, bias))


def test_the_path_choice_keeps_small_windows_whole_and_tiles_global_attention():
    assert not blocked.use_tiles(49, 49) and not blocked.use_tiles(48, 48)  # Swin windows, XCiT channels
    assert blocked.use_tiles(4096, 4096) and blocked.use_tiles(60800, 950)  # global attention, PVT SRA at 800 px
    assert blocked.tile_shape(16384, 16384) == (blocked.TILE_ROWS, blocked.TILE_COLS)
    assert blocked.tile_shape(100, 60800) == (100, blocked.TILE_COLS)  # a short side is one tile
    assert blocked.tile_shape(60800, 300) == (blocked.TILE_ROWS, 300)


@pytest.mark.parametrize('name', ['poly', 'relu', 'sigmoid'])
def test_tiled_path_gradcheck(name, small_tiles):
    kern = build_attention(name)
    q, k, v = _rand(1, 2, 19, 3, seed=10, grad=True), _rand(1, 2, 11, 3, seed=11, grad=True), \
        _rand(1, 2, 11, 2, seed=12, grad=True)
    bias = _rand(2, 19, 11, seed=13, grad=True)
    mask = _rand(19, 11, seed=14) > -0.6
    assert torch.autograd.gradcheck(lambda a, b, c, e: kern(a, b, c, bias=e, mask=mask), (q, k, v, bias),
                                    eps=1e-6, atol=1e-5, fast_mode=True)


@pytest.mark.parametrize('name', ['poly', 'relu', 'sigmoid'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_tiled_path_keeps_the_dtype_and_matches_float64(name, dtype, small_tiles):
    kern = build_attention(name)
    q, k, v = (_rand(1, 2, 33, 8, seed=s) for s in (20, 21, 22))
    ref = kern(q, k, v)
    out = kern(q.to(dtype), k.to(dtype), v.to(dtype))
    assert out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 0.05, torch.float16: 0.01}[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize('name', ['poly', 'relu', 'sigmoid'])
def test_tiled_path_under_autocast_runs_in_float32_with_finite_gradients(name, small_tiles):
    kern = build_attention(name)
    q, k, v = (_rand(1, 2, 33, 8, seed=s, dtype=torch.float32) for s in (30, 31, 32))
    q = (q * math.sqrt(8)).requires_grad_(True)  # scores of several units: x^3 beyond bfloat16's resolution
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kern(q, k, v)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, kern(q, k, v), rtol=0, atol=0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_tiled_path_compiles_with_fullgraph_forward_and_backward(small_tiles):
    """2 x 2 tiles (a compiled graph unrolls the tile loops)."""
    torch._dynamo.reset()
    kern = build_attention('poly')
    q, k, v = (_rand(1, 2, 20, 4, seed=s, dtype=torch.float32, grad=True) for s in (40, 41, 42))
    k, v = k[:, :, :12].detach().requires_grad_(True), v[:, :, :12].detach().requires_grad_(True)
    bias = _rand(2, 20, 12, seed=43, dtype=torch.float32, grad=True)
    mask = _rand(20, 12, seed=44) > -0.5
    compiled = torch.compile(kern, fullgraph=True, backend='aot_eager')
    out = compiled(q, k, v, bias=bias, mask=mask)
    ref = kern(q, k, v, bias=bias, mask=mask)
    torch.testing.assert_close(out, ref)
    got = torch.autograd.grad(out.sum(), (q, k, v, bias))
    expect = torch.autograd.grad(ref.sum(), (q, k, v, bias))
    for g, e in zip(got, expect):
        torch.testing.assert_close(g, e)


def test_unknown_activation_is_an_error_naming_it():
    q = torch.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"kind must be one of \('pow', 'relu', 'sigmoid'\), got 'tanh'"):
        blocked.tiled_pointwise(q, q, q, 'tanh')
