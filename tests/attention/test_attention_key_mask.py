"""Key-padding masks by kind (``dispatch.key_only``): a bool keep-mask whose query axis has size 1, shape (..., 1, Nk),
only removes keys. A kernel with a factorised order keeps that order for it, drops the masked keys from
``phi(k)^T v`` and from its normaliser and counts the valid keys wherever its formula counts keys, so a masked key is a
deleted key on the factorised path too; a general mask (one row per query) or a bias takes the explicit order.
Parametrised over the registry: every kernel with two orders is tested by being registered."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from softfree_mm.analysis.kernel_memory import KernelMemory, problems
from softfree_mm.attention import ATTENTION, build_attention, dispatch, kernel_arguments, list_attentions

F64 = torch.float64
B, H, D, DV = 3, 2, 4, 5
GRID = (6, 4)
N = GRID[0] * GRID[1]
# masked keys per batch element: none, two in the middle, the first ones and the last one (different counts)
DROPPED = ([], [5, 11], [0, 1, 2, 3, 4, 5, 6, 23])
# variants beyond each kernel's defaults, where the registry has the kernel
EXTRA = (dict(type='linear', feature_map='relu'), dict(type='inline', feature_map='exp'),
         dict(type='inline', feature_map='relu'), dict(type='poly', degree=1), dict(type='poly', degree=2),
         dict(type='poly', degree=3, scale=0.5))


def _two_orders(name):
    kern = build_attention(name, num_heads=H, head_dim=8)
    return kern.order_costs(16, 16, 8, 8) is not None


def _grid_free(name):
    """The kernel's options without a term on the token grid (so that a key can be deleted)."""
    args = kernel_arguments(name)
    return dict(local_residual=False) if 'local_residual' in args else \
        dict(local_conv=False) if 'local_conv' in args else {}


TWO_ORDERS = [n for n in list_attentions() if _two_orders(n)]
MASKED = [n for n in TWO_ORDERS if ATTENTION.get(n).supports_mask]
REFUSING = [n for n in TWO_ORDERS if not ATTENTION.get(n).supports_mask]
VARIANTS = [dict(type=n, **_grid_free(n)) for n in MASKED] + \
    [dict(c, **_grid_free(c['type'])) for c in EXTRA if c['type'] in MASKED]
# with the kernels' terms on the grid (InLine's residuals): both orders, not deletion (the grid needs every key)
GRID_VARIANTS = [dict(type='inline', local_residual='head'), dict(type='inline', local_residual='channel')]
ONE_ORDER = [n for n in list_attentions() if not _two_orders(n) and ATTENTION.get(n).supports_mask]


def _label(cfg):
    return ','.join(f'{k}={v}' for k, v in cfg.items())


def _build(cfg, impl=None, d=D, heads=H):
    torch.manual_seed(0)
    kern = build_attention(cfg if impl is None else dict(cfg, impl=impl), num_heads=heads, head_dim=d)
    for p in kern.parameters():  # learned parts non-trivial (some start at zero)
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return kern.double()


