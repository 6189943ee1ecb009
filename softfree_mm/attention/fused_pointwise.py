"""Fused pointwise attention for GPUs (Triton): ``out = (coef * g(alpha q k^T + bias + shift) * keep) @ v``.

One program per block of query rows walks the key blocks (scores -> activation -> weights @ v, fp32 accumulation);
the backward pass runs one program per key block (dk, dv) and one per row block (dq), recomputing each block's
scores from q and k as FlashAttention does, so nothing of size Nq x Nk is ever stored. ``g``: signed ``s^p``
(p = 1..4), relu, sigmoid; ``coef``: a float or one number per row (1/sqrt(N_valid), 1/N_valid); ``shift``: one
number per row (sigmoid's -log N_valid); ``bias`` and ``keep`` (bool): any tensors broadcastable to (B, h, Nq, Nk),
read with their own strides (a key-padding mask (B, 1, 1, Nk) costs no copy). Inputs in fp32, bf16 or fp16, all
of one dtype; scores, powers and the activation in fp32, the weights rounded to the inputs' dtype for the second
matrix product (fp32 accumulation); the output in the inputs' dtype.

Which calls run here and the first-use check against the explicit formula: ``_fused_pointwise_check.py``; the
Triton programs: ``_fused_pointwise_kernels.py``. A launch that fails after the check takes the other path (a
failed backward recomputes its gradients through the tiled path).
"""
from typing import Dict, Optional, Tuple

import torch

from ._fused_pointwise_check import (FAILED, KINDS, bucket, fail, first_line, interpreting, label, pow2, precision,
                                     ready, say_once, tune_configs, unsupported)

_KERNELS: Dict[bool, tuple] = {}  # interpreted? -> (forward, dk-dv, dq)
LAUNCHES = {'forward': 0, 'backward': 0}  # fused launches made in this process (what ran, for the tests)


def kernels():
    interp = interpreting()
    if interp not in _KERNELS:
        from . import _fused_pointwise_kernels as src
        _KERNELS[interp] = src.build(tune_configs())
    return _KERNELS[interp]


# ------------------------------------------------------------------------------------------- launches
def _rows(t, b, h, nq):
    """(tensor, strides (b, h, row)) of a per-row operand broadcastable to (B, h, Nq, 1)."""
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).expand(b, h, nq, 1)
    return t, t.stride()[:3]


def _scores_operand(t, b, h, nq, nk):
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).expand(b, h, nq, nk)
    return t, t.stride()


class _Args:
    """The pointer and stride arguments every program takes, in the kernels' order."""

    def __init__(self, q, k, v, bias, shift, coef, mask):
        b, h, nq, d = q.shape
        nk, dv = k.shape[2], v.shape[3]
        self.dims = (b, h, nq, nk, d, dv)
        self.bias, sb = _scores_operand(bias, b, h, nq, nk) if bias is not None else (q, (0, 0, 0, 0))
        self.shift, sr = _rows(shift, b, h, nq) if shift is not None else (q, (0, 0, 0))
        self.coef, sc = _rows(coef, b, h, nq) if coef is not None else (q, (0, 0, 0))
        if mask is not None:
            m, sm = _scores_operand(mask, b, h, nq, nk)
            self.mask = m.view(torch.uint8)
        else:
            self.mask, sm = q, (0, 0, 0, 0)
        self.flags = dict(HAS_BIAS=bias is not None, HAS_SHIFT=shift is not None, HAS_COEF=coef is not None,
                          HAS_MASK=mask is not None)
        self.side_strides = (*sb, *sr, *sc, *sm)

    def strides(self, q, k, v, do):
        return (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *self.side_strides)


def _constants(q, kind, power):
    return dict(KIND=KINDS[kind], POWER=int(power), UPCAST=bool(interpreting() and q.dtype == torch.bfloat16),
                PRECISION=precision(q.dtype))


