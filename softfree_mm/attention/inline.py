"""InLine attention: injective linear attention plus a local attention residual (Han et al., NeurIPS 2024).

``A_ij = s/N * phi(q_i).phi(k_j) + (1 - s * phi(q_i).kbar) / N`` with ``kbar`` the mean of ``phi(k)`` over the
keys a row may look at (``N`` of them). Rows sum to 1 by subtraction instead of division, weights may be negative,
and ``q -> A`` is injective (plain linear attention divides, so ``q`` and ``2q`` give the same row).
Without a mask it is computed in O(N) as ``phi(q) @ (phi(k)^T v) * s/N + (1 - s phi(q).kbar) * vbar``; so it is with
a key-only mask (``dispatch.key_only``, shape (..., 1, Nk): padded keys), whose masked keys' rows of phi(k), k and v are
zeroed and whose N, kbar and vbar count the valid keys only (a key-masked call stays on the torch path: the fused
kernel takes no mask). A general mask takes the explicit order, per row.

The local residual adds a 3x3 depthwise convolution of v on the (H, W) token grid whose weights are predicted per
sample from a summary vector by ``Conv1d(C, C, 1, groups=h) -> GELU -> Conv1d(C, 9 x, 1, groups=h)``:

* ``'channel'`` (the official code, default): one 3x3 kernel per sample and CHANNEL, predicted from the context,
  the mean over tokens of the attention layer's input (the backbone passes it: ``context=``). Each channel of v
  gets its own kernel, so this term is not a matrix shared by v's channels: ``attention_matrix`` returns the linear
  part only, ``matrix_is_complete`` is False, and ``out == A @ v + residual_output(...)``.
* ``'head'`` (ours): one 3x3 kernel per sample and HEAD, predicted from the mean key token. It is the paper's
  formulation (a local residual r_j over the 3x3 neighbourhood that is part of the attention weights), so it is a
  term of ``A`` and ``out == attention_matrix(...) @ v`` holds, residual included: attention maps and any analysis
  of A see the whole attention. Its weights are not those of the official releases.
"""
from typing import Union

import torch
import torch.nn.functional as F
from torch import nn

from . import ATTENTION, dispatch
from .base import AttentionKernel, as_4d, default_scale, key_keep, resolve_hw, upcast, work_dtype, no_autocast
from .fused_linear import allowed as fused_linear_allowed
from .neighbourhood import channel_conv, local_conv, neighbour_onehot
from .score_map import ScoreMap

FEATURE_MAPS = ('identity', 'relu', 'leakyrelu', 'exp')
RESIDUALS = ('channel', 'head')
EXP_TEMPERATURE = 0.2  # the official exp feature map: exp(0.2 x)
LEAKY_SLOPE = 0.01  # torch's nn.LeakyReLU default, as the official code


def _feature(x, name):
    if name == 'relu':
        return F.relu(x)
    if name == 'leakyrelu':
        return F.leaky_relu(x, LEAKY_SLOPE)
    if name == 'exp':
        return torch.exp(EXP_TEMPERATURE * x)
    return x


