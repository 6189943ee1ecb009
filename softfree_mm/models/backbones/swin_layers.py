"""Swin's layers: patch merging, the convolutional downsampling of the Agent-Swin set-up, window attention with a
swappable kernel, the block and the stage (the backbone is swin.py's)."""
from typing import Optional

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from ..attention import KernelAttention
from ..utils.mlp import DWConvMlp, Mlp
from ..utils.token_layout import TokenLayout
from ..utils.tokens import PatchEmbed
from ..utils.windows import WindowGeometry, geometry, relative_position_index
from .base import AttentionBlock, checkpointed


class PatchMerging(nn.Module):
    """2x2 neighbours concatenated in the official order (0,0), (1,0), (0,1), (1,1) -> LayerNorm -> Linear."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)

    def forward(self, x):
        b, h, w, c = x.shape
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        h2, w2 = (h + 1) // 2, (w + 1) // 2
        # (B, H/2, row offset, W/2, column offset, C) -> (B, H/2, W/2, column offset, row offset, C): the official
        # order as one copy (torch.cat of four strided slices: the same copy forward, but four full-size zero
        # tensors in backward)
        x = x.view(b, h2, 2, w2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h2, w2, 4 * c)
        return self.reduction(self.norm(x))


class ConvDownsample(nn.Module):
    """PVTv2's overlapping patch embedding between stages in Swin's (B, H, W, C) layout: a 3x3 conv of stride 2
    (padding 1: the grid halves, odd sides rounded up as :class:`PatchMerging` pads them) and a LayerNorm
    (``downsample='conv'``, ours: the study's windowed backbone, docs/warm_start.md)."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.embed = PatchEmbed(dim, out_dim, 3, 2, padding=1)

    def forward(self, x):
        return self.embed(x.permute(0, 3, 1, 2))


class WindowAttention(KernelAttention):
    """The kernel step of window attention: windows of the qkv projection -> kernel (with the relative position
    bias when there is a table, and the keep-mask of pads and shifted regions); the block's window layout
    (:meth:`SwinBlock._attend`) projects, gathers and projects back."""

    def __init__(self, dim: int, num_heads: int, window: Optional[int], attn_cfg: dict, qkv_bias: bool,
                 with_bias_table: bool, proj_drop: float, qk_scale: Optional[float] = None, where: str = ''):
        super().__init__(dim, num_heads, attn_cfg, owner='SoftFreeSwin', where=where, inputs='qkv',
                         qkv_bias=qkv_bias, scale=qk_scale)  # scale: the factor on q.k; None: head_dim ** -0.5
        self.proj_drop = nn.Dropout(proj_drop)
        if with_bias_table:
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
            self.register_buffer('relative_position_index', relative_position_index(window, window),
                                 persistent=False)
        else:
            self.relative_position_bias_table = None

    def position_bias(self, n: int) -> Optional[torch.Tensor]:
        """(1, heads, N, N) relative position bias of a window of N tokens, or None without a table."""
        if self.relative_position_bias_table is None:
            return None
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, self.num_heads).permute(2, 0, 1).unsqueeze(0)

    def forward(self, qkv, mask=None, hw=None, context=None):
        """qkv (B*nW, N, 3C): windows of the qkv projection; mask (B*nW, 1, N, N) keep-mask or None; context
        (B*nW, C) or None. Returns the heads' outputs (B*nW, N, C) *before* the output projection."""
        q, k, v = self.split_qkv(qkv)
        out = self.attend(q, k, v, hw=hw, bias=self.position_bias(qkv.shape[1]), mask=mask, context=context)
        return self.merge(out)