def _launch_forward(q, k, v, args: _Args, alpha, shift_value, coef_value, kind, power, cfg):
    fwd, _, _ = kernels()
    b, h, nq, nk, d, dv = args.dims
    out = torch.empty(b, h, nq, dv, dtype=q.dtype, device=q.device)
    const = _constants(q, kind, power)
    LAUNCHES['forward'] += 1
    fwd[lambda meta: (triton_cdiv(nq, meta['BLOCK_M']), b * h)](
        q, k, v, out, args.bias, args.shift, args.coef, args.mask, *args.strides(q, k, v, out),
        h, nq, nk, d, dv, float(alpha), float(shift_value), float(coef_value), bucket(nq), bucket(nk), **const,
        **args.flags, BLOCK_D=pow2(d), BLOCK_DV=pow2(dv))
    return out


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _launch_backward(q, k, v, dout, args: _Args, alpha, shift_value, coef_value, kind, power, cfg, need_q,
                     need_kv):
    _, dkdv, dq_kernel = kernels()
    b, h, nq, nk, d, dv = args.dims
    const = dict(_constants(q, kind, power), **args.flags, BLOCK_D=pow2(d), BLOCK_DV=pow2(dv))
    strides = args.strides(q, k, v, dout)
    side = (args.bias, args.shift, args.coef, args.mask)
    scalars = (h, nq, nk, d, dv, float(alpha), float(shift_value), float(coef_value), bucket(nq), bucket(nk))
    dq = dk = dv_ = None
    LAUNCHES['backward'] += 1
    if need_kv:
        dk = torch.empty(b, h, nk, d, dtype=k.dtype, device=k.device)
        dv_ = torch.empty(b, h, nk, dv, dtype=v.dtype, device=v.device)
        dkdv[lambda meta: (triton_cdiv(nk, meta['BLOCK_N']), b * h)](q, k, v, dout, dk, dv_, *side, *strides,
                                                                      *scalars, **const)
    if need_q:
        dq = torch.empty(b, h, nq, d, dtype=q.dtype, device=q.device)
        dq_kernel[lambda meta: (triton_cdiv(nq, meta['BLOCK_M']), b * h)](q, k, v, dout, dq, *side, *strides,
                                                                          *scalars, **const)
    return dq, dk, dv_


