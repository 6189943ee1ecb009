"""Softmax attention through scaled_dot_product_attention (the reference every other kernel is compared to).

On the CPU, small matrices with a bias or a mask (Swin's 7x7 windows) and tiny ones (XCiT's channel attention)
are computed explicitly: PyTorch's CPU SDPA has no fused kernel for them under autograd and falls back to its math
path, which adds a float mask built from bias and mask and a safe-softmax pass; the explicit path (in place where
autograd allows) is faster and holds the same matrix for backward. Elsewhere (no mask, large matrices, CUDA)
SDPA's fused kernels run.
"""
import torch
import torch.nn.functional as F

from . import ATTENTION
from .base import AttentionKernel, cast_back, default_scale, no_autocast, scores, upcast, work_dtype

# (Nq x Nk) matrices up to this size take the explicit CPU path when they carry a bias or a mask, and up to the
# tiny size always (XCiT's d_h x d_h channel attention: its "head_dim" is the token count, beyond the fused
# kernel's, so SDPA falls back to its math path there too)
EXPLICIT_CPU_ELEMENTS = 1 << 16
TINY_CPU_ELEMENTS = 1 << 12


class _MaskedSoftmax(torch.autograd.Function):
    """softmax over the last dim of scores whose masked entries already hold the dtype's lowest value, with masked
    entries at weight 0 exactly and rows that keep nothing at 0. Keeps only the weights for backward (not the
    mask: a masked weight is 0, so is its gradient)."""

    @staticmethod
    def forward(ctx, s, mask):
        a = torch.softmax(s, dim=-1)  # a masked entry: exp(lowest - row max) underflows to exactly 0
        rows = mask.any(-1, keepdim=True)
        # a row without any valid key: uniform -> zero (the check skips a pass; tracers cannot branch on data)
        if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting() or \
                not bool(rows.all()):
            a = a.mul_(rows.to(a.dtype))
        ctx.save_for_backward(a)
        return a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        # a * (grad - sum(grad * a)) in one fused pass (four passes and two temporaries as plain tensor ops)
        return torch._softmax_backward_data(grad.to(a.dtype), a, -1, a.dtype), None


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

    def __init__(self, num_heads=None, head_dim=None):
        super().__init__(num_heads, head_dim)

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return nq * nk * (d + dv)  # S = q k^T, A @ v (SDPA's fused kernel does the same products)

    def _matrix(self, q, k, hw, scale, bias, mask):
        q, k = upcast(q, k)
        with no_autocast(q):
            s = scores(q, k, default_scale(scale, q.shape[-1], q), bias)
            if mask is not None:
                s = s.masked_fill(~mask, float('-inf'))
            # a row with no allowed key would be NaN: give it zero weights instead
            return torch.softmax(s, dim=-1).nan_to_num(0.0)

    def _explicit_cpu(self, q, k, v, scale, bias, mask):
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

    def _forward(self, q, k, v, hw, scale, bias, mask):
        size = q.shape[2] * k.shape[2]
        if q.device.type == 'cpu' and (size <= TINY_CPU_ELEMENTS or (
                (bias is not None or mask is not None) and size <= EXPLICIT_CPU_ELEMENTS)):
            return self._explicit_cpu(q, k, v, scale, bias, mask)
        if q.device.type == 'cuda' and _few_keys_fp32_training(q, k, v):
            # fp32 has no flash kernel, and the memory-efficient kernel's backward over many queries and few keys
            # (PVT's spatially reduced keys) runs ~5x slower than the explicit products (measured on an H200:
            # PVTv2-b2 forward + backward at 800x1216, 99.7 ms against mmdet's 50.2 ms)
            return self._explicit_cpu(q, k, v, scale, bias, mask)
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
