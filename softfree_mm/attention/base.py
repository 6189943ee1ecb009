"""The one contract every attention kernel follows, and the helpers kernels share.

A kernel maps ``q (B, h, Nq, d)``, ``k (B, h, Nk, d)``, ``v (B, h, Nk, dv)`` to ``(B, h, Nq, dv)`` and can
show its explicit weight matrix ``A (B, h, Nq, Nk)`` with ``out == A @ v``. Backbones read the declared
abilities (``supports_bias``, ``supports_mask``, ``complexity``) and never the kernel's type.

``mask``: a bool keep-mask (True = may attend) broadcastable to (B, h, Nq, Nk). One whose query axis has size 1,
(..., 1, Nk) such as (B', 1, 1, Nk), removes keys only (padding; ``dispatch.key_only``): a kernel with a factorised
order keeps that order for it, and every kernel gives exactly the output of deleting the masked keys. Any other mask,
or a bias, is general (``dispatch.general``), and the ``masked`` argument of ``flops`` / ``memory`` / ``order`` says
whether one is given.

This package imports torch only.
"""
import math
import warnings
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import dispatch

Scale = Union[None, float, torch.Tensor]


class AttentionKernel(nn.Module):
    """Base class. Subclasses implement ``_matrix`` (and usually a faster ``_forward``)."""

    name: str = 'base'
    supports_bias: bool = False
    supports_mask: bool = False
    complexity: str = 'quadratic'  # how time grows with N: 'linear' | 'quadratic' | 'cubic' (see flops())
    needs_hw: bool = False  # True when the kernel uses the (H, W) token grid
    fixed_length: bool = False  # True when learned weights are tied to token positions up to a maximum length
    takes_context: bool = False  # True when forward accepts ``context`` (a per-sample summary of the layer input)
    # True when ``out == attention_matrix(...) @ v`` exactly; False when the kernel adds a term that is not a
    # token-mixing matrix shared by v's channels (InLine's official per-channel residual): then
    # ``out == attention_matrix(...) @ v + residual_output(...)``
    matrix_is_complete: bool = True
    # why A is no function of one per-pair score matrix, for kernels whose ``_score_map`` gives none (the norms hook
    # names it instead of a score-Jacobian norm)
    no_score_map: str = ''

    def __init__(self, num_heads: Optional[int] = None, head_dim: Optional[int] = None):
        super().__init__()
        if num_heads is not None and (not isinstance(num_heads, int) or num_heads < 1):
            raise ValueError(f'{self.name}: num_heads must be a positive int, got {num_heads!r}')
        if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
            raise ValueError(f'{self.name}: head_dim must be a positive int, got {head_dim!r}')
        self.num_heads = num_heads
        self.head_dim = head_dim

    # ------------------------------------------------------------------ public API
    def forward(self, q, k, v, hw=None, scale: Scale = None, bias=None, mask=None, context=None):
        self._check(q, k, v, hw, scale, bias, mask)
        if context is not None:
            if not self.takes_context:
                raise ValueError(f"attention kernel '{self.name}' takes no context (argument 'context'); only "
                                 'kernels with takes_context=True do (inline with local_residual=\'channel\')')
            return self._forward_context(q, k, v, hw, scale, bias, mask, context)
        return self._forward(q, k, v, hw, scale, bias, mask)

    def attention_matrix(self, q, k, hw=None, scale: Scale = None, bias=None, mask=None):
        """The weights A (B, h, Nq, Nk) shared by v's channels. ``out == A @ v`` when ``matrix_is_complete``;
        otherwise the rest of the output is ``residual_output(...)``."""
        self._check(q, k, None, hw, scale, bias, mask)
        return self._matrix(q, k, hw, scale, bias, mask)

    def score_map(self, q, k, hw=None, scale: Scale = None, bias=None, mask=None):
        """How A depends on per-pair scores: a :class:`~softfree_mm.attention.score_map.ScoreMap` (S and the row map
        S -> A, in the working dtype), or None where A is no such function (``no_score_map`` says why). The score
        Jacobian of the norms hook and of the analyses comes from it."""
        self._check(q, k, None, hw, scale, bias, mask)
        return self._score_map(q, k, hw, scale, bias, mask)

    def residual_output(self, q, k, v, hw=None, scale: Scale = None, bias=None, mask=None, context=None):
        """``out - attention_matrix(...) @ v``: zero for every kernel whose matrix is complete."""
        self._check(q, k, v, hw, scale, bias, mask)
        return torch.zeros(v.shape[0], v.shape[1], q.shape[2], v.shape[3], dtype=v.dtype, device=v.device)

    def extra_repr(self) -> str:
        return f'num_heads={self.num_heads}, head_dim={self.head_dim}, complexity={self.complexity!r}'

    def flops(self, nq: int, nk: int, d: int, dv: int, masked: bool = False, hw=None) -> int:
        """Multiply-adds of one forward call for ONE (batch, head) pair: ``nq`` queries, ``nk`` keys, ``d`` =
        head_dim of q and k, ``dv`` of v; ``masked``: a general mask or a bias is given (``dispatch.general``: a
        key-only mask counts as none; the path a mask or a bias takes); ``hw``: the token grid (kernels with
        landmarks or convolutions on the grid; a square-ish grid when None).

        What counts is what torch's and mmengine's counters count for the rest of a network: matrix products,
        convolutions (depthwise ones included, however the code runs them) and their learned 1x1 projections;
        elementwise activations, normalisers and sums are not counted. Kernels state their own formula; the
        tests hold each against ``torch.utils.flop_counter`` on the kernel's own forward."""
        raise NotImplementedError(f"attention kernel '{self.name}' declares no flops()")

    def order_products(self, nq: int, nk: int, d: int, dv: int) -> Optional[Tuple[int, int]]:
        """``(explicit, factorised)``: the multiply-adds per (batch, head) of the matrix products and convolutions
        (what torch's flop counter counts) of one call in each association order of a kernel that has two
        (``(phi(q) phi(k)^T) v`` and ``phi(q) (phi(k)^T v)``), the work both orders share included, for a call
        without a general mask or a bias (a key-only mask changes neither); None for a kernel with one order.
        ``flops()`` of such a call is the term of the order it takes; the tests count each order's forward."""
        return None

    def order_extra(self, nq: int, nk: int, d: int, dv: int, device: str = 'cpu') -> Tuple[int, int]:
        """``(explicit, factorised)``: the work of each order that no flop counter sees (row sums, elementwise
        normalisers, poly's monomial features), weighted as that many matrix multiply-adds on a device type."""
        return 0, 0

    def order_costs(self, nq: int, nk: int, d: int, dv: int, device: str = 'cpu') -> Optional[Tuple[int, int]]:
        """``(explicit, factorised)``: weighted multiply-adds per (batch, head) of the two association orders of a
        kernel that has two, for a call without a general mask or a bias (a key-only mask changes neither) on a
        device type: ``order_products + order_extra`` (a kernel declares those two, not this); None for a kernel
        with one order."""
        products = self.order_products(nq, nk, d, dv)
        if products is None:
            return None
        extra = self.order_extra(nq, nk, d, dv, device)
        return products[0] + extra[0], products[1] + extra[1]

    def order_flops(self, nq: int, nk: int, d: int, dv: int, masked: bool = False) -> int:
        """The ``order_products`` term of the order a call takes (``flops()`` of a kernel with two orders, for a
        call whose path the order alone decides)."""
        return self.order_products(nq, nk, d, dv)[self.order(nq, nk, d, dv, masked) == 'factorised']

    def order(self, nq: int, nk: int, d: int, dv: int, masked: bool = False, device: str = 'cpu') -> str:
        """'explicit' | 'factorised': the order a call of these shapes takes (``dispatch.order``: the kernel's
        ``impl`` or ``SOFTFREE_ATTN_IMPL``, else the cheaper one; always 'explicit' when ``masked``: a general mask
        or a bias, ``dispatch.general(mask, bias)``; a key-only mask keeps the order it would have without a mask);
        '' for a kernel with one order. ``forward`` and ``flops`` both read it."""
        costs = self.order_costs(nq, nk, d, dv, device)
        if costs is None:
            return ''
        return dispatch.order(getattr(self, 'impl', 'auto'), costs, masked)

    def describe_path(self, q, k, v, bias=None, mask=None) -> str:
        """The path a call with these inputs takes, in words (the dry run names it per layer): 'explicit order' /
        'factorised order' for a kernel with two, else the kernel's own path."""
        order = self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], dispatch.general(mask, bias),
                           q.device.type)
        return f'{order} order' if order else 'one path'

    def memory(self, nq: int, nk: int, d: int, dv: int, masked: bool = False, hw=None, *,
               key_mask: bool = False) -> Tuple[int, int]:
        """``(saved, largest)`` elements per (batch, head) of one forward call on a CPU in fp32 with autograd on, its
        q, k, v views whose rows are not adjacent (``analysis/kernel_memory.py`` hands them so, whatever the caller's
        layout; (B, h) fold into one matmul batch without a copy): what the call creates and autograd keeps for
        backward (its inputs not counted; the copies it makes of them counted), and the largest tensor it creates
        (its output included). The dominant terms in (nq, nk, d, dv) for the path the call takes (``masked``: a
        general mask or a bias is given, ``dispatch.general``; ``key_mask``: a key-only mask is given,
        ``dispatch.key_only``, which leaves the path alone but may add the masked copies it keeps), as ``flops``
        states its products; ``tests/analysis/test_analysis_kernel_memory.py`` measures every kernel in every layout
        the support table lists against it (``analysis/kernel_memory.py``: within a factor 1.75 either way)."""
        raise NotImplementedError(f"attention kernel '{self.name}' declares no memory()")

    # ------------------------------------------------------------------ to override
    def _matrix(self, q, k, hw, scale, bias, mask):
        raise NotImplementedError

    def _score_map(self, q, k, hw, scale, bias, mask):
        return None

    def _forward_context(self, q, k, v, hw, scale, bias, mask, context):
        raise NotImplementedError

    def _forward(self, q, k, v, hw, scale, bias, mask):
        a = self._matrix(q, k, hw, scale, bias, mask)
        with no_autocast(v):
            out = a.to(work_dtype(v)) @ v.to(work_dtype(v))
        return cast_back(out, v.dtype)

    # ------------------------------------------------------------------ checks
    def _check(self, q, k, v, hw, scale, bias, mask):
        if torch.jit.is_tracing():
            # under torch.jit.trace the sizes compared here are traced tensors; the checks read their values at trace
            # time and record nothing in the graph, so the tracer's warnings about them are not worth showing
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', torch.jit.TracerWarning)
                return self._check_inputs(q, k, v, hw, scale, bias, mask)
        return self._check_inputs(q, k, v, hw, scale, bias, mask)

    def _check_inputs(self, q, k, v, hw, scale, bias, mask):
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(f'{self.name}: q and k must be (B, heads, N, head_dim), got shapes '
                             f'{tuple(q.shape)} and {tuple(k.shape)}')
        if q.shape[-1] != k.shape[-1] or q.shape[:2] != k.shape[:2]:
            raise ValueError(f'{self.name}: q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, '
                             'heads and head_dim')
        if v is not None and (v.dim() != 4 or v.shape[:3] != k.shape[:3]):
            raise ValueError(f'{self.name}: v must be (B, heads, Nk, dv) matching k {tuple(k.shape)}, '
                             f'got {tuple(v.shape)}')
        if self.num_heads is not None and q.shape[1] != self.num_heads:
            raise ValueError(f'{self.name}: built for num_heads={self.num_heads}, got q with {q.shape[1]} heads')
        if self.head_dim is not None and q.shape[-1] != self.head_dim:
            raise ValueError(f'{self.name}: built for head_dim={self.head_dim}, got q with head_dim {q.shape[-1]}')
        if bias is not None and not self.supports_bias:
            raise ValueError(f"attention kernel '{self.name}' cannot take an additive score bias (argument "
                             "'bias'); leave the relative position bias out for this kernel, or use one of "
                             'the kernels that support it (softmax, poly, relu, sigmoid, synthesizer)')
        if mask is not None:
            if not self.supports_mask:
                raise ValueError(f"attention kernel '{self.name}' cannot honour an attention mask (argument "
                                 "'mask')")
            if mask.dtype != torch.bool:
                raise TypeError(f"{self.name}: 'mask' must be a bool tensor (True = may attend), got {mask.dtype}")
            _check_broadcast('mask', self.name, mask, q, k)
        if bias is not None:
            _check_broadcast('bias', self.name, bias, q, k)
        if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale <= 0:
            raise ValueError(f'{self.name}: scale must be > 0, got {scale!r}')
        if hw is not None:
            check_hw(self.name, hw, q.shape[2])


