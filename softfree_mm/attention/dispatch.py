"""Which path a kernel's call takes: the association order of a kernel with two (``order``), and for the quadratic
computation of a pointwise kernel (poly, relu, sigmoid) the explicit matrix, Python tiles (``blocked.py``) or the
fused Triton kernel (``fused_pointwise.py``).

The association rule (every kernel with a factorised form: linear, efficient, taylor, cosformer, performer,
flatten, InLine's linear part, poly): ``out = (phi(q) phi(k)^T) v`` (explicit order: an Nq x Nk matrix) or
``phi(q) (phi(k)^T v)`` (factorised order: a d x dv matrix). Each kernel declares the weighted multiply-adds of both
for (Nq, Nk, d, dv) (``AttentionKernel.order_costs``: the products a flop counter counts, ``order_products``, plus the
weighted work it does not see, ``order_extra``) and ``impl='auto'`` takes the smaller; a general mask or a bias
always takes the explicit order. In token attention (N >> d) that is the factorised order; in XCiT's channel attention,
whose "tokens" are a head's d_h channels and whose "head_dim" is the image's N tokens, the explicit one (an N x N
``k^T v`` otherwise). ``impl='explicit'`` / ``'factorised'`` force an order; FLOPs follow the same rule.

Masks by kind. A mask that only removes keys (padding: CSWin's stripes, Swin's unshifted padded windows) is known by
its shape: a bool keep-mask whose query axis has size 1, one that broadcasts to (B, h, Nq, Nk) from (..., 1, Nk),
e.g. (B', 1, 1, Nk), (B', h, 1, Nk) or (Nk,) (:func:`key_only`). Such a mask keeps the order the rule gives without a
mask: the factorised order drops the masked keys from ``phi(k)^T v`` and from the normaliser, and counts the valid
keys wherever a kernel's formula counts keys, so a masked key gives exactly the output of deleting it, in either order.
Any other mask (one row per query: Swin's shifted windows) and any bias is general (:func:`general`): the explicit
order. The ``masked`` argument of ``order`` / ``flops`` / ``memory`` means ``general(mask, bias)``: a key-only mask
counts as no mask there.

``impl='auto'`` (every kernel's default): on CPU as always, the explicit matrix up to ``blocked.TILE_ELEMENTS``
scores a (batch, head) pair and tiles beyond. On CUDA the explicit matrix while what it holds (fp32 scores, weights
and, in backward, their gradient: 12 bytes a score over all (batch, head) pairs) fits a budget, ``explicit_mib``
(default: the smaller of 512 MiB and an eighth of the GPU's free memory at its first use), and the fused kernel
beyond it. ``'explicit'``, ``'tiled'``, ``'fused'`` force that path on any device (``'fused'`` runs on CPU tensors
under TRITON_INTERPRET=1). Wherever the fused kernel cannot take a call it says why once and the call runs in tiles
(on CUDA: tiles of thousands of queries). The environment variable ``SOFTFREE_ATTN_IMPL`` (one of ``IMPLS``), when
set, replaces every kernel's ``impl``: 'explicit' / 'factorised' force that order on every kernel with two (poly's
'explicit' is its explicit matrix; a kernel or a call without a factorised order takes 'factorised' as 'auto'),
'tiled' / 'fused' force that quadratic path on the pointwise kernels and leave the order of the others to the rule.
This file imports torch only.
"""
import os
from typing import Dict, Optional, Tuple

import torch

from .blocked import use_tiles

IMPLS = ('auto', 'explicit', 'tiled', 'fused', 'factorised')
ORDERS = ('explicit', 'factorised')
# the impl values of a kernel whose only choice is its association order (no tiled or fused quadratic path)
ORDER_IMPLS = ('auto',) + ORDERS
IMPL_ENV = 'SOFTFREE_ATTN_IMPL'
DEFAULT_EXPLICIT_MIB = 512
EXPLICIT_BYTES_PER_SCORE = 12
# the tiled path on CUDA: up to this many scores a tile over all (batch, head) pairs (128 MiB in fp32), keys in
# chunks of GPU_TILE_COLS, so that a tile holds thousands of queries
GPU_TILE_ELEMENTS = 1 << 25
GPU_TILE_COLS = 4096

_BUDGETS: Dict[str, int] = {}


def check_impl(name: str, impl, factorised: bool = False) -> str:
    """``impl`` of a pointwise kernel: 'auto', 'explicit', 'tiled', 'fused', and 'factorised' where the kernel has a
    factorised order (``factorised=True``: poly)."""
    valid = IMPLS if factorised else tuple(i for i in IMPLS if i != 'factorised')
    if impl not in valid:
        raise ValueError(f"{name}: impl must be one of {', '.join(repr(i) for i in valid)}, got {impl!r}")
    return impl


def check_order_impl(name: str, impl) -> str:
    """``impl`` of a kernel whose only choice is its association order: 'auto', 'explicit' or 'factorised'."""
    if impl not in ORDER_IMPLS:
        raise ValueError(f"{name}: impl must be one of {', '.join(repr(i) for i in ORDER_IMPLS)} (the association "
                         f'order; auto: the cheaper one for the shapes at hand), got {impl!r}')
    return impl


