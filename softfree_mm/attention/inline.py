"""InLine attention: injective linear attention plus a local attention residual (Han et al., NeurIPS 2024).

``A_ij = s/N * phi(q_i).phi(k_j) + (1 - s * phi(q_i).kbar) / N`` with ``kbar`` the mean of ``phi(k)`` over the
keys a row may look at (``N`` of them). Rows sum to 1 by subtraction instead of division, weights may be negative,
and ``q -> A`` is injective (plain linear attention divides, so ``q`` and ``2q`` give the same row).
Without a mask it is computed in O(N) as ``phi(q) @ (phi(k)^T v) * s/N + (1 - s phi(q).kbar) * vbar``.
"""
import torch
import torch.nn.functional as F
from torch import nn

from . import ATTENTION
from .base import AttentionKernel, default_scale, resolve_hw, upcast, work_dtype, no_autocast




FEATURE_MAPS = ('identity', 'relu', 'exp')

# the 3x3 neighbourhood, offset o = (dy + 1) * 3 + (dx + 1) (cross-correlation order, as Conv2d)
_OFFSETS = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1))


def _feature(x, name):
    if name == 'relu':
        return F.relu(x)
    if name == 'exp':
        return torch.exp(x)
    return x


def neighbour_onehot(hw, device, dtype):
    """(N, 9, N) tensor: entry [i, o, j] is 1 when token j is the 3x3 neighbour ``o`` of token i on the (H, W)
    grid (row-major tokens); neighbours outside the grid (zero padding) have no entry."""
    h, w = hw
    n = h * w
    ys = torch.arange(h, device=device).view(h, 1).expand(h, w).reshape(n)
    xs = torch.arange(w, device=device).view(1, w).expand(h, w).reshape(n)
    cols = torch.arange(n, device=device)
    planes = []
    for dy, dx in _OFFSETS:
        ny, nx = ys + dy, xs + dx
        valid = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
        idx = ny * w + nx
        planes.append((idx.view(n, 1) == cols.view(1, n)) & valid.view(n, 1))
    return torch.stack(planes, dim=1).to(dtype)


def local_conv(v, weights, hw):
    """Apply one 3x3 kernel per sample and head (``weights`` (B, h, 1, 9)) to v (B, h, N, dv) laid out on the
    grid, zero padding: the same operation as ``A_res @ v`` with ``A_res`` from ``neighbour_onehot``."""
    b, nh, n, dv = v.shape
    h, w = hw
    grid = F.pad(v.reshape(b, nh, h, w, dv), (0, 0, 1, 1, 1, 1))
    out = torch.zeros_like(v).reshape(b, nh, h, w, dv)
    for o, (dy, dx) in enumerate(_OFFSETS):
        out = out + weights[..., o].reshape(weights.shape[0], weights.shape[1], 1, 1, 1) * \
            grid[:, :, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w, :]
    return out.reshape(b, nh, n, dv)


