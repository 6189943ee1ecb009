"""Pointwise attention ``out = (g(S) * keep) @ v`` in tiles, forward and backward, never holding ``S`` or ``A``.

``S = alpha * q @ k^T (+ bias) (+ shift)``, ``g`` one of ``S^p`` (poly), ``relu`` and ``sigmoid``. The weights of
a pointwise activation need no row normaliser (unlike softmax), so ``A @ v`` is a plain sum over key tiles: the
forward pass walks tiles of (rows x cols) scores, and the backward pass recomputes each tile's scores from
``q`` and ``k`` (as flash attention does), so the memory beyond the inputs, the output and the gradients is a
few tiles. Row coefficients (``1/sqrt(N)``, ``1/N``) are applied by the caller to the output, outside.

Tensors arrive in the working dtype (float32, or float64); every tile runs in it. This file imports torch only.
"""
from typing import Optional, Tuple

import torch

# a (batch, head) matrix larger than this many scores takes the tiled path (global attention; small windows are
# faster built whole)
TILE_ELEMENTS = 1 << 16
# one tile: at most TILE_ROWS queries x TILE_COLS keys of every (batch, head) pair, whatever their number: the five
# GEMMs of a tile (scores, A @ v; dA, dq, dk, dv in backward) need both sides in the hundreds to run near a plain
# matmul's speed, and 128K float32 scores (512 KiB) a pair stay cache-sized (the timings behind 256 x 512:
# docs/benchmarks.md, the cost models)
TILE_ROWS = 256
TILE_COLS = 512
ACTIVATIONS = ('pow', 'relu', 'sigmoid')


def tile_shape(nq: int, nk: int) -> Tuple[int, int]:
    """(rows, cols) of one tile of ``nq x nk`` scores: at most ``TILE_ROWS`` queries and ``TILE_COLS`` keys (the
    same for any number of (batch, head) pairs: they run as one batched GEMM of that shape)."""
    return max(1, min(nq, TILE_ROWS)), max(1, min(nk, TILE_COLS))


def memory(nq: int, nk: int, d: int, dv: int, kept_per_score: int, masked: bool = False,
           key_mask: bool = False) -> Tuple[int, int]:
    """``(saved, largest)`` elements per (batch, head) of a pointwise kernel's quadratic path on a CPU.

    The explicit matrix keeps ``kept_per_score`` Nq x Nk tensors for backward (the scores and the weights, or the
    weights alone); with a mask the masked weights are kept for ``A @ v`` instead of the weights, so at least two
    (the negated mask, one per window shared by its heads, is left out); its largest tensor is an Nq x Nk one or
    the output. The tiles keep only their inputs, the contiguous copies of q, k, v they make (the output is not
    needed in backward), and hold one tile at a time beside the output."""
    out = nq * dv
    if use_tiles(nq, nk):
        rows, cols = tile_shape(nq, nk)
        return (nq + nk) * d + nk * dv, max(rows * cols, out)
    kept = max(kept_per_score, 2) if masked or key_mask else kept_per_score
    return kept * nq * nk, max(nq * nk, out)


def use_tiles(nq: int, nk: int) -> bool:
    """Tiles pay off where one (batch, head) matrix is larger than a tile (global attention); small windows
    (Swin's 49 x 49, XCiT's d_h x d_h) are faster built whole, and are no larger than their activations."""
    return nq * nk > TILE_ELEMENTS


def _part(t: Optional[torch.Tensor], rows: slice, cols: slice) -> Optional[torch.Tensor]:
    """The (rows, cols) part of a tensor that broadcasts to (B, h, Nq, Nk) (size-1 dims stay whole)."""
    if t is None:
        return None
    return t[..., rows if t.shape[-2] != 1 else slice(None), cols if t.shape[-1] != 1 else slice(None)]


