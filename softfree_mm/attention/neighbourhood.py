"""The 3x3 neighbourhood of each token on the (H, W) token grid: its one-hot matrix and the depthwise 3x3
convolutions of v over it (InLine's local residual, FLatten's conv on v)."""
import torch
import torch.nn.functional as F

from .base import as_4d

# the 3x3 neighbourhood, offset o = (dy + 1) * 3 + (dx + 1) (cross-correlation order, as Conv2d)
_OFFSETS = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1))


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
    """Apply one 3x3 kernel per sample and head (``weights`` (B or 1, h, 1, 9)) to v (B, h, N, dv) laid out on the
    grid, zero padding: the same operation as ``A_res @ v`` with ``A_res`` from ``neighbour_onehot``. One grouped
    conv (v's channels in the conv's batch, every (sample, head) a group): linear in N, no padded copy."""
    b, nh, n, dv = v.shape
    h, w = hw
    kernels = weights.expand(b, nh, 1, 9).reshape(b * nh, 1, 3, 3).to(v.dtype)
    grid = v.permute(3, 0, 1, 2).reshape(dv, b * nh, h, w)
    out = F.conv2d(grid, kernels, padding=1, groups=b * nh)
    return out.reshape(dv, b, nh, n).permute(1, 2, 3, 0)


def channel_conv(v, weights, hw, keep=None):
    """The official residual: one 3x3 kernel per sample and channel, ``weights`` (B, h, d, 9) (or (B, h, Nq, d, 9),
    one set per query row), applied to v (B, h, N, d) on the (H, W) grid with zero padding. With ``keep``
    (broadcastable to (B, h, N, N), True = may look at) a neighbour that a row may not look at counts as zero, as a
    neighbour outside the grid does."""
    b, nh, n, d = v.shape
    h, w = hw
    if keep is None and weights.dim() == 4:  # one grouped conv: every (sample, channel) its own 3x3 kernel
        grid = v.permute(0, 1, 3, 2).reshape(1, b * nh * d, h, w)
        out = F.conv2d(grid, weights.reshape(b * nh * d, 1, 3, 3).to(v.dtype), padding=1, groups=b * nh * d)
        return out.reshape(b, nh, d, n).permute(0, 1, 3, 2)
    per_row = weights.dim() == 5
    padded = F.pad(v.reshape(b, nh, h, w, d), (0, 0, 1, 1, 1, 1))
    rows = torch.arange(n, device=v.device)
    ys, xs = rows // w, rows % w
    out = torch.zeros_like(v)
    for o, (dy, dx) in enumerate(_OFFSETS):
        shifted = padded[:, :, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w, :].reshape(b, nh, n, d)
        if keep is not None:
            ny, nx = ys + dy, xs + dx
            inside = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
            cols = (ny.clamp(0, h - 1) * w + nx.clamp(0, w - 1)).view(1, 1, n, 1)
            k4 = as_4d(keep)
            k4 = k4.expand(k4.shape[0], k4.shape[1], n, n)
            sel = torch.gather(k4, 3, cols.expand(k4.shape[0], k4.shape[1], n, 1))
            shifted = shifted * (sel & inside.view(1, 1, n, 1)).to(v.dtype)
        wo = weights[..., o].to(v.dtype)  # (B, h, d) or (B, h, Nq, d)
        out = out + (wo if per_row else wo.unsqueeze(2)) * shifted
    return out
