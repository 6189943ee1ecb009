"""SOFT's own backbone (Lu et al., NeurIPS 2021 / IJCV 2024): the official ``SoftmaxFreeVisionTransformer``
computation with a swappable kernel in every stage.

Stages 1-3: post-norm SOFT blocks whose attention ties keys to queries (W_q, W_v) and gets the grid ``hw``; stage 4:
a class token joins the grid, pre-norm blocks with softmax by default (a grid kernel is refused there). Learned
positions per stage, bilinearly resized. ``convert_soft`` maps the official release (EMA weights preferred)."""
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from timm.layers import DropPath
from torch import nn

from ...attention.fit import require_kernel_fit
from ..attention import KernelAttention
from ..utils.cfg import expand_attn_cfg
from ..utils.mlp import Mlp
from ..utils.token_layout import TokenLayout
from .base import AttentionBlock, Family, SoftFreeBackbone, checkpointed, register_family
from .soft_convert import SOFTArchSpec, convert_soft

__all__ = ['SoftFreeSOFT']

OWNER = 'SoftFreeSOFT'
_W = dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16))
_SIZES = {
    'tiny': dict(_W, depths=(1, 2, 3, 2)),
    'small': dict(_W, depths=(1, 3, 20, 4)),
    'medium': dict(embed_dims=(64, 128, 288, 512), num_heads=(2, 4, 9, 16), depths=(1, 3, 29, 5)),
    'large': dict(_W, depths=(1, 3, 40, 5)),
    'huge': dict(embed_dims=(64, 128, 352, 512), num_heads=(2, 4, 11, 16), depths=(1, 5, 49, 5)),
}
# the official soft_{size} and soft_norm_{size} models
ARCH_ZOO: Dict[str, dict] = {**{k: dict(v, normalized=False) for k, v in _SIZES.items()},
                             **{f'{k}_norm': dict(v, normalized=True) for k, v in _SIZES.items()}}
LANDMARK_RATIOS = (8, 4, 2)
CONV_SIZES = (9, 5, 3)
POS_SIDES = (56, 28, 14, 7)  # the 224 grids the position tables were learned at
OUT_TYPES = ('featmap', 'cls_token')


def default_attn_cfg(normalized: bool) -> list:
    """The official kernels per stage: SOFT (ratios 8 / 4 / 2, convs on v 9 / 5 / 3) in stages 1-3, softmax in 4."""
    return [dict(type='soft', landmark_ratio=r, conv_size=c, normalized=normalized)
            for r, c in zip(LANDMARK_RATIOS, CONV_SIZES)] + ['softmax']


# ---------------------------------------------------------------------- layers
class ConvEmbed(nn.Module):
    """The official patch embeddings: 3 x (3x3 conv + BN + ReLU) with strides 2, 1, 2 (stem), or one stride-2 one."""

    def __init__(self, cin: int, dim: int, stem: bool, norm_cfg: dict):
        super().__init__()
        if stem:
            chans, strides = (cin, 32, 32, dim), (2, 1, 2)
        else:
            chans, strides = (cin, dim), (2,)
        layers = []
        for i, s in enumerate(strides):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, s, 1), build_norm_layer(norm_cfg, chans[i + 1])[1],
                       nn.ReLU()]
        self.proj = nn.Sequential(*layers)

    def forward(self, x):
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class SoftAttentionLayer(KernelAttention):
    """SOFT's attention module: W_q, W_v (no key projection: the kernel gets k = q) on the grid, kernel, output
    projection."""

    def __init__(self, dim, num_heads, attn_cfg, where):
        require_kernel_fit(attn_cfg, OWNER, f'{where} (attention over the whole grid)', varying_length=True)
        super().__init__(dim, num_heads, attn_cfg, owner=OWNER, where=where, inputs='q_v')


class SoftBlock(AttentionBlock):
    """Stages 1-3, post-norm: x = LN(x + drop(attn(x))); x = LN(x + drop(fc2(gelu_tanh(fc1(x)))))."""

    def __init__(self, dim, num_heads, attn_cfg, drop, where):
        super().__init__()
        self.attn = SoftAttentionLayer(dim, num_heads, attn_cfg, where)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim, act_layer=lambda: nn.GELU(approximate='tanh'))
        self.norm2 = nn.LayerNorm(dim)
        self.drop1 = nn.Dropout(drop)
        self.drop2 = nn.Dropout(drop)

    def token_layout(self, nq, nk, x, hw) -> TokenLayout:
        """Attention over the whole grid."""
        h, w = (int(s) for s in hw)
        return TokenLayout.over_grid((h, w), nq, nk, f'global over the {h}x{w} grid')

    def forward(self, x, hw):
        x = self.norm1(x + self.drop1(self.attn(x, tuple(hw))))
        return self.norm2(x + self.drop2(self.mlp(x)))

    def passthrough(self, x):
        # post-norm: with nothing added the block still normalises twice
        return self.norm2(self.norm1(x))