class FusedPointwiseAttention(torch.autograd.Function):
    """The fused forward and backward; gradients for q, k and v (none for bias, shift, coef or mask)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power, cfg, key):
        args = _Args(q, k, v, bias, shift, coef, mask)
        out = _launch_forward(q, k, v, args, alpha, shift_value, coef_value, kind, power, cfg)
        ctx.save_for_backward(q, k, v, bias, shift, coef, mask)
        ctx.setup = (alpha, shift_value, coef_value, kind, power, cfg, key)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, bias, shift, coef, mask = ctx.saved_tensors
        alpha, shift_value, coef_value, kind, power, cfg, key = ctx.setup
        need_q = ctx.needs_input_grad[0]
        need_kv = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        try:
            dq, dk, dv = _launch_backward(q, k, v, dout, _Args(q, k, v, bias, shift, coef, mask), alpha,
                                          shift_value, coef_value, kind, power, cfg, need_q, need_kv)
        except Exception as e:  # noqa: BLE001  (a compile or launch error: recompute through the tiled path)
            if key is None:  # the first-use check itself: its caller reports
                raise
            fail(key, kind, power, q, f'its backward raised {type(e).__name__}: {first_line(e)}')
            dq, dk, dv = _tiled_grads(q, k, v, dout, bias, shift, coef, mask, alpha, shift_value, coef_value,
                                      kind, power)
        return (dq if need_q else None, dk if ctx.needs_input_grad[1] else None,
                dv if ctx.needs_input_grad[2] else None) + (None,) * 11


def _tiled_grads(q, k, v, dout, bias, shift, coef, mask, alpha, shift_value, coef_value, kind, power):
    from .blocked import tiled_pointwise
    with torch.enable_grad():
        leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
        shift = shift_value if shift is None else shift + shift_value
        shift = torch.full((1, 1, 1, 1), shift, device=q.device) if isinstance(shift, float) else shift.float()
        out = tiled_pointwise(*leaves, kind, power, alpha, None if bias is None else bias.float(), shift, mask)
        out = out * (coef if coef is not None else coef_value)
        grads = torch.autograd.grad(out, leaves, dout.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))



def fused_pointwise(q, k, v, kind: str, power: int = 1, alpha: float = 1.0, coef=1.0, bias=None, shift=None,
                    mask=None) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    """``(coef * g(alpha q k^T + bias + shift) * keep) @ v`` fused: (output, None), or (None, why not) when the
    call cannot run fused (then nothing was computed). ``coef`` and ``shift``: floats, or tensors broadcastable to
    (B, h, Nq, 1) without gradient; ``bias`` and ``mask`` broadcastable to (B, h, Nq, Nk)."""
    why = unsupported(q, k, v, kind, power, bias)
    if why is None and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (coef, shift)):
        why = 'a row coefficient or shift that needs a gradient'
    if why is not None:
        return None, why
    coef_t = coef if isinstance(coef, torch.Tensor) else None
    shift_t = shift if isinstance(shift, torch.Tensor) else None
    flags = dict(HAS_BIAS=bias is not None, HAS_SHIFT=shift_t is not None, HAS_COEF=coef_t is not None,
                 HAS_MASK=mask is not None)
    cfg, why = ready(kind, power, q, v, flags, FusedPointwiseAttention.apply)
    if cfg is None:
        return None, why
    try:
        out = FusedPointwiseAttention.apply(q, k, v, bias, shift_t, coef_t, mask, float(alpha),
                                            0.0 if shift_t is not None or shift is None else float(shift),
                                            1.0 if coef_t is not None else float(coef), kind, int(power), cfg,
                                            cfg['key'])
    except Exception as e:  # noqa: BLE001  (a launch that fails after the check: say so once, take the other path)
        return None, fail(cfg['key'], kind, power, q, f'its forward raised {type(e).__name__}: {first_line(e)}')
    return out, None


def attend(q, k, v, kind: str, power: int, scale, coef, bias=None, shift=None, mask=None):
    """``coef * ((g(scale q k^T + bias + shift) * keep) @ v)`` fused, in the inputs' dtype, for the kernels'
    forward (the counterpart of ``blocked.pointwise_attention``); None where the fused kernel cannot take the call
    (the reason logged once: the caller then runs it in tiles). ``scale``: a float > 0 or a tensor broadcastable to
    (B, h, 1, 1) (folded into q, so it gets its gradient); a float scale of the homogeneous activations (x^p, relu)
    without bias and shift moves into ``coef``, otherwise into the score product."""
    alpha = 1.0
    if isinstance(scale, torch.Tensor):
        q = (q * scale).to(q.dtype)  # the product in fp32, then one rounding to q's dtype
    elif bias is None and shift is None and kind in ('pow', 'relu'):
        coef = coef * float(scale) ** (power if kind == 'pow' else 1)  # (a s)^p = a^p s^p, relu(a s) = a relu(s)
    else:
        alpha = float(scale)
    if isinstance(coef, torch.Tensor) and coef.requires_grad:
        out, why = fused_pointwise(q, k, v, kind, power, alpha, 1.0, bias, shift, mask)
        out = None if out is None else out * coef.to(out.dtype)
    else:
        out, why = fused_pointwise(q, k, v, kind, power, alpha, coef, bias, shift, mask)
    if out is None and why not in FAILED:
        say_once(f'softfree_mm: {label(kind, power)} attention: no fused kernel for this call ({why}); running it '
                 'in tiles')
    return out