def _to4(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if t is None:
        return None
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def _activate(kind: str, power: int, s: torch.Tensor) -> torch.Tensor:
    """g(S), in place (``s`` is a scratch tile)."""
    if kind == 'pow':
        return s if power == 1 else s.pow_(power)  # integer powers 2 and 3 are one vectorised pass
    if kind == 'relu':
        return s.relu_()
    return s.sigmoid_()


SIGMOID_SLOPE = 'a(1-a)'  # stands for sigmoid's slope a (1 - a), applied to dA in place (see _times_slope)
RELU_SLOPE = 'a>0'  # stands for relu's slope [a > 0] (see _times_slope)


def _activate_with_slope(kind: str, power: int, s: torch.Tensor):
    """(g(S), g'(S) / const) with const = p for powers (applied once to the gradients at the end), else 1; None
    stands for a slope of 1, ``SIGMOID_SLOPE`` for a (1 - a) and ``RELU_SLOPE`` for [a > 0], with ``a`` the
    weights. ``s`` is a scratch tile."""
    if kind == 'pow':
        if power == 1:
            return s, None
        low = s if power == 2 else s.pow(power - 1)
        return low * s, low
    if kind == 'relu':
        return s.relu_(), RELU_SLOPE
    return s.sigmoid_(), SIGMOID_SLOPE


class TiledPointwiseAttention(torch.autograd.Function):
    """``(g(alpha q k^T + bias + shift) * keep) @ v`` in tiles; gradients for q, k, v and bias.

    Args (forward): q (B, h, Nq, d), k (B, h, Nk, d), v (B, h, Nk, dv) in one float dtype, contiguous, with the
    same B and h; bias: None or a 4-d tensor broadcastable to (B, h, Nq, Nk) (may require grad: its gradient is
    summed over its broadcast dims); shift: None or a 4-d (.., .., Nq or 1, 1) per-row addend without gradient
    (sigmoid's -log N); mask: None or a 4-d bool tensor, broadcastable, True = keep; alpha: float score scale;
    kind: 'pow' | 'relu' | 'sigmoid'; power: p for 'pow'; rows, cols: the tile shape.
    The (batch, head) pairs run as one batched GEMM per tile; bias, shift and mask act on its 4-d view.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, shift, mask, alpha: float, kind: str, power: int, rows: int, cols: int):
        (b, h, nq, nk, d, dv), (q3, k3, v3) = _flat(q, k, v)
        out = q.new_zeros(b, h, nq, dv)  # returned as allocated (not a view): callers may scale it in place
        out3 = out.view(b * h, nq, dv)
        for ri, cj, _, s, keep in _tiles(q3, k3, alpha, b, h, bias, shift, mask, rows, cols):
            a = _activate(kind, power, s)
            if keep is not None:
                a = _masked(a, keep, b, h)
            out3[:, ri].baddbmm_(a, v3[:, cj])
        ctx.save_for_backward(q, k, v, bias, shift, mask)
        ctx.setup = (alpha, kind, power, rows, cols)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, bias, shift, mask = ctx.saved_tensors
        alpha, kind, power, rows, cols = ctx.setup
        (b, h, nq, nk, d, dv), (q3, k3, v3) = _flat(q, k, v)
        need_q, need_k, need_v, need_bias = ctx.needs_input_grad[:4]
        vt3 = v3.transpose(1, 2)
        do3 = dout.reshape(b * h, nq, dv)
        dq = torch.zeros_like(q3) if need_q else None
        dk = torch.zeros_like(k3) if need_k else None
        dv_ = torch.zeros_like(v3) if need_v else None
        dbias = torch.zeros(bias.shape, dtype=bias.dtype, device=bias.device) if need_bias else None
        for ri, cj, q_i, s, keep in _tiles(q3, k3, alpha, b, h, bias, shift, mask, rows, cols):
            do_i = do3[:, ri]
            a, slope = _activate_with_slope(kind, power, s)
            if keep is not None:
                a = _masked(a, keep, b, h)
            if need_v:
                dv_[:, cj].baddbmm_(a.transpose(1, 2), do_i)
            if not (need_q or need_k or need_bias):
                continue
            ds = torch.bmm(do_i, vt3[:, :, cj])  # dA
            ds = _times_slope(ds, a, slope)
            if keep is not None:
                ds = _masked(ds, keep, b, h)
            if need_q:
                dq[:, ri].baddbmm_(ds, k3[:, cj])
            if need_k:
                dk[:, cj].baddbmm_(ds.transpose(1, 2), q_i)
            if need_bias:
                part = _part(dbias, ri, cj)
                part.add_(_reduce_to(ds.view(b, h, ds.shape[1], ds.shape[2]), part.shape))
        factor = power if kind == 'pow' else 1  # the slope's constant (see _activate_with_slope)
        if dbias is not None and factor != 1:
            dbias.mul_(factor)
        view = (lambda t, n, c: None if t is None else t.view(b, h, n, c))
        if alpha * factor != 1.0:
            for t in (dq, dk):
                if t is not None:
                    t.mul_(alpha * factor)
        return view(dq, nq, d), view(dk, nk, d), view(dv_, nk, dv), dbias, None, None, None, None, None, None, None


def _flat(q, k, v):
    """The sizes (B, h, Nq, Nk, d, dv) and q, k, v as (B*h, N, .) views: the (batch, head) pairs as one batch."""
    b, h, nq, d = q.shape
    nk, dv = k.shape[2], v.shape[3]
    return (b, h, nq, nk, d, dv), (q.reshape(b * h, nq, d), k.reshape(b * h, nk, d), v.reshape(b * h, nk, dv))


def _tiles(q3, k3, alpha, b, h, bias, shift, mask, rows, cols):
    """The tiles forward and backward walk, row block by row block: (rows, cols) slices, the rows' q, the tile's
    scores (:func:`_scores`, a fresh tensor) and its part of the mask (None without one)."""
    nq, nk = q3.shape[1], k3.shape[1]
    kt3 = k3.transpose(1, 2)
    for i in range(0, nq, rows):
        ri = slice(i, i + rows)
        q_i = q3[:, ri]
        for j in range(0, nk, cols):
            cj = slice(j, j + cols)
            s = _scores(q_i, kt3[:, :, cj], alpha, b, h, _part(bias, ri, cj), _part(shift, ri, slice(None)))
            yield ri, cj, q_i, s, _part(mask, ri, cj)


def _scores(q_i, kt_j, alpha, b, h, bias_ij, shift_i):
    """The (B*h, rows, cols) tile of ``alpha q k^T + bias + shift``. The per-row shift and alpha go into the GEMM
    (``baddbmm``: no extra pass over the tile)."""
    if shift_i is not None:
        rows = q_i.shape[1]
        shift3 = shift_i.expand(b, h, rows, 1).reshape(b * h, rows, 1)  # small: one number per row
        s = torch.baddbmm(shift3, q_i, kt_j, alpha=alpha)
    else:
        s = torch.bmm(q_i, kt_j)
        if alpha != 1.0:
            s.mul_(alpha)
    if bias_ij is not None:
        s.view(b, h, s.shape[1], s.shape[2]).add_(bias_ij)
    return s


def _times_slope(ds, a, slope):
    """dA -> dS: ``ds * slope``. Sigmoid's a (1 - a) in place as ``x = ds a; x - x a`` (two passes over the tile,
    no temporaries; the same rounding order as forming 1 - a from the rounded a). ReLU's [a > 0] as one
    ``threshold_backward`` pass (a comparison into a bool tile and a multiply by it took about four times as long on
    the CPU: 750 against 170 us a 256 x 512 tile)."""
    if slope is SIGMOID_SLOPE:
        ds.mul_(a)
        return ds.addcmul_(ds, a, value=-1.0)
    if slope is RELU_SLOPE:
        return torch.ops.aten.threshold_backward(ds, a, 0)
    return ds if slope is None else ds.mul_(slope)


def _masked(t, keep, b, h):
    return t.view(b, h, t.shape[1], t.shape[2]).masked_fill_(~keep, 0.0).view(t.shape)


def _reduce_to(t: torch.Tensor, shape) -> torch.Tensor:
    """Sum ``t`` over the dims where ``shape`` is 1 (a broadcast operand's gradient)."""
    dims = [i for i, (a, b) in enumerate(zip(t.shape, shape)) if b == 1 and a != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


def tiled_pointwise(q, k, v, kind: str, power: int = 1, alpha: float = 1.0, bias=None, shift=None, mask=None,
                    tile: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """``(g(alpha q k^T + bias + shift) * keep) @ v`` without holding the (Nq, Nk) matrix (see the module doc).
    Inputs in one working dtype; ``bias``, ``mask`` broadcastable to (B, h, Nq, Nk), ``shift`` to (B, h, Nq, 1);
    ``tile``: (rows, cols), default :func:`tile_shape`."""
    if kind not in ACTIVATIONS:
        raise ValueError(f'tiled_pointwise: kind must be one of {ACTIVATIONS}, got {kind!r}')
    bias, shift, mask = _to4(bias), _to4(shift), _to4(mask)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    rows, cols = tile if tile is not None else tile_shape(q.shape[2], k.shape[2])
    return TiledPointwiseAttention.apply(q, k, v, bias, shift, mask, float(alpha), kind, int(power), rows, cols)


def pointwise_attention(q, k, v, kind: str, power: int, scale, coef, bias=None, shift=None, mask=None,
                        tile: Optional[Tuple[int, int]] = None):
    """``coef * ((g(scale q k^T + bias + shift) * keep) @ v)`` in tiles, for the kernels' forward.

    ``scale``: a float > 0 or a tensor broadcastable to (B, h, 1, 1) (folded into q, so it gets its gradient);
    ``coef``: a float or a per-row tensor (B, h, Nq, 1) multiplying the output. Without bias and shift a float
    scale of the homogeneous activations (x^p, relu) moves into ``coef``, otherwise into the score GEMM. ``tile``:
    (rows, cols), default :func:`tile_shape` (the CPU's; ``dispatch.tile_for`` gives the GPU's).
    """
    alpha = 1.0
    if isinstance(scale, torch.Tensor):
        q = q * scale
    elif bias is None and shift is None and kind in ('pow', 'relu'):
        coef = coef * float(scale) ** (power if kind == 'pow' else 1)  # (a s)^p = a^p s^p, relu(a s) = a relu(s)
    else:
        alpha = float(scale)  # inside the GEMM with sigmoid's shift (a copy of q would cost memory)
    if bias is not None:
        bias = bias.to(q.dtype)
    out = tiled_pointwise(q, k, v, kind, power, alpha, bias, shift, mask, tile)
    if isinstance(coef, torch.Tensor) and coef.requires_grad:
        return out * coef
    return out.mul_(coef)  # in place: the tiled backward does not need its output, and no copy of it is held