class GlobalAttentionLayer(KernelAttention):
    """Stage 4: q, kv, kernel over the class token and the grid (no spatial reduction), output projection."""

    def __init__(self, dim, num_heads, attn_cfg, qkv_bias, where):
        require_kernel_fit(attn_cfg, OWNER, f'{where} (class token + grid)', varying_length=True)
        super().__init__(dim, num_heads, attn_cfg, owner=OWNER, where=where, inputs='q_kv', qkv_bias=qkv_bias)
        require_kernel_fit(attn_cfg, OWNER, where, kernel=self.kernel,
                           no_grid='the class token joins the grid there, so there is no (H, W) token grid')


class GlobalBlock(AttentionBlock):
    """Stage 4, pre-norm (PVT's block without spatial reduction): LayerNorms with eps 1e-6."""

    def __init__(self, dim, num_heads, attn_cfg, mlp_ratio, qkv_bias, drop_path, where):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = GlobalAttentionLayer(dim, num_heads, attn_cfg, qkv_bias, where)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def token_layout(self, nq, nk, x, hw=None) -> TokenLayout:
        """A class token, then the grid, all attending globally (the class token has no place on the grid)."""
        h, w = (int(s) for s in hw)
        return TokenLayout.over_grid((h, w), nq, nk, f'global over a class token and the {h}x{w} grid (the class '
                                                     'token is not drawn)', prefix=max(0, nq - h * w))

    def forward(self, x, hw=None):
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class SOFTStage(nn.Module):
    def __init__(self, patch_embed, blocks, pos_side, dim, with_cls):
        super().__init__()
        self.patch_embed = patch_embed
        self.pos_side = pos_side
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_side * pos_side + int(with_cls), dim))
        self.with_cls = with_cls
        self.blocks = blocks

    def positions(self, hw):
        """The grid part of the table, bilinearly resized to ``hw`` (as the official code, always resized)."""
        table = self.pos_embed[:, int(self.with_cls):]
        s, c = self.pos_side, table.shape[-1]
        grid = F.interpolate(table.reshape(1, s, s, c).permute(0, 3, 1, 2), size=tuple(hw), mode='bilinear',
                             align_corners=False)
        return grid.flatten(2).transpose(1, 2)


