"""Softmax attention through scaled_dot_product_attention (the reference every other kernel is compared to).

Where each call runs:

* explicit products (``softmax(q k^T * scale + bias) @ v`` as plain ops, in place where autograd allows) for tiny
  matrices whose head_dim is large (XCiT's d_h x d_h channel attention: its "head_dim" is the token count,
  beyond the fused kernels' head sizes; this is timm's own computation, so autograd keeps the same tensors), and
  on the CPU also for small matrices with a bias or a mask (Swin's 7x7 windows: PyTorch's CPU SDPA has no fused
  kernel for them under autograd and falls back to a slower math path that holds the same matrix);
* explicit products on CUDA for fp32 training with few keys and many queries (PVT's spatially reduced keys),
  where the memory-efficient kernel's backward is slower than they are;
* SDPA's fused kernels elsewhere.

``recompute=True``: keep only q, k, v (and the bias or tensor scale) for backward and compute the call again
there (activation checkpointing of the attention call alone, any path, any device). It drops what the call would
keep besides its inputs: the softmax matrix on the explicit path; on SDPA's path its output and its float bias +
mask, materialised for every window and head (padded to 16 columns: about 1.5x the softmax matrix that mmdet's
Swin keeps). The price is one more forward of the call in backward; no double backward through it. Off by default.
"""
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import ATTENTION
from .base import AttentionKernel, cast_back, default_scale, no_autocast, scores, upcast
from .score_map import softmax_map

# (Nq x Nk) matrices up to this size take the explicit path on the CPU when they carry a bias or a mask, and up to
# the tiny size always on the CPU, and on CUDA when head_dim exceeds the fused kernels' head sizes (XCiT's d_h x d_h
# channel attention: SDPA falls back to its math path on the CPU, to a generic kernel on CUDA)
EXPLICIT_CPU_ELEMENTS = 1 << 16
TINY_CPU_ELEMENTS = 1 << 12
FUSED_MAX_HEAD_DIM = 256


class _MaskedSoftmax(torch.autograd.Function):
    """softmax over the last dim of scores whose masked entries already hold the dtype's lowest value, with masked
    entries at weight 0 exactly and rows that keep nothing at 0. Keeps only the weights for backward (not the
    mask: a masked weight is 0, so is its gradient)."""

    @staticmethod
    def forward(ctx, s, mask):
        a = torch.softmax(s, dim=-1)  # a masked entry: exp(lowest - row max) underflows to exactly 0
        rows = mask.any(-1, keepdim=True)
        # a row without any valid key: uniform -> zero (the check skips a pass; tracers cannot branch on data)
        # (the check reads a value back from the device: on the GPU the product is cheaper than that wait)
        if a.device.type != 'cpu' or _tracing() or not bool(rows.all()):
            a = a.mul_(rows.to(a.dtype))
        ctx.save_for_backward(a)
        return a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        # a * (grad - sum(grad * a)) in one fused pass (four passes and two temporaries as plain tensor ops)
        return torch._softmax_backward_data(grad.to(a.dtype), a, -1, a.dtype), None


def _tracing() -> bool:
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()


