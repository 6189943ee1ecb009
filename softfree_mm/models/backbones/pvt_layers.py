"""PVT's layers: spatial-reduction attention (SRA) with a swappable kernel, the block and the stage
(the backbones are pvt.py's)."""
import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from ...attention.fit import require_kernel_fit
from ..attention import KernelAttention
from ..utils.mlp import DWConvMlp, Mlp
from ..utils.token_layout import TokenLayout
from ..utils.tokens import grid_view, token_view
from .base import AttentionBlock


class SRAttention(KernelAttention):
    """Spatial-reduction attention: queries from every token, keys and values from the reduced grid (the
    layout), any kernel."""

    def __init__(self, dim, num_heads, attn_cfg, sr_ratio, linear_sra, qkv_bias, owner, where):
        require_kernel_fit(attn_cfg, owner, f'{where} (global attention)', varying_length=True)
        super().__init__(dim, num_heads, attn_cfg, owner=owner, where=where, inputs='q_kv', qkv_bias=qkv_bias,
                         build_kernel=False)
        self.linear_sra = linear_sra
        self.pool = self.act = None
        if linear_sra:
            self.pool = nn.AdaptiveAvgPool2d(7)
            self.sr = nn.Conv2d(dim, dim, 1)
            self.norm = nn.LayerNorm(dim)
            self.act = nn.GELU()
        elif sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        else:
            self.sr = self.norm = None
        self.reduces = self.sr is not None
        self.add_kernel(attn_cfg)
        if self.reduces:
            how = 'linear SRA (7x7 pooled keys)' if linear_sra else f'spatial reduction sr_ratio={sr_ratio}'
            fix = ('build a non-li arch with sr_ratios=(1, 1, 1, 1)' if linear_sra
                   else 'set sr_ratios=(1, 1, 1, 1) (the InLine set-up, no spatial reduction)')
            require_kernel_fit(attn_cfg, owner, f'{where} with {how}', kernel=self.kernel,
                               no_grid=f'keys come from a reduced grid (Nq != Nk), so queries and keys share no '
                                       f'token grid; {fix}')

    def reduce(self, x, hw):
        """The key / value tokens: the grid strided (or pooled) by ``sr``, normed (+ GELU for linear SRA)."""
        y = grid_view(x, hw)
        if self.pool is not None:
            y = self.pool(y)
        y = self.norm(token_view(self.sr(y)))
        return y if self.act is None else self.act(y)

    def token_layout(self, nq, nk, x, hw) -> TokenLayout:
        """Where the tokens of this layer's kernel call sit: queries on the grid, keys on it or on its reduced grid
        (each key over the cell of tokens its conv or pooling reads)."""
        (h, w) = hw = tuple(int(s) for s in hw)
        if not self.reduces:
            return TokenLayout.over_grid(hw, nq, nk, f'global over the {h}x{w} grid')
        if self.linear_sra:
            out = self.pool.output_size
            key_hw = (out, out) if isinstance(out, int) else tuple(out)
            note = f'keys average-pooled to {key_hw[0]}x{key_hw[1]} (linear SRA) from the {h}x{w} grid'
            return TokenLayout.reduced(hw, nq, nk, key_hw, note, adaptive=True)
        (r, _), (kh, kw) = self.sr.stride, self.sr.kernel_size
        key_hw = ((h - kh) // r + 1, (w - kw) // r + 1)
        note = f'keys from a stride-{r} reduction of the {h}x{w} grid ({key_hw[0]}x{key_hw[1]} keys)'
        return TokenLayout.reduced(hw, nq, nk, key_hw, note, adaptive=False, ratio=r)

    def forward(self, x, hw):
        q, k, v = self.project(x, self.reduce(x, hw) if self.reduces else None)
        out = self.attend(q, k, v, hw=None if self.reduces else tuple(hw), context=self.context(x))
        return self.proj(self.merge(out))


class PVTBlock(AttentionBlock):
    def __init__(self, dim, num_heads, attn_cfg, mlp_ratio, sr_ratio, linear_sra, conv_mlp, qkv_bias, drop_path,
                 owner, where):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = SRAttention(dim, num_heads, attn_cfg, sr_ratio, linear_sra, qkv_bias, owner, where)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.conv_mlp = conv_mlp
        self.mlp = DWConvMlp(dim, hidden, linear_sra) if conv_mlp else Mlp(dim, hidden, act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x, hw):
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        y = self.norm2(x)
        return x + self.drop_path(self.mlp(y, hw) if self.conv_mlp else self.mlp(y))


class PVTStage(nn.Module):
    def __init__(self, patch_embed, blocks, pos_shape, dim, stage_norm):
        super().__init__()
        self.patch_embed = patch_embed
        if pos_shape is not None:
            self.pos_shape = pos_shape
            self.pos_embed = nn.Parameter(torch.zeros(1, pos_shape[0] * pos_shape[1], dim))
        else:
            self.pos_embed = None
        self.blocks = blocks
        self.norm = nn.LayerNorm(dim, eps=1e-6) if stage_norm else None

    def positions(self, hw):
        """The learned positions, bilinearly resized to the grid (as the official detection code)."""
        pos = self.pos_embed
        if tuple(hw) == tuple(self.pos_shape):
            return pos
        c = pos.shape[-1]
        grid = pos.reshape(1, self.pos_shape[0], self.pos_shape[1], c).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=tuple(hw), mode='bilinear', align_corners=False)
        return grid.flatten(2).transpose(1, 2)