# ---------------------------------------------------------------------- backbone
@register_family
class SoftFreeSOFT(SoftFreeBackbone):
    """SOFT's backbone (the official sizes) with swappable attention kernels.

    Args:
        arch: 'tiny' | 'small' | 'medium' | 'large' | 'huge' (official ``soft_*``) or the same with '_norm'
            (``soft_norm_*``: SOFT-Norm kernels), or a dict with embed_dims, depths, num_heads (and optionally
            normalized).
        attn_cfg: one kernel config for every stage or one per stage; default: the official SOFT kernels in stages
            1-3 (ratios 8 / 4 / 2, convs on v 9 / 5 / 3, normalised for '*_norm') and softmax in stage 4.
        out_type: 'featmap' (four NCHW maps) or 'cls_token' (the normed class token, for a linear classifier).
        out_indices: stages whose maps are returned ('featmap').
        norm_cfg: the patch embeddings' norm (BN as the official model; SyncBN for multi-GPU training).
        drop_path_rate: stochastic depth over all blocks: the official SOFT blocks turn their share into dropout on
            both residual branches, stage 4 into DropPath.
        frozen_stages: -1 none; k >= 1 freezes stages 0..k-1 (embedding, positions, blocks).
        with_cp: activation checkpointing per block (in training). init_cfg: ``dict(type='Pretrained',
            checkpoint=...)`` loads the official release (converted by :func:`convert_soft`; the EMA weights, which
            the official code evaluates, when the file has them); ``pretrained=PATH`` is its deprecated alias (as
            mmdet's and mmseg's backbones).
        norm_eval: keep the embeddings' BatchNorms in eval mode (frozen statistics) while training.
    """

    arch_zoo = ARCH_ZOO
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    arch_options = ('normalized',)
    trunc_normal_params = ('pos_embed', 'cls_token')  # as the official model; convs and BN keep torch's defaults
    _convert = staticmethod(convert_soft)
    family = Family(
        tiny=dict(arch=dict(embed_dims=(16, 32, 32, 32), num_heads=(1, 2, 2, 2), depths=(1, 1, 1, 1))),
        checkpoints={'soft': dict(arch=dict(depths=(1, 1, 1, 1), embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1)))},
        arch_spec=SOFTArchSpec(), layout='global tokens')
    _prefer_ema = True

    def __init__(self,
                 arch: Union[str, dict] = 'small',
                 in_channels: int = 3,
                 attn_cfg: Union[str, dict, Sequence, None] = None,
                 out_type: str = 'featmap',
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 drop_path_rate: float = 0.1,
                 frozen_stages: int = -1, with_cp: bool = False, norm_eval: bool = False,
                 init_cfg: Optional[dict] = None, pretrained: Optional[str] = None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained, with_cp=with_cp, norm_eval=norm_eval)
        self.arch = arch
        preset = self.resolve_arch(arch)
        dims, depths, heads = (tuple(preset[k]) for k in ('embed_dims', 'depths', 'num_heads'))
        if not len(dims) == len(depths) == len(heads) == 4:
            raise ValueError(f'{OWNER}: embed_dims {dims}, depths {depths} and num_heads {heads} need 4 entries each')
        if out_type not in OUT_TYPES:
            raise ValueError(f'{OWNER}: unknown out_type {out_type!r}; valid: {", ".join(OUT_TYPES)}')
        self.out_indices = self.check_out_indices(out_indices, 4)
        self.frozen_stages = self.check_frozen_stages(frozen_stages, 4)
        attn_cfg = default_attn_cfg(preset.get('normalized', False)) if attn_cfg is None else attn_cfg
        self.attn_cfgs = cfgs = expand_attn_cfg(attn_cfg, 4, 'stage', OWNER)
        self.embed_dims, self.depths, self.num_heads = dims, depths, heads
        self.out_type = out_type
        self.num_features = dims
        self.out_channels = (dims[3],) if out_type == 'cls_token' else tuple(dims[i] for i in self.out_indices)

        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        stages, cur, cin = [], 0, in_channels
        for i in range(4):
            where = f'stage {i}'
            pe = ConvEmbed(cin, dims[i], stem=i == 0, norm_cfg=norm_cfg)
            if i < 3:
                blocks = [SoftBlock(dims[i], heads[i], cfgs[i], dpr[cur + j], where) for j in range(depths[i])]
            else:
                blocks = [GlobalBlock(dims[i], heads[i], cfgs[i], mlp_ratio, qkv_bias, dpr[cur + j], where)
                          for j in range(depths[i])]
            stages.append(SOFTStage(pe, nn.ModuleList(blocks), POS_SIDES[i], dims[i], with_cls=i == 3))
            cur += depths[i]
            cin = dims[i]
        self.stages = nn.ModuleList(stages)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dims[3]))
        self.norm = nn.LayerNorm(dims[3], eps=1e-6)
        self._init_default()
        self._freeze_stages()

    def _frozen(self):
        frozen = list(self.stages[:max(self.frozen_stages, 0)])
        return frozen + [self.cls_token, self.norm] if self.frozen_stages >= 4 else frozen

    # ------------------------------------------------------------------ forward
    def forward(self, x):
        if x.dim() != 4:
            raise ValueError(f'{OWNER}: expected images (B, C, H, W), got shape {tuple(x.shape)}')
        b = x.shape[0]
        outs = []
        for i, stage in enumerate(self.stages):
            x, hw = stage.patch_embed(x)
            x = x + stage.positions(hw)
            if stage.with_cls:  # the class token with its own position (the table's first row)
                x = torch.cat([self.cls_token.expand(b, -1, -1) + stage.pos_embed[:, :1], x], dim=1)
            for blk in stage.blocks:
                x = checkpointed(self, blk, x, hw)
            if stage.with_cls:
                x = self.norm(x)
                if self.out_type == 'cls_token':
                    return (x[:, 0],)
                x = x[:, 1:]
            x = x.transpose(1, 2).reshape(b, -1, hw[0], hw[1]).contiguous()
            if self.out_type == 'featmap' and i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    # ------------------------------------------------------------------ optimiser helpers
    def _layer_id(self, name):
        """As the other backbones (a stage's embedding and positions just before its blocks); the class token with
        stage 4's embedding."""
        return sum(self.depths[:3]) if name.startswith('cls_token') else super()._layer_id(name)

    def no_weight_decay_keys(self):
        """Parameter-name fragments to exclude from weight decay (mmengine paramwise_cfg custom_keys)."""
        return ('pos_embed', 'cls_token')