def key_only(mask) -> bool:
    """Whether ``mask`` (a bool keep-mask broadcastable to (B, h, Nq, Nk)) only removes keys: its query axis has size 1
    (shape (..., 1, Nk), or (Nk,)), so every query row keeps the same keys. False for None."""
    return mask is not None and (mask.dim() < 2 or mask.shape[-2] == 1)


def general(mask, bias=None) -> bool:
    """Whether a call carries what only the explicit order can take: a bias, or a mask that is not :func:`key_only`.
    The ``masked`` of ``order`` / ``flops`` / ``memory`` for a call's ``mask`` and ``bias``."""
    return bias is not None or (mask is not None and not key_only(mask))


def order(impl: str, costs, masked: bool) -> str:
    """'explicit' | 'factorised': the association order of one call of a kernel with two, from its ``impl``
    (``SOFTFREE_ATTN_IMPL`` replaces it when set), its declared ``costs`` ``(explicit, factorised)`` and ``masked``,
    whether a general mask or a bias is given (:func:`general`; then always 'explicit'; a key-only mask is no reason
    to leave the factorised order). 'auto', and 'tiled' / 'fused' (ways to compute a pointwise matrix, which leave the
    order to the rule), take the order with fewer weighted multiply-adds; a tie takes the factorised one."""
    if masked:
        return 'explicit'
    impl = resolve(impl)
    if impl in ORDERS:
        return impl
    explicit, factorised = costs
    return 'explicit' if explicit < factorised else 'factorised'


def check_explicit_mib(name: str, mib):
    if mib is None:
        return None
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not mib > 0:
        raise ValueError(f'{name}: explicit_mib must be None (the default budget) or a number of MiB > 0, '
                         f'got {mib!r}')
    return float(mib)


def forced() -> Optional[str]:
    """The path ``SOFTFREE_ATTN_IMPL`` forces (None when unset or empty); a clear error for another value."""
    value = os.environ.get(IMPL_ENV, '')
    if not value:
        return None
    if value not in IMPLS:
        raise ValueError(f"{IMPL_ENV}={value!r}: must be one of {', '.join(IMPLS)} (or unset)")
    return value


def resolve(impl: str) -> str:
    """The kernel's ``impl``, unless the environment forces one."""
    return forced() or impl


def explicit_budget(device: torch.device, mib: Optional[float]) -> int:
    """Bytes the explicit path may hold on ``device`` (CUDA): ``mib`` MiB, or the default (see the module)."""
    if mib is not None:
        return int(mib * 2 ** 20)
    key = str(device)
    if key not in _BUDGETS:
        cap = DEFAULT_EXPLICIT_MIB * 2 ** 20
        try:
            free, _ = torch.cuda.mem_get_info(device)
            cap = min(cap, free // 8)
        except (RuntimeError, AssertionError):  # no CUDA context to ask: the fixed cap
            pass
        _BUDGETS[key] = int(cap)
    return _BUDGETS[key]


def explicit_bytes(pairs: int, nq: int, nk: int) -> int:
    """What the explicit path holds for ``pairs`` (batch, head) matrices of nq x nk scores."""
    return EXPLICIT_BYTES_PER_SCORE * pairs * nq * nk


def rule(device_type: str, pairs: int, nq: int, nk: int, budget: int) -> str:
    """impl='auto': 'explicit' | 'tiled' | 'fused' for a device type, (batch, head) pairs, sizes and a budget in
    bytes (used on CUDA only)."""
    if device_type != 'cuda':
        return 'tiled' if use_tiles(nq, nk) else 'explicit'
    return 'explicit' if explicit_bytes(pairs, nq, nk) <= budget else 'fused'


def choose(impl: str, q, k, explicit_mib: Optional[float] = None) -> str:
    """'explicit' | 'tiled' | 'fused' for one call with an already resolved ``impl`` (see :func:`resolve`). Under
    ``torch.jit.trace`` (ONNX export, FLOP counters) no Triton launch can be recorded: 'fused' becomes 'tiled' and
    'auto' follows the CPU rule on any device."""
    tracing = torch.jit.is_tracing()
    if impl == 'factorised':  # a call that has no factorised order (a pointwise kernel, a general mask, a bias)
        impl = 'auto'
    if impl != 'auto':
        return 'tiled' if tracing and impl == 'fused' else impl
    dev = q.device
    if tracing:
        return rule('cpu', q.shape[0] * q.shape[1], q.shape[2], k.shape[2], 0)
    budget = explicit_budget(dev, explicit_mib) if dev.type == 'cuda' else 0
    return rule(dev.type, q.shape[0] * q.shape[1], q.shape[2], k.shape[2], budget)


def gpu_tile(pairs: int, nq: int, nk: int) -> Tuple[int, int]:
    """The tiled path's tile on CUDA: up to GPU_TILE_COLS keys and as many queries as keep the tile within
    GPU_TILE_ELEMENTS scores over all (batch, head) pairs."""
    cols = max(1, min(nk, GPU_TILE_COLS))
    rows = max(1, min(nq, GPU_TILE_ELEMENTS // (max(1, pairs) * cols)))
    return rows, cols


def tile_for(q, k) -> Optional[Tuple[int, int]]:
    """The tile of the tiled path for this call: None (blocked.py's CPU tile) off CUDA, else :func:`gpu_tile`."""
    if q.device.type != 'cuda':
        return None
    return gpu_tile(q.shape[0] * q.shape[1], q.shape[2], k.shape[2])