@ATTENTION.register('inline')
class InLineAttention(AttentionKernel):
    """Injective linear attention with an optional local attention residual.

    Args:
        feature_map: applied to q and k: ``'identity'`` (the paper's and official default), ``'relu'``,
            ``'leakyrelu'`` (slope 0.01) or ``'exp'`` (``exp(0.2 x)``, the official temperature).
        local_residual: ``'channel'`` (default, the official code: a 3x3 kernel per sample and channel predicted
            from ``context``, the mean of the attention layer's input), ``'head'`` (ours: a 3x3 kernel per sample
            and head from the mean key token, part of ``A``), or False (none). True means ``'head'``.
            Both need ``Nq == Nk == H*W`` and the grid (``hw``, or a square grid when N is a perfect square), and
            ``num_heads`` and ``head_dim`` for their weights ``residual.{0,2}`` (the official names and shapes for
            ``'channel'``: ``Conv1d(C, C, 1, groups=h)``, ``Conv1d(C, 9C, 1, groups=h)``, C = h x head_dim).
        impl ('auto' | 'explicit' | 'factorised'): the association order of the linear part (``dispatch.order``):
            'auto' takes the cheaper one for the call's shapes. SOFTFREE_ATTN_IMPL overrides it.

    ``context`` (forward argument, ``'channel'`` only): (B, C) or (B, h, head_dim), the summary the kernels are
    predicted from. The backbones pass the official one (Swin, PVT: the mean over the window's / image's tokens
    of the normed attention input; CSwin: the mean of the block input over the image). Without it the mean key
    token is used (per query row under a mask), a learned linear image of the mean layer input, so the kernel
    also runs where nobody passes a context.

    No additive bias. A key-only mask (shape (..., 1, Nk)) keeps the order the call would take without it (N and
    means over the valid keys); a general mask is honoured by an explicit O(N^2) path (N and means over each row's
    valid keys). The residual treats a neighbour a row may not look at as zero (as one outside the grid), so padded
    keys change nothing.
    """

    supports_bias = False
    supports_mask = True
    complexity = 'linear'
    needs_hw = True

    def __init__(self, num_heads=None, head_dim=None, feature_map='identity',
                 local_residual: Union[bool, str] = 'channel', impl='auto'):
        super().__init__(num_heads, head_dim)
        self.impl = dispatch.check_order_impl('inline', impl)
        dispatch.forced()  # a bad SOFTFREE_ATTN_IMPL is refused at build time
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"inline: unknown feature_map {feature_map!r}; valid feature maps: "
                             f"{', '.join(FEATURE_MAPS)}")
        if local_residual is True:
            local_residual = 'head'
        if local_residual is not False and local_residual not in RESIDUALS:
            raise ValueError(f"inline: local_residual must be 'channel' (official), 'head' (part of A) or False, "
                             f'got {local_residual!r}')
        self.feature_map = feature_map
        self.local_residual = local_residual
        self.needs_hw = local_residual is not False
        self.takes_context = local_residual == 'channel'
        self.matrix_is_complete = local_residual != 'channel'
        if local_residual:
            if num_heads is None or head_dim is None:
                raise ValueError('inline: the local residual has learned weights and needs num_heads and '
                                 f'head_dim (got num_heads={num_heads}, head_dim={head_dim}); pass both, or '
                                 'set local_residual=False')
            c = num_heads * head_dim
            out = 9 * c if local_residual == 'channel' else 9 * num_heads
            self.residual = nn.Sequential(
                nn.Conv1d(c, c, 1, groups=num_heads), nn.GELU(), nn.Conv1d(c, out, 1, groups=num_heads))

    def extra_repr(self) -> str:
        extra = '' if self.impl == 'auto' else f', impl={self.impl!r}'
        return (f'{super().extra_repr()}, feature_map={self.feature_map!r}, local_residual={self.local_residual!r}'
                + extra)

    def order_products(self, nq, nk, d, dv):
        # the linear part: phi(q) phi(k)^T and A @ v, or k^T v and q @ (k^T v); the residual the same in both
        res = self.local_residual
        shared = 10 * d * d + 9 * nq * dv if res == 'channel' else d * d + 9 * d + 9 * nq * dv if res == 'head' else 0
        return nq * nk * (d + dv) + shared, (nk + nq) * d * dv + shared

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        tokens = max(nq, nk) * max(d, dv)
        feats = 0 if self.feature_map == 'identity' else (nq + nk) * d  # phi(q), phi(k) (identity: q, k themselves)
        # the residual's weights from one summary vector: the two grouped 1x1 convs' outputs and the GELU between
        # ('channel': d, d and 9 d; 'head': d, d and 9); v on the grid is a view of v
        res = {'channel': 11 * d, 'head': 2 * d + 9}.get(self.local_residual, 0)
        if masked:  # a general mask, the explicit path per row: the float keep mask, the masked A, the per-row mean
            # keys; with the 'channel' residual its 3x3 conv per row keeps each of the nine shifted, masked v
            rows = 9 * nq * (dv + 1) if self.local_residual == 'channel' else 0
            return 2 * nq * nk + nq * d + rows + res + feats, max(nq * nk, tokens)
        # a key-only mask: phi(k) with its masked rows zeroed and the keep column; the residual's conv takes v with
        # its masked rows zeroed too
        keys = (nk * d + nk + (nk * dv + nk if self.local_residual else 0)) if key_mask else 0
        if self.order(nq, nk, d, dv) == 'explicit':
            # A and v / N, the mean phi(k) the offset is built from
            return nq * nk + nk * dv + d + res + feats + keys, max(nq * nk, tokens)
        # the offset 1 - s phi(q).kbar, k^T v, the mean phi(k) and the mean v
        return nq + d * dv + 2 * d + res + feats + keys, tokens

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        """Without a mask or with a key-only one: the order's products (``order_products``: k^T v and q @ (k^T v),
        or A and A @ v), the residual's two grouped 1x1 convs once per sample and the 3x3 depthwise conv on v. With a
        general mask (the explicit path): the row means and A, A @ v, the residual weights per query row (without a
        context) and its 3x3 neighbourhood."""
        res = self.local_residual
        if not masked:
            return self.order_flops(nq, nk, d, dv)
        total = 3 * nq * nk * d + nq * nk * dv  # keep @ phi(k), phi(q) phi(k)^T, keep @ k; A @ v
        if res == 'channel':
            total += nq * nk * d + nq * 10 * d * d + 9 * nq * dv
        elif res == 'head':
            total += nq * (d * d + 9 * d) + 9 * nq * nk
        return total

    # ------------------------------------------------------------------ pieces
    def _grid(self, q, k, hw):
        if q.shape[2] != k.shape[2]:
            raise ValueError(f'inline: the local residual needs as many queries as keys on one (H, W) grid, got '
                             f'Nq={q.shape[2]} and Nk={k.shape[2]}; set local_residual=False for this layout')
        return resolve_hw(self.name, hw, k.shape[2])

    def _residual_weights(self, summary):
        """summary (B, h, L, d): one summary vector per sample (L = 1) or per query row -> the residual weights
        (B, h, L, 9) for 'head', (B, h, L, d, 9) for 'channel'."""
        b, nh, length, d = summary.shape
        x = summary.permute(0, 1, 3, 2).reshape(b, nh * d, length)
        conv1, act, conv2 = self.residual
        x = F.conv1d(x, conv1.weight.to(x.dtype), conv1.bias.to(x.dtype), groups=nh)
        x = F.conv1d(act(x), conv2.weight.to(x.dtype), conv2.bias.to(x.dtype), groups=nh)
        if self.local_residual == 'head':
            return x.reshape(b, nh, 9, length).permute(0, 1, 3, 2)
        # official output layout: channel c of the (grouped) conv gives rows 9c .. 9c+8, the 3x3 kernel of channel c
        return x.reshape(b, nh, d, 9, length).permute(0, 1, 4, 2, 3)

    def _context_summary(self, context, q):
        """The given context as (B, h, 1, d), checked."""
        b, nh, _, d = q.shape
        if context.dim() == 2 and context.shape == (b, nh * d):
            ctx = context.view(b, nh, 1, d)
        elif context.dim() == 3 and context.shape == (b, nh, d):
            ctx = context.unsqueeze(2)
        else:
            raise ValueError(f'inline: context must be (B, C) = ({b}, {nh * d}) or (B, heads, head_dim) = '
                             f'({b}, {nh}, {d}), got {tuple(context.shape)}')
        return ctx.to(work_dtype(q))

    def _channel_term(self, k, v, grid, mask, context):
        """The official residual for v (B, h, N, d): weights from the context (or the mean key token)."""
        if v.shape[-1] != k.shape[-1]:
            raise ValueError(f"inline: local_residual='channel' convolves each channel of v with its own kernel "
                             f'and needs v with head_dim={k.shape[-1]} channels per head, got {v.shape[-1]}')
        if dispatch.key_only(mask):  # every row the same keys: one set of weights, masked neighbours as zeros
            keep = key_keep(mask, k.dtype)  # (B', h', Nk, 1)
            if context is not None:
                w = self._residual_weights(self._context_summary(context, k))[:, :, 0]
            else:  # the mean valid key, elementwise (no product over the keys)
                w = self._residual_weights(self._masked_mean(k, keep))[:, :, 0]
            return channel_conv(v * keep, w, grid)
        if context is not None:
            w = self._residual_weights(self._context_summary(context, k))[:, :, 0]  # (B, h, d, 9)
        elif mask is None:
            w = self._residual_weights(k.mean(2, keepdim=True))[:, :, 0]
        else:  # the mean of each row's valid keys
            keep = as_4d(mask).to(k.dtype)
            kbar = (keep @ k) / keep.sum(-1, keepdim=True).clamp_min(1.0)
            w = self._residual_weights(kbar.expand(k.shape[0], k.shape[1], -1, -1))  # (B, h, Nq, d, 9)
        return channel_conv(v, w, grid, keep=mask)

    def _keep(self, q, k, mask):
        """(.., Nq, Nk) float keep-mask (all ones without a mask) and each row's number of valid keys (.., Nq, 1)."""
        if mask is None:
            keep = torch.ones(1, 1, q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
        else:
            keep = as_4d(mask).to(q.dtype)
        return keep, keep.sum(-1, keepdim=True).clamp_min(1.0)

    @staticmethod
    def _masked_mean(x, keep):
        """The mean of x (B, h, Nk, c) over the keys the keep column (B', h', Nk, 1) keeps: (B, h, 1, c)."""
        return (x * keep).sum(2, keepdim=True) / keep.sum(2, keepdim=True).clamp_min(1.0)

    def _head_term(self, q, kbar, keep, grid):
        """The 'head' residual as a part of A: each row's 3x3 neighbourhood, weighted from its mean valid key."""
        r = self._residual_weights(kbar).expand(q.shape[0], q.shape[1], q.shape[2], 9)
        return torch.einsum('bhio,ioj->bhij', r, neighbour_onehot(grid, q.device, q.dtype)) * keep

    def _masked_parts(self, q, k, scale, mask):
        """Explicit linear part of A (B, h, Nq, Nk) and the per-row mean key tokens, for a mask (or None)."""
        fq, fk = _feature(q, self.feature_map), _feature(k, self.feature_map)
        keep, n = self._keep(q, k, mask)
        kbar_phi = (keep @ fk) / n  # (B, h, Nq, d) mean of phi(k) over the valid keys of each row
        a = (scale * (fq @ fk.transpose(-2, -1)) + (1.0 - scale * (fq * kbar_phi).sum(-1, keepdim=True))) / n
        kbar = (keep @ k) / n  # masked mean key token, one per row
        return a * keep, kbar, keep

    # ------------------------------------------------------------------ API
    def _matrix(self, q, k, hw, scale, bias, mask):
        # the grid only for the 'head' residual, a term of A; the official 'channel' one is outside A, so A's rows of
        # any subset of queries (attention transfer samples them) are the linear part's
        grid = self._grid(q, k, hw) if self.local_residual == 'head' else None
        q, k = upcast(q, k)
        with no_autocast(q):  # sums and means in fp32
            a, kbar, keep = self._masked_parts(q, k, default_scale(scale, q.shape[-1], q), mask)
            return a + self._head_term(q, kbar, keep, grid) if self.local_residual == 'head' else a

    def _score_map(self, q, k, hw, scale, bias, mask):
        """S = s phi(q) phi(k)^T, and per row over its N valid keys ``A = (S + 1 - mean S) / N`` (plus the 'head'
        residual's weights, which do not depend on S): ``||J_i||_F^2 = (N - 1) / N^2``."""
        grid = self._grid(q, k, hw) if self.local_residual == 'head' else None
        q, k = upcast(q, k)
        with no_autocast(q):
            fq, fk = _feature(q, self.feature_map), _feature(k, self.feature_map)
            s = default_scale(scale, q.shape[-1], q) * (fq @ fk.transpose(-2, -1))
            keep, n = self._keep(q, k, mask)
            offset = self._head_term(q, (keep @ k) / n, keep, grid) if self.local_residual == 'head' else 0.0

        def weights(x):
            return (x + (1.0 - (x * keep).sum(-1, keepdim=True) / n)) / n * keep + offset

        def row_jacobian_sq(x):
            valid = keep.sum(-1)
            return ((valid - 1.0).clamp_min(0.0) / (valid * valid).clamp_min(1.0)).expand(x.shape[:-1])
        return ScoreMap(s.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]), weights, row_jacobian_sq)

    def residual_output(self, q, k, v, hw=None, scale=None, bias=None, mask=None, context=None):
        """``out - attention_matrix(...) @ v``: the official per-channel residual ('channel'), else zero."""
        self._check(q, k, v, hw, scale, bias, mask)
        if self.local_residual != 'channel':
            return super().residual_output(q, k, v, hw, scale, bias, mask, context)
        grid = self._grid(q, k, hw)
        dtype = torch.promote_types(work_dtype(k), work_dtype(v))
        with no_autocast(v):
            return self._channel_term(k.to(dtype), v.to(dtype), grid, mask, context).to(v.dtype)

    def _forward(self, q, k, v, hw, scale, bias, mask, context=None):
        if dispatch.general(mask):
            # the explicit path: N, means and the residual per row over the valid keys
            a = self._matrix(q, k, hw, scale, bias, mask)
            with no_autocast(v):
                dt = torch.promote_types(a.dtype, work_dtype(v))
                out = a.to(dt) @ v.to(dt)
                if self.local_residual == 'channel':
                    out = out + self._channel_term(k.to(dt), v.to(dt), self._grid(q, k, hw), mask, context)
            return out.to(v.dtype)
        grid = self._grid(q, k, hw) if self.local_residual else None
        dtype = v.dtype
        n = k.shape[2]
        s = default_scale(scale, q.shape[-1], q)
        if (mask is None and self.feature_map in ('identity', 'relu') and not isinstance(s, torch.Tensor)
                and fused_linear_allowed(q)
                and self.order(q.shape[2], n, q.shape[3], v.shape[3], False, q.device.type) == 'factorised'):
            # the linear part by the fused bidirectional kernel (fused_linear.py), the residual as below
            from .fused_linear import fused_linear
            with no_autocast(v):
                out = fused_linear(q, k, v, 'injective', self.feature_map, alpha=s / n, beta=1.0 / n)
            if out is not None:
                if not self.local_residual:
                    return out.to(dtype)
                q, k, v = upcast(q, k, v)
                with no_autocast(q):  # the residual in fp32, as below
                    dt = torch.promote_types(q.dtype, v.dtype)
                    res = self._residual(q.to(dt), k.to(dt), v.to(dt), grid, context)
                    return (out.to(dt) + res).to(dtype)
        q, k, v = upcast(q, k, v)
        with no_autocast(q):  # the key-value sums in fp32
            dt = torch.promote_types(q.dtype, v.dtype)
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            s = default_scale(scale, q.shape[-1], q)
            fq, fk = _feature(q, self.feature_map), _feature(k, self.feature_map)
            keep = key_keep(mask, dt)  # None, or a key-only mask as a (B', h', Nk, 1) column
            if keep is None:
                n, kbar_phi, vbar = k.shape[2], fk.mean(2, keepdim=True), v.mean(2, keepdim=True)  # (B, h, 1, d)
                vk = v
            else:  # the masked keys' rows of phi(k) and v are 0; N, kbar and vbar count the valid keys
                n = keep.sum(2, keepdim=True).clamp_min(1.0)  # (B', h', 1, 1)
                fk, vk = fk * keep, v * keep
                kbar_phi, vbar = fk.sum(2, keepdim=True) / n, vk.sum(2, keepdim=True) / n
            offset = 1.0 - s * (fq * kbar_phi).sum(-1, keepdim=True)  # (B, h, Nq, 1)
            if self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], False, q.device.type) == 'factorised':
                kv = fk.transpose(-2, -1) @ v  # (B, h, d, dv)
                out = (fq @ kv) * (s / n) + offset * vbar
            else:  # A = (s phi(q) phi(k)^T + offset) / N built (XCiT's channel attention: d_h x d_h)
                out = ((fq @ fk.transpose(-2, -1)) * s + offset) @ (vk / n)
            out = out + self._residual(q, k, v, grid, context, mask)
        return out.to(dtype)

    def _residual(self, q, k, v, grid, context, mask=None):
        """The local residual's output without a mask or with a key-only one (0 without a residual)."""
        if self.local_residual == 'head':
            if mask is None:
                r = self._residual_weights(k.mean(2, keepdim=True))  # (B, h, 1, 9)
                return local_conv(v, r, grid)
            keep = key_keep(mask, v.dtype)  # the mean valid key's weights; a masked neighbour counts as zero
            return local_conv(v * keep, self._residual_weights(self._masked_mean(k, keep)), grid)
        if self.local_residual == 'channel':
            return self._channel_term(k, v, grid, mask, context)
        return 0.0

    def _forward_context(self, q, k, v, hw, scale, bias, mask, context):
        return self._forward(q, k, v, hw, scale, bias, mask, context=context)