def mix(kernel: AttentionKernel, q, k, v, hw=None, scale: Scale = None, bias=None, mask=None, drop_p: float = 0.0,
        training: bool = False, context=None):
    """The one kernel call of every attention layer (ours and swapped foreign ones): ``kernel(q, k, v, ...)``, the
    ``context`` only to kernels that take one. In training with attention dropout ``p > 0``: ``dropout(A) @ v``
    with A built explicitly (plus the kernel's ``residual_output`` where A is not its whole output)."""
    context = context if kernel.takes_context else None
    if training and drop_p > 0:
        a = torch.nn.functional.dropout(kernel.attention_matrix(q, k, hw=hw, scale=scale, bias=bias, mask=mask),
                                        drop_p, True)
        out = (a @ v.to(a.dtype)).to(v.dtype)
        if not kernel.matrix_is_complete:
            out = out + kernel.residual_output(q, k, v, hw=hw, scale=scale, bias=bias, mask=mask, context=context)
        return out
    return kernel(q, k, v, hw=hw, scale=scale, bias=bias, mask=mask, context=context)


def _check_broadcast(arg, name, t, q, k):
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if t.dim() > 4:
        raise ValueError(f"{name}: '{arg}' must broadcast to (B, h, Nq, Nk)={target}, got {tuple(t.shape)}")
    shape = (1,) * (4 - t.dim()) + tuple(t.shape)
    for s, n in zip(shape, target):
        if s not in (1, n):
            raise ValueError(f"{name}: '{arg}' of shape {tuple(t.shape)} does not broadcast to (B, h, Nq, Nk)="
                             f'{target}')