class _Recomputed(torch.autograd.Function):
    """``fn(*inputs)`` keeping only the inputs for backward, where ``fn`` runs again under the autocast state of
    the forward and its graph is differentiated (torch.utils.checkpoint for one call, without its per-call
    bookkeeping). ``fn`` must be deterministic (no dropout)."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        dev = next(t.device.type for t in inputs if t is not None)
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        inputs = [None if t is None else t.detach().requires_grad_(needs)
                  for t, needs in zip(ctx.saved_tensors, ctx.needs_input_grad[1:])]
        dev, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(dev, dtype=dtype, enabled=enabled):
            out = ctx.fn(*inputs)
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ())
        return (None,) + tuple(next(grads) if t is not None and t.requires_grad else None for t in inputs)


def _few_keys_fp32_training(q, k, v) -> bool:
    nq, nk = q.shape[2], k.shape[2]
    return (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            and torch.promote_types(q.dtype, v.dtype) in (torch.float32, torch.float64)
            and not torch.is_autocast_enabled('cuda') and nk <= 1024 and nq >= 4 * nk)


@ATTENTION.register('softmax')
class SoftmaxAttention(AttentionKernel):
    """``A = softmax(S)``, masked scores at -inf. Fused SDPA path for ``forward``; explicit path for ``A``."""

    supports_bias = True
    supports_mask = True
    complexity = 'quadratic'

    def __init__(self, num_heads=None, head_dim=None, recompute=False):
        super().__init__(num_heads, head_dim)
        if not isinstance(recompute, bool):
            raise ValueError(f'softmax: recompute must be True or False, got {recompute!r}')
        self.recompute = recompute

    def extra_repr(self) -> str:
        return super().extra_repr() + f', recompute={self.recompute!r}'

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return nq * nk * (d + dv)  # S = q k^T, A @ v (SDPA's fused kernel does the same products)

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False, scale=None):
        """``scale``: the call's score scale (None: head_dim^-1/2). The explicit products keep the weights and what
        the scale makes: a float other than 1 scales a copy of q (XCiT passes 1: its temperature is in q already), a
        tensor the scores; SDPA keeps its output and log-sum-exp (a tensor scale folded into a copy of q)."""
        size, out = nq * nk, nq * dv
        tensor_scale = isinstance(scale, torch.Tensor)
        scaled = size if tensor_scale else 0 if scale == 1 else nq * d
        explicit = size <= TINY_CPU_ELEMENTS or ((masked or key_mask) and size <= EXPLICIT_CPU_ELEMENTS)
        if self.recompute:  # only the inputs are kept; the call's own tensors are held while it runs
            return 0, max(size, out, scaled) if explicit else max(out, size if masked else 0)
        if explicit:  # explicit products (CPU)
            return size + scaled, max(size, out, scaled)
        # SDPA: a mask or a bias goes in as one float Nq x Nk tensor
        return out + nq + (nq * d if tensor_scale else 0), max(out, size if masked else 0)

    def _score_map(self, q, k, hw, scale, bias, mask):
        q, k = upcast(q, k)
        with no_autocast(q):
            return softmax_map(scores(q, k, default_scale(scale, q.shape[-1], q), bias), mask)

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def _explicit(self, q, k, v, scale, bias, mask):
        """softmax(S) @ v without SDPA, in the working dtype (masked keys weigh exactly 0; a row that keeps no key
        is a zero row)."""
        dtype = v.dtype
        with no_autocast(v):
            q, k, v = upcast(q, k, v)
            sc = default_scale(scale, q.shape[-1], q)
            if isinstance(sc, torch.Tensor):
                s = (q @ k.transpose(-2, -1)) * sc
            else:
                # a float scale goes on q, as the official Swin / PVT code does: the product takes the (N, d) copy it
                # would make of a strided q anyway, and backward scales an (N, d) gradient, not an (N, N) one
                s = (q * sc if sc != 1 else q) @ k.transpose(-2, -1)
            if bias is not None:
                s = s.add_(bias.to(s.dtype))
            if mask is None:
                a = torch.softmax(s, dim=-1)
            else:
                # the mask as an additive 0 / lowest-value tensor, added in place: a broadcast bool where() over
                # the heads costs about three times as much
                s = s.add_(torch.zeros(mask.shape, dtype=s.dtype, device=s.device).masked_fill_(
                    ~mask, torch.finfo(s.dtype).min))
                a = _MaskedSoftmax.apply(s, mask)
            out = a @ v
        return cast_back(out, dtype)

    def _explicit_route(self, q, k, v, bias, mask) -> bool:
        """True: explicit products; False: SDPA (see the module docstring)."""
        size = q.shape[2] * k.shape[2]
        if size <= TINY_CPU_ELEMENTS and (q.device.type == 'cpu' or q.shape[-1] > FUSED_MAX_HEAD_DIM):
            return True
        if q.device.type == 'cpu':
            return (bias is not None or mask is not None) and size <= EXPLICIT_CPU_ELEMENTS
        # fp32 has no flash kernel, and the memory-efficient kernel's backward over many queries and few keys
        # (PVT's spatially reduced keys) is slower than the explicit products (docs/benchmarks.md, the cost models)
        return q.device.type == 'cuda' and _few_keys_fp32_training(q, k, v)

    def describe_path(self, q, k, v, bias=None, mask=None) -> str:
        return 'explicit products' if self._explicit_route(q, k, v, bias, mask) else 'SDPA'

    def _recomputes(self, q, k, v, bias, scale) -> bool:
        return self.recompute and torch.is_grad_enabled() and not _tracing() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, bias, scale))

    def _forward(self, q, k, v, hw, scale, bias, mask):
        run = self._explicit if self._explicit_route(q, k, v, bias, mask) else self._fused
        if self._recomputes(q, k, v, bias, scale):
            sc = scale if isinstance(scale, torch.Tensor) else None
            return _Recomputed.apply(
                lambda q_, k_, v_, b_, s_: run(q_, k_, v_, scale if s_ is None else s_, b_, mask), q, k, v, bias, sc)
        return run(q, k, v, scale, bias, mask)

    def _fused(self, q, k, v, scale, bias, mask):
        """SDPA (a bias and a mask become one float mask)."""
        s = default_scale(scale, q.shape[-1], q)
        attn_mask = None
        if bias is not None:
            attn_mask = bias.to(q.dtype)
            if mask is not None:
                attn_mask = attn_mask.masked_fill(~mask, float('-inf'))
        elif mask is not None:
            attn_mask = mask
        if isinstance(s, torch.Tensor):
            # SDPA takes only a float scale: fold a tensor scale (XCiT's temperature) into q
            q = q * s.to(q.dtype)
            s = 1.0
        dtype = v.dtype
        if q.dtype != v.dtype or k.dtype != v.dtype:
            q, k, v = (t.to(torch.promote_types(q.dtype, v.dtype)) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=s)
        return out.to(dtype)
