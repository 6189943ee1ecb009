"""Tokens and their grid: the conv patch embedding, (B, N, C) tokens seen as a channels-last (B, C, H, W) map and
back without a copy, and the mask of the real tokens of a padded grid."""
import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    """Conv patch embedding + LayerNorm (``proj``, ``norm``): images (B, C, H, W) -> tokens (B, H', W', C'), or with
    ``tokens`` ((B, H' * W', C'), (H', W')). ``pad_to``: zero pad bottom/right to a multiple first, so that a last
    partial patch is kept (non-overlapping patches)."""

    def __init__(self, in_channels: int, dim: int, kernel: int, stride: int, padding: int = 0, pad_to: int = 1,
                 norm: bool = True, tokens: bool = False):
        super().__init__()
        self.pad_to, self.tokens = pad_to, tokens
        self.proj = nn.Conv2d(in_channels, dim, kernel, stride, padding)
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()

    def forward(self, x):
        p = self.pad_to
        pad_h, pad_w = (-x.shape[-2]) % p, (-x.shape[-1]) % p
        if pad_h or pad_w:  # (F.pad with zero padding still copies the image, and the conv would keep that copy)
            x = F.pad(x, (0, pad_w, 0, pad_h))
        x = self.proj(x)
        if self.tokens:
            return self.norm(token_view(x)), (x.shape[2], x.shape[3])
        return self.norm(x.permute(0, 2, 3, 1))


def grid_view(x: torch.Tensor, hw) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) in channels-last memory: a view of contiguous tokens, no copy. Convolutions
    on it run channels-last (oneDNN's fastest CPU layout, and the GPU's), and :func:`token_view` turns their output
    back into tokens without a copy. (``x.transpose(1, 2).reshape(B, C, H, W)`` has the same strides, but
    convolutions answer it in NCHW, and the copies back and forth, forward and backward, cost more than the conv.)"""
    b, n, c = x.shape
    return x.reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2)


def token_view(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H * W, C) tokens; a view when ``x`` is channels-last (see :func:`grid_view`)."""
    b, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, h * w, c)


def padded_key_mask(valid_hw, padded_hw, device) -> torch.Tensor:
    """(Hp*Wp,) bool: True for real tokens of a grid padded bottom/right from ``valid_hw`` to ``padded_hw``."""
    (h, w), (hp, wp) = valid_hw, padded_hw
    m = torch.zeros(hp, wp, dtype=torch.bool, device=device)
    m[:h, :w] = True
    return m.flatten()
