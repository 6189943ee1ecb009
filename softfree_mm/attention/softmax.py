"""Softmax attention through scaled_dot_product_attention (the reference every other kernel is compared to)."""
import torch
import torch.nn.functional as F

from . import ATTENTION
from .base import AttentionKernel, default_scale, no_autocast, scores, upcast


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

    def _forward(self, q, k, v, hw, scale, bias, mask):
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