def _size_value(x):
    """The value of one grid size for checking, or None when it has no fixed value.

    Sizes are python ints in eager mode. Under ``torch.jit.trace`` (ONNX export, mmengine's FLOP counters) the
    backbones' ``x.shape[i]`` arrive as 0-dim integer tensors: they are checked by their traced value and passed on
    unchanged, so the recorded graph keeps them as sizes. Under ``torch.export`` with dynamic shapes they are
    ``torch.SymInt``, which are not checked (no fixed value)."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        return None
    if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_floating_point() and not x.is_complex():
        with warnings.catch_warnings():  # reading the traced value for the check records nothing in the graph
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            return int(x)
    return False


def check_hw(name: str, hw: Sequence[int], n) -> Tuple[int, int]:
    """``hw`` itself when it is a pair of positive sizes with H * W == n; ValueError naming it otherwise.

    Trace-safe: traced (0-dim tensor) and symbolic sizes are accepted and returned unchanged (see :func:`_size_value`).
    """
    vals = [_size_value(x) for x in hw] if isinstance(hw, (tuple, list)) and len(hw) == 2 else [False]
    if any(v is False or (v is not None and v <= 0) for v in vals):
        raise ValueError(f'{name}: hw must be a pair of positive ints (H, W), got {hw!r}')
    count = _size_value(n)
    if None not in vals and count is not None and vals[0] * vals[1] != count:
        raise ValueError(f'{name}: hw={tuple(vals)} gives {vals[0] * vals[1]} tokens but the input has N={count}; '
                         'hw must satisfy H * W == N')
    return hw[0], hw[1]


def ceil_div(a, b):
    """ceil(a / b) for sizes a >= 0, b > 0, written with a non-negative dividend: traced sizes (0-dim tensors) export
    to ONNX as integer division, which truncates, so ``-(-a // b)`` would come out as floor there."""
    return (a + b - 1) // b


def grid_for(n: int, hw=None) -> Tuple[int, int]:
    """``hw`` when given, else the most square (H, W) with H * W == n (for cost formulas)."""
    if hw is not None:
        return int(hw[0]), int(hw[1])
    h = math.isqrt(n)
    while n % h:
        h -= 1
    return h, n // h


def resolve_hw(name: str, hw, n: int) -> Tuple[int, int]:
    """The token grid: ``hw`` when given, else a square grid when N is a perfect square."""
    if hw is not None:
        return check_hw(name, hw, n)
    count = _size_value(n)
    r = math.isqrt(count) if count else 0
    if r * r != count or not r:
        raise ValueError(f'{name}: needs the token grid hw=(H, W) and N={n} is not a square; pass hw')
    return r, r


# ---------------------------------------------------------------------- numerics helpers
def work_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def no_autocast(t: torch.Tensor):
    """Autocast off for the device of ``t`` (numerically sensitive steps run in fp32). A plain
    ``torch.autocast`` context, which torch.compile traces without a graph break."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def upcast(*ts):
    """To the working dtype (float32, float64 stays). Its gradient is cast back like :func:`cast_back`'s output."""
    return tuple(None if t is None else t.to(work_dtype(t)) for t in ts)


def cast_back(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A result computed in the working dtype, back to the caller's ``dtype``: a plain cast, so a value beyond
    float16's range (65504) becomes inf, and so does a gradient on its way back through :func:`upcast`.

    Never clamp here: fp16 mixed precision relies on its loss scaler, which finds an overflow by looking for
    inf / NaN and then skips the step and lowers the scale. A value saturated at 65504 would pass as a wrong finite
    number and the scaler would never back off."""
    return x if x.dtype == dtype else x.to(dtype)


def default_scale(scale: Scale, head_dim: int, like: torch.Tensor):
    """The factor multiplying q.k: head_dim^-1/2 by default; a float; or a tensor broadcastable to
    (B, h, 1, 1) (XCiT's learned per-head temperature)."""
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, torch.Tensor):
        s = scale.to(like.dtype)
        if s.dim() == 1:  # one value per head
            s = s.view(1, -1, 1, 1)
        return s
    return float(scale)


def scores(q, k, scale, bias=None):
    """S = scale * q @ k^T (+ bias), in the working dtype of q."""
    s = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias.to(s.dtype)
    return s


def key_count(mask, q, k):
    """N per row, shape broadcastable to (B, h, Nq, 1): the number of keys a row may look at (at least 1). A key-only
    mask gives one count per (batch, head) from the mask itself, (B', h', 1, 1), without an Nq x Nk temporary."""
    if mask is None:
        return torch.full((1, 1, 1, 1), float(k.shape[2]), dtype=work_dtype(q), device=q.device)
    if dispatch.key_only(mask):
        return as_4d(mask).sum(-1, keepdim=True).to(work_dtype(q)).clamp_min(1.0)
    m = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]) if mask.dim() == 4 else mask
    return m.sum(-1, keepdim=True).to(work_dtype(q)).clamp_min(1.0)


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """A tensor broadcastable to (B, h, Nq, Nk) as a 4-d view (leading singleton dims added)."""
    return t.view((1,) * (4 - t.dim()) + tuple(t.shape))


def key_keep(mask, dtype) -> Optional[torch.Tensor]:
    """A key-only mask (``dispatch.key_only``) as a keep column (B', h', Nk, 1) of 1s and 0s in ``dtype``, to multiply
    the rows of phi(k) or v by (None for None): a masked key then adds exactly nothing to a sum over keys."""
    if mask is None:
        return None
    return as_4d(mask).transpose(-2, -1).to(dtype)


def apply_keep(a, mask):
    """Masks act multiplicatively after non-softmax activations."""
    if mask is None:
        return a
    return a * mask.to(a.dtype)