def _qkv(b=B, n=N, d=D, dv=DV, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, H, n, d, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(b, H, n, dv, generator=g, dtype=F64)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _key_mask(n=N, dropped=DROPPED):
    """(B, 1, 1, Nk): batch element i drops the keys dropped[i]."""
    keep = torch.ones(len(dropped), 1, 1, n, dtype=torch.bool)
    for i, drop in enumerate(dropped):
        keep[i, ..., drop] = False
    return keep


def test_a_mask_is_key_only_by_its_shape():
    nq, nk = 7, 9
    for shape in ((nk,), (1, nk), (2, 1, 1, nk), (2, 3, 1, nk), (1, 1, nk)):
        mask = torch.ones(shape, dtype=torch.bool)
        assert dispatch.key_only(mask) and not dispatch.general(mask), shape
        assert dispatch.general(mask, torch.zeros(1)), shape  # a bias is general whatever the mask
    for shape in ((nq, nk), (2, 1, nq, nk), (nq, 1), (2, 3, nq, 1)):
        mask = torch.ones(shape, dtype=torch.bool)
        assert not dispatch.key_only(mask) and dispatch.general(mask), shape
    assert not dispatch.key_only(None) and not dispatch.general(None) and dispatch.general(None, torch.zeros(1))


def test_the_registry_has_kernels_of_each_kind():
    assert {'linear', 'efficient', 'taylor', 'inline', 'poly'} <= set(MASKED)
    assert {'softmax', 'relu', 'sigmoid', 'synthesizer'} <= set(ONE_ORDER)


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_key_masked_factorised_call_equals_the_call_with_those_keys_deleted(cfg):
    """Float64 to 1e-10, each batch element with its own masked keys (none, some, the first eight), forward output
    and the path: the factorised order."""
    kern = _build(cfg, 'factorised')
    q, k, v = _qkv()
    mask = _key_mask()
    assert kern.describe_path(q, k, v, mask=mask) == 'factorised order'
    out = kern(q, k, v, hw=GRID, mask=mask)
    for i, drop in enumerate(DROPPED):
        keep = [j for j in range(N) if j not in drop]
        ref = kern(q[i:i + 1], k[i:i + 1, :, keep], v[i:i + 1, :, keep])
        torch.testing.assert_close(out[i:i + 1], ref, rtol=1e-10, atol=1e-10, msg=f'{_label(cfg)}: dropped {drop}')


@pytest.mark.parametrize('cfg', VARIANTS + GRID_VARIANTS, ids=_label)
def test_key_masked_call_gives_the_same_output_in_either_order_and_as_a_general_mask(cfg):
    """The factorised order under a key mask, the explicit order under it, and the same mask expanded to one row per
    query (a general mask: the per-row explicit path) agree; masks per batch element and per head."""
    kern = _build(cfg)
    q, k, v = _qkv(seed=1, dv=D if kern.takes_context else DV)  # the official residual: a kernel per channel of v
    per_head = _key_mask().repeat(1, H, 1, 1)
    per_head[:, 1, :, 7] = False  # head 1 drops one key more
    contexts = (None, torch.randn(B, H * D, dtype=F64)) if kern.takes_context else (None,)
    for mask in (_key_mask(), per_head):
        for ctx in contexts:
            outs = {}
            for impl in dispatch.ORDERS:
                kern.impl = impl
                outs[impl] = kern(q, k, v, hw=GRID, mask=mask, context=ctx)
            kern.impl = 'auto'
            general = mask.expand(B, mask.shape[1], N, N)
            assert dispatch.general(general)
            outs['general'] = kern(q, k, v, hw=GRID, mask=general, context=ctx)
            torch.testing.assert_close(outs['factorised'], outs['explicit'], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(outs['factorised'], outs['general'], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_a_key_mask_keeps_the_factorised_order_over_tokens_and_a_general_mask_takes_the_explicit_one(cfg):
    """impl='auto' at token-attention shapes (N >> d): a key-only mask takes the order a call without mask takes
    (factorised), a general mask or a bias the explicit one; ``order`` / ``flops`` read ``dispatch.general``."""
    if cfg['type'] == 'poly' and cfg.get('degree', 3) > 1:
        cfg = dict(cfg, degree=1)  # degree 3 builds C(d + 2, 3) features: explicit at these sizes anyway
    n, d = 144, 8
    kern = _build(cfg, 'auto', d)
    q, k, v = _qkv(b=2, n=n, d=d, dv=d)
    key = _key_mask(n, ([], [3, 140]))
    assert kern.order(n, n, d, d) == 'factorised'
    assert kern.order(n, n, d, d, masked=dispatch.general(key)) == 'factorised'
    assert kern.describe_path(q, k, v, mask=key) == 'factorised order'
    general = key.expand(2, 1, n, n)
    assert kern.order(n, n, d, d, masked=dispatch.general(general)) == 'explicit'
    assert kern.describe_path(q, k, v, mask=general).startswith('explicit order')


class _Largest(TorchDispatchMode):
    """The largest tensor any op creates (forward and backward) while active, in elements."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_key_masked_factorised_call_never_creates_an_nq_by_nk_tensor(cfg):
    """Forward and backward of a key-masked call (two batch elements, one head each: a single Nq x Nk slab would
    show) create no tensor of Nq x Nk elements; what the forward creates and keeps is what ``memory(masked=False)``
    declares (analysis/kernel_memory.py's measure), and its products are what ``flops(masked=False)`` declares."""
    n, d = 384, 8
    kern = _build(cfg, 'factorised', d, heads=1)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 1, n, d, generator=g, dtype=F64).requires_grad_() for _ in range(3))
    mask = _key_mask(n, ([7], list(range(300, 384))))
    with _Largest() as mode:
        kern(q, k, v, mask=mask).square().sum().backward()
    assert mode.largest < n * n, f'{_label(cfg)}: a tensor of {mode.largest} elements (Nq x Nk = {n * n})'
    with KernelMemory(kern) as probe:
        kern(q, k, v, mask=mask)
    (call,) = probe.calls
    assert not call['masked'] and not problems(call), problems(call)
    with FlopCounterMode(display=False) as fc:
        kern(q, k, v, mask=mask)
    assert fc.get_total_flops() // 2 == 2 * kern.flops(n, n, d, d, masked=dispatch.general(mask))  # 2 pairs


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_key_masked_gradients_equal_the_deleted_key_gradients(cfg):
    """d out / d (q, k, v) of the key-masked factorised call: the deleted-key call's for q and the kept keys, exactly
    zero for the masked keys' k and v."""
    kern = _build(cfg, 'factorised')
    q, k, v = _qkv(seed=3, grad=True)
    w = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(4), dtype=F64)
    mask = _key_mask()
    gq, gk, gv = torch.autograd.grad((kern(q, k, v, mask=mask) * w).sum(), (q, k, v))
    for i, drop in enumerate(DROPPED):
        keep = [j for j in range(N) if j not in drop]
        qi, ki, vi = q[i:i + 1], k[i:i + 1, :, keep], v[i:i + 1, :, keep]
        rq, rk, rv = torch.autograd.grad((kern(qi, ki, vi) * w[i:i + 1]).sum(), (qi, ki, vi))
        torch.testing.assert_close(gq[i:i + 1], rq, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gk[i:i + 1, :, keep], rk, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gv[i:i + 1, :, keep], rv, rtol=1e-10, atol=1e-10)
        assert (gk[i, :, drop] == 0).all() and (gv[i, :, drop] == 0).all()


@pytest.mark.parametrize('name', ONE_ORDER)
def test_kernels_with_one_order_take_a_key_only_mask_by_broadcasting(name):
    """softmax, the pointwise kernels, the synthesizer (any registered kernel with a mask and one order): the (B, 1, 1,
    Nk) mask gives the output of the same mask expanded to every row, and of the call with the keys deleted."""
    cfg = dict(type=name, **_grid_free(name))
    kern = _build(cfg)
    q, k, v = _qkv(seed=5)
    mask = _key_mask()
    out = kern(q, k, v, hw=GRID, mask=mask)
    torch.testing.assert_close(out, kern(q, k, v, hw=GRID, mask=mask.expand(B, 1, N, N)), rtol=1e-10, atol=1e-10)
    for i, drop in enumerate(DROPPED):
        keep = [j for j in range(N) if j not in drop]
        ref = kern(q[i:i + 1], k[i:i + 1, :, keep], v[i:i + 1, :, keep])
        torch.testing.assert_close(out[i:i + 1], ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('name', REFUSING)
def test_kernels_with_two_orders_and_no_mask_support_refuse_a_key_only_mask(name):
    kern = build_attention(dict(type=name, **_grid_free(name)), num_heads=H, head_dim=D)
    q, k, v = (t.float() for t in _qkv())
    with pytest.raises(ValueError, match=rf"'{name}' cannot honour an attention mask"):
        kern(q, k, v, mask=_key_mask())