class SwinBlock(AttentionBlock):
    def __init__(self, dim, num_heads, window, shifted, attn_cfg, mlp_ratio, qkv_bias, drop, drop_path,
                 with_bias_table, with_cp, qk_scale=None, where='', conv_mlp=False):
        super().__init__()
        self.shifted = shifted
        self.conv_mlp = conv_mlp
        self.with_cp = with_cp
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window, attn_cfg, qkv_bias, with_bias_table, drop, qk_scale,
                                    where)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = (DWConvMlp(dim, int(dim * mlp_ratio), extra_relu=False) if conv_mlp else
                    Mlp(dim, int(dim * mlp_ratio), drop=drop))

    def _attend(self, x, geo: WindowGeometry):
        """The window layout. x (B, H, W, C) normed tokens: the qkv projection runs on the real tokens; its windows
        (pad slots holding qkv(0) = the qkv bias, as if zero tokens had been padded) are gathered in one step, and
        the output projection runs on the real tokens after they are gathered back (a per-token layer: the same
        values, no work on pads)."""
        attn = self.attn
        layout = geo.layout(self.shifted, x.shape[0])
        mask = geo.mask(self.shifted)
        if mask is not None and x.shape[0] > 1:
            mask = mask.repeat(x.shape[0], 1, 1, 1)  # (B*nW, 1, N, N): windows are batch-major
        context = layout.window_means(x) if attn.kernel.takes_context else None
        qkv = layout.to_windows(attn.qkv(x), fill=attn.qkv.bias)
        y = layout.from_windows(attn(qkv, mask=mask, hw=geo.window, context=context))
        return attn.proj_drop(attn.proj(y))

    def token_layout(self, nq, nk, x, geo: WindowGeometry) -> TokenLayout:
        """Where the tokens of this block's kernel call sit: windows of the padded grid, rolled by the shift in a
        shifted block (it rolls by (-sh, -sw), so frame position p holds token (p + shift) mod the padded size)."""
        (h, w), (hp, wp), (wh, ww) = geo.hw, geo.padded, geo.window
        sh, sw = geo.shift if self.shifted else (0, 0)
        if (wh, ww) == (h, w) and (hp, wp) == (h, w):
            kind, note = 'global', f'global window over the {h}x{w} grid'
        else:
            kind, note = 'window', f'{wh}x{ww} windows on the {h}x{w} grid'
            note += f', shifted by ({sh}, {sw})' if (sh, sw) != (0, 0) else ''
            note += f', padded to {hp}x{wp}' if (hp, wp) != (h, w) else ''
        return TokenLayout.windows(kind, (h, w), (hp, wp), (wh, ww), note, shift=(sh, sw),
                                   extra=dict(window=(wh, ww), shift=(sh, sw), padded=(hp, wp)))

    def _mlp(self, x):
        if not self.conv_mlp:
            return self.mlp(x)
        b, h, w, c = x.shape  # PVTv2's MLP takes (B, N, C) tokens and their grid
        return self.mlp(x.reshape(b, h * w, c), (h, w)).view(b, h, w, -1)

    def _forward(self, x, geo):
        x = x + self.drop_path(self._attend(self.norm1(x), geo))
        return x + self.drop_path(self._mlp(self.norm2(x)))

    def forward(self, x, geo: WindowGeometry):
        return checkpointed(self, self._forward, x, geo)


class SwinStage(nn.Module):
    def __init__(self, in_dim, dim, num_heads, windows, attn_cfgs, mlp_ratio, qkv_bias, drop, drop_paths,
                 with_bias_tables, with_cp, downsample: Optional[str], qk_scale=None, where='', conv_mlp=False,
                 pad_keys: str = 'mask', always_shift: bool = False):
        super().__init__()
        self.windows = tuple(windows)  # one per block; None = global window
        self.pad_keys, self.always_shift = pad_keys, always_shift  # the padding rule (windows.WindowGeometry)
        self.downsample = (None if downsample is None else
                           PatchMerging(in_dim, dim) if downsample == 'merge' else ConvDownsample(in_dim, dim))
        self.blocks = nn.ModuleList([
            SwinBlock(dim, num_heads, window, shifted=(window is not None and j % 2 == 1), attn_cfg=cfg,
                      mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop, drop_path=drop_paths[j],
                      with_bias_table=with_bias, with_cp=with_cp, qk_scale=qk_scale, where=where, conv_mlp=conv_mlp)
            for j, (window, cfg, with_bias) in enumerate(zip(windows, attn_cfgs, with_bias_tables))])

    def forward(self, x):
        if self.downsample is not None:
            x = self.downsample(x)
        geos = {w: geometry(tuple(x.shape[1:3]), w, x.device, self.pad_keys, self.always_shift)
                for w in set(self.windows)}
        for blk, window in zip(self.blocks, self.windows):
            x = blk(x, geos[window])
        return x