@ATTENTION.register('inline')
class InLineAttention(AttentionKernel):
    """Injective linear attention with an optional local attention residual.

    Args:
        feature_map: ``'identity'`` (the paper's default), ``'relu'`` or ``'exp'`` applied to q and k.
        local_residual: add the local attention residual. From the mean key token (masked mean under a mask)
            a grouped ``Conv1d(h*d -> h*d, 1, groups=h) -> GELU -> Conv1d(h*d -> 9*h, 1, groups=h)`` predicts ONE
            3x3 kernel per sample and per head, applied to v on the (H, W) grid with zero padding and added to the
            output. This is the paper's formulation (a local residual r_j over the 3x3 neighbourhood, part of the
            attention weights); the official code predicts one kernel per channel, but a per-channel kernel is
            not a weight matrix shared by all of v's channels. Per head, the residual is a term of ``A`` and
            ``out == attention_matrix(...) @ v`` holds exactly, residual included. Needs ``Nq == Nk == H*W``
            and the grid (``hw``, or a square grid when N is a perfect square). Its weights need
            ``num_heads`` and ``head_dim``.

    No additive bias. Masks are honoured by an explicit O(N^2) path (N and means over valid keys, residual
    weights multiplied by the mask), so a masked key equals a deleted key.
    """

    supports_bias = False
    supports_mask = True
    complexity = 'linear'
    needs_hw = True

    def __init__(self, num_heads=None, head_dim=None, feature_map='identity', local_residual=True):
        super().__init__(num_heads, head_dim)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"inline: unknown feature_map {feature_map!r}; valid feature maps: "
                             f"{', '.join(FEATURE_MAPS)}")
        if not isinstance(local_residual, bool):
            raise TypeError(f'inline: local_residual must be True or False, got {local_residual!r}')
        self.feature_map = feature_map
        self.local_residual = local_residual
        self.needs_hw = local_residual
        if local_residual:
            if num_heads is None or head_dim is None:
                raise ValueError('inline: the local residual has learned weights and needs num_heads and '
                                 f'head_dim (got num_heads={num_heads}, head_dim={head_dim}); pass both, or '
                                 'set local_residual=False')
            c = num_heads * head_dim
            self.residual = nn.Sequential(
                nn.Conv1d(c, c, 1, groups=num_heads), nn.GELU(), nn.Conv1d(c, 9 * num_heads, 1, groups=num_heads))

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, feature_map={self.feature_map!r}, local_residual={self.local_residual}'

    # ------------------------------------------------------------------ pieces
    def _grid(self, q, k, hw):
        if q.shape[2] != k.shape[2]:
            raise ValueError(f'inline: the local residual needs as many queries as keys on one (H, W) grid, got '
                             f'Nq={q.shape[2]} and Nk={k.shape[2]}; set local_residual=False for this layout')
        return resolve_hw(self.name, hw, k.shape[2])

    def _residual_weights(self, kbar):
        """kbar (B, h, L, d) mean key token(s) -> (B, h, L, 9) residual weights (L = 1, or Nq under a mask)."""
        b, nh, length, d = kbar.shape
        x = kbar.permute(0, 1, 3, 2).reshape(b, nh * d, length)
        conv1, act, conv2 = self.residual
        x = F.conv1d(x, conv1.weight.to(x.dtype), conv1.bias.to(x.dtype), groups=nh)
        x = F.conv1d(act(x), conv2.weight.to(x.dtype), conv2.bias.to(x.dtype), groups=nh)
        return x.reshape(b, nh, 9, length).permute(0, 1, 3, 2)

    def _masked_parts(self, q, k, scale, mask):
        """Explicit linear part of A (B, h, Nq, Nk) and the per-row mean key tokens, for a mask (or None)."""
        fq, fk = _feature(q, self.feature_map), _feature(k, self.feature_map)
        if mask is None:
            keep = torch.ones(1, 1, q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
        else:
            keep = mask.to(q.dtype)
        n = keep.sum(-1, keepdim=True).clamp_min(1.0)  # (.., Nq, 1)
        kbar_phi = (keep @ fk) / n  # (B, h, Nq, d) mean of phi(k) over the valid keys of each row
        s = scale
        a = (s * (fq @ fk.transpose(-2, -1)) + (1.0 - s * (fq * kbar_phi).sum(-1, keepdim=True))) / n
        a = a * keep
        kbar = (keep @ k) / n  # masked mean key token, one per row
        return a, kbar, keep

    # ------------------------------------------------------------------ API
    def _matrix(self, q, k, hw, scale, bias, mask):
        grid = self._grid(q, k, hw) if self.local_residual else None
        q, k = upcast(q, k)
        with no_autocast(q):  # sums and means in fp32
            s = default_scale(scale, q.shape[-1], q)
            a, kbar, keep = self._masked_parts(q, k, s, mask)
            if self.local_residual:
                r = self._residual_weights(kbar).expand(q.shape[0], q.shape[1], q.shape[2], 9)
                onehot = neighbour_onehot(grid, q.device, q.dtype)
                a = a + torch.einsum('bhio,ioj->bhij', r, onehot) * keep
            return a

    def _forward(self, q, k, v, hw, scale, bias, mask):
        if mask is not None:
            # the explicit path: N, means and the residual per row over the valid keys
            a = self._matrix(q, k, hw, scale, bias, mask)
            with no_autocast(v):
                dt = torch.promote_types(a.dtype, work_dtype(v))
                out = a.to(dt) @ v.to(dt)
            return out.to(v.dtype)
        grid = self._grid(q, k, hw) if self.local_residual else None
        dtype = v.dtype
        q, k, v = upcast(q, k, v)
        with no_autocast(q):  # the key-value sums in fp32
            dt = torch.promote_types(q.dtype, v.dtype)
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            s = default_scale(scale, q.shape[-1], q)
            fq, fk = _feature(q, self.feature_map), _feature(k, self.feature_map)
            n = k.shape[2]
            kv = fk.transpose(-2, -1) @ v  # (B, h, d, dv)
            kbar_phi = fk.mean(2, keepdim=True)  # (B, h, 1, d)
            vbar = v.mean(2, keepdim=True)  # (B, h, 1, dv)
            out = (fq @ kv) * (s / n) + (1.0 - s * (fq * kbar_phi).sum(-1, keepdim=True)) * vbar
            if self.local_residual:
                r = self._residual_weights(k.mean(2, keepdim=True))  # (B, h, 1, 9)
                out = out + local_conv(v, r, grid)
        return out.to(dtype)
