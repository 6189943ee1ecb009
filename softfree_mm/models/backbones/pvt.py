"""Pyramid Vision Transformer v1 and v2 with a swappable kernel inside spatial-reduction attention (SRA).

Queries come from every token, keys and values from the grid reduced by a strided conv (PVTv2-li: 7x7 pooling);
without reduction (the InLine set-up ``sr_ratios=(1, 1, 1, 1)``) the kernel also gets ``hw``, and a kernel that
needs a grid is refused under reduction. No token is padded, so nothing is masked. Presets: v1 tiny .. large and
the official InLine-PVT models; v2 b0 .. b5, b2_li. ``convert_pvt`` / ``convert_pvt_v2`` (pvt_convert.py) map the
official and timm releases; the layers are pvt_layers.py's."""
from typing import Dict, Optional, Sequence, Union

import torch
from torch import nn

from ..utils.cfg import check_foreign_args, expand_attn_cfg, pretrain_hw
from ..utils.tokens import PatchEmbed, grid_view
from .base import Family, SoftFreeBackbone, checkpointed, mmdet_checks, register_family
from .pvt_convert import PVTArchSpec, PVTv2ArchSpec, convert_pvt, convert_pvt_v2
from .pvt_layers import PVTBlock, PVTStage

__all__ = ['SoftFreePVT', 'SoftFreePVTv2']

_TINY = dict(embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1))
_PROBE = dict(embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1))  # a small model with every name of a file
_NO_REDUCTION = ('sr_ratios=(1,1,1,1)', dict(sr_ratios=(1, 1, 1, 1)))  # where grid kernels fit
# how a v1 patch embedding treats an image (or grid) side that is no patch multiple: 'ceil' (ours, the default: zero
# padded up to one, so no pixel is dropped) or 'floor' (the official PVT, InLine-PVT and Agent-PVT code, and mmdet's
# PyramidVisionTransformer: a strided conv without padding drops the last partial patch). They agree wherever every
# side is a multiple of 32 (224 classification, mmdet's inputs padded to 32); a Semantic FPN at ADE20K's 512x683 gets
# 128x171 against 128x170.
PATCH_GRIDS = ('ceil', 'floor')


def _layout_of(family_name: str):
    """The family's ``layout`` declaration: 'reduced keys' when any stage reduces its keys (``sr_ratios`` > 1, or
    linear SRA's pooled keys), 'global tokens' otherwise; the preset's values unless the config sets them."""
    def layout(cfg: dict) -> str:
        from ..family import FAMILIES
        arch = cfg.get('arch', 'tiny' if family_name == 'SoftFreePVT' else 'b0')
        preset = arch if isinstance(arch, dict) else FAMILIES[family_name].arch_zoo.get(arch, {})
        sr = cfg.get('sr_ratios') or preset.get('sr_ratios') or (8, 4, 2, 1)
        linear = cfg.get('linear')
        linear = preset.get('linear', False) if linear is None else linear
        return 'reduced keys' if linear or any(int(r) > 1 for r in sr) else 'global tokens'
    return layout


# ---------------------------------------------------------------------- backbones
class _PVTBase(SoftFreeBackbone):
    arch_zoo: Dict[str, dict] = {}
    arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios')
    conv_init = 'fan_out'  # as the official code
    trunc_normal_params = ('pos_embed',)
    OWNER = 'PVT'
    VERSION = 1
    # mmdet's PyramidVisionTransformer (V2) layout: what its layout arguments must say to mean this model
    MMDET_LAYOUT = {}

    def __init__(self, arch, in_channels, embed_dims, depths, num_heads, mlp_ratios, sr_ratios, linear,
                 qkv_bias, attn_cfg, out_indices, drop_path_rate, frozen_stages, with_cp, pretrain_img_size,
                 init_cfg, pretrained=None, num_layers=None, mmdet_args=None, patch_grid=None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained, with_cp=with_cp)
        owner = self.OWNER
        self.arch = arch
        preset = self.resolve_arch(arch)
        pretrain_size = pretrain_hw(owner, pretrain_img_size)
        if num_layers is not None:  # mmdet's name for depths
            if depths is not None and tuple(depths) != tuple(num_layers):
                raise ValueError(f'{owner}: depths={depths} and num_layers={num_layers} (its mmdet name) disagree; '
                                 'give one of them')
            depths = num_layers
        if isinstance(embed_dims, int):  # mmdet's meaning: stage i has embed_dims * num_heads[i] channels
            heads = preset['num_heads'] if num_heads is None else num_heads
            embed_dims = tuple(embed_dims * h for h in heads)
        self._check_mmdet_args(mmdet_args or {})
        attn_cfg = preset.get('attn_cfg', 'softmax') if attn_cfg is None else attn_cfg
        given = dict(embed_dims=embed_dims, depths=depths, num_heads=num_heads, mlp_ratios=mlp_ratios,
                     sr_ratios=sr_ratios)
        cfg = {k: tuple(preset[k] if v is None else v) for k, v in given.items()}
        linear = preset.get('linear', False) if linear is None else bool(linear)
        patch_grid = preset.get('patch_grid', 'ceil') if patch_grid is None else patch_grid
        if patch_grid not in PATCH_GRIDS or (self.VERSION == 2 and patch_grid != 'ceil'):
            valid = PATCH_GRIDS if self.VERSION == 1 else ('ceil',)
            raise ValueError(f"{owner}: patch_grid must be one of {', '.join(map(repr, valid))} ('ceil': a grid "
                             "that is no patch multiple is zero padded up to one, ours; 'floor': the strided patch "
                             "conv drops the last partial patch, the official code"
                             f"{'' if self.VERSION == 1 else '; v2 overlapping embeddings round up by their padding'}"
                             f'), got {patch_grid!r}')
        self.patch_grid = patch_grid
        for k, v in cfg.items():
            if len(v) != 4:
                raise ValueError(f'{owner}: {k} must have 4 entries (one per stage), got {v}')
        self.out_indices = self.check_out_indices(out_indices, 4)
        self.frozen_stages = self.check_frozen_stages(frozen_stages, 4)
        self.embed_dims, self.depths, self.num_heads, self.sr_ratios = (
            cfg[k] for k in ('embed_dims', 'depths', 'num_heads', 'sr_ratios'))
        self.linear = linear
        self.out_channels = self.num_features = tuple(self.embed_dims[i] for i in self.out_indices)
        attn_cfgs = expand_attn_cfg(attn_cfg, 4, 'stage', owner)
        v2 = self.VERSION == 2
        dpr = [float(r) for r in torch.linspace(0, drop_path_rate, sum(self.depths))]
        stages, cur, cin = [], 0, in_channels
        for i in range(4):
            dim = self.embed_dims[i]
            # v2: overlapping convs (7x7/4, then 3x3/2, padding k // 2); v1: patches (4x4/4, then 2x2/2), the input
            # padded to a patch multiple ('ceil') or its last partial patch dropped ('floor'), and learned positions
            stride = 4 if i == 0 else 2
            k = (7 if i == 0 else 3) if v2 else stride
            pad_to = 1 if v2 or patch_grid == 'floor' else stride
            pe = PatchEmbed(cin, dim, k, stride, padding=k // 2 if v2 else 0, pad_to=pad_to, tokens=True)
            pos_shape = None if v2 else tuple(n // (4 * 2 ** i) for n in pretrain_size)
            blocks = nn.ModuleList([
                PVTBlock(dim, self.num_heads[i], attn_cfgs[i], cfg['mlp_ratios'][i], self.sr_ratios[i], linear,
                         conv_mlp=v2, qkv_bias=qkv_bias, drop_path=dpr[cur + j], owner=owner,
                         where=f'stage {i}') for j in range(self.depths[i])])
            stages.append(PVTStage(pe, blocks, pos_shape, dim, stage_norm=v2))
            cur += self.depths[i]
            cin = dim
        self.stages = nn.ModuleList(stages)
        self._init_default()
        self._freeze_stages()

    def _check_mmdet_args(self, args: dict) -> None:
        """mmdet's PyramidVisionTransformer arguments: those with one meaning here must say it."""
        checks = {}
        for name, value in args.items():
            if name in self.MMDET_LAYOUT:
                want = self.MMDET_LAYOUT[name]
                fits = value is None or (tuple(value) if isinstance(value, (list, tuple)) else value) == want
                checks[name] = (value, fits, f'this model has {want}')
        checks.update(
            num_stages=(args.get('num_stages', 4), args.get('num_stages', 4) == 4, 'four stages'),
            drop_rate=(args.get('drop_rate', 0.), args.get('drop_rate', 0.) == 0, 'no dropout layers'),
            **mmdet_checks(args.get('attn_drop_rate', 0.), args.get('act_cfg'), args.get('norm_cfg'),
                           args.get('convert_weights', True), ln_eps=1e-6))
        check_foreign_args(self.OWNER, checks)

    def _frozen(self):
        return list(self.stages[:max(self.frozen_stages, 0)])

    # ------------------------------------------------------------------ forward
    def forward(self, x):
        outs = []
        for i, stage in enumerate(self.stages):
            x, hw = stage.patch_embed(x)
            if stage.pos_embed is not None:
                x = x + stage.positions(hw)
            for blk in stage.blocks:
                x = checkpointed(self, blk, x, hw)
            if stage.norm is not None:
                x = stage.norm(x)
            x = grid_view(x, hw)  # the next patch embedding's conv runs channels-last
            if i in self.out_indices:
                outs.append(x.contiguous())
        return tuple(outs)

    def _stage_part_layer(self, i, part):
        """A stage's patch embedding / positions just before its first block, its norm just after its last."""
        return sum(self.depths[:i + (part not in ('patch_embed', 'pos_embed'))])


_DEPTHS = dict(tiny=(2, 2, 2, 2), small=(3, 4, 6, 3), medium=(3, 4, 18, 3), large=(3, 8, 27, 3))


def _sizes(prefix: str, base: dict, sizes=tuple(_DEPTHS), suffix: str = '') -> dict:
    """PVT's presets of one kind: '<prefix><size><suffix>' -> ``base`` with the size's depths."""
    return {f'{prefix}{size}{suffix}': dict(base, depths=_DEPTHS[size]) for size in sizes}


@register_family
class SoftFreePVT(_PVTBase):
    """PVT v1 (T/S/M/L): non-overlapping patch embeddings, learned positions resized to the grid, SRA; no
    per-output norm (the official v1 detection backbone has none).

    Args:
        arch: 'tiny' | 'small' | 'medium' | 'large', the official InLine models 'inline_tiny' .. 'inline_large'
            (heads 2-4-10-16, sr_ratios 1-1-1-1, InLine everywhere), the Agent-PVT models 'agent_tiny' /
            'agent_small' (sr_ratios 1-1-1-1, agent attention everywhere) and their detection / segmentation set-up
            'agent_tiny_downstream' / 'agent_small_downstream', or a dict with embed_dims, depths, num_heads,
            mlp_ratios, sr_ratios (and attn_cfg); explicit per-stage tuples override the preset.
        attn_cfg: one kernel config for all stages or a list of four. Default: the preset's, else 'softmax'.
        sr_ratios: (8, 4, 2, 1) by default; (1, 1, 1, 1) gives the InLine set-up (no spatial reduction).
        patch_grid: 'ceil' (ours: a side that is no patch multiple is zero padded up to one) or 'floor' (the official
            code's strided conv: the last partial patch dropped); see ``PATCH_GRIDS``. Default: the preset's (the
            Agent-PVT presets: 'floor', as their released detectors and segmentors were trained), else 'ceil'.
        pretrain_img_size: the image size the positional tables were learned at, an int or (H, W) (224: grids 56,
            28, 14, 7). out_indices, frozen_stages, drop_path_rate, with_cp, init_cfg, pretrained: as every backbone.

    mmdet's ``PyramidVisionTransformer`` arguments keep their meanings (``type='SoftFreePVT'`` is the only change an
    mmdet config needs): ``num_layers`` (= depths), an int ``embed_dims`` (stage i gets ``embed_dims *
    num_heads[i]`` channels), ``convert_weights`` (always converted), and the layout arguments at the values that
    describe this model (``MMDET_LAYOUT``, ``num_stages=4``, no dropout, GELU, LN eps 1e-6); other values are
    refused in one error naming them.
    """
    OWNER = 'SoftFreePVT'
    VERSION = 1
    arch_options = ('attn_cfg', 'patch_grid')
    _convert = staticmethod(convert_pvt)
    family = Family(tiny=dict(arch='tiny', **_TINY), fit=_NO_REDUCTION, arch_spec=PVTArchSpec(),
                    checkpoints={'pvt': dict(arch='tiny', **_PROBE), 'inline_pvt': dict(arch='inline_tiny', **_PROBE),
                                 'agent_pvt': dict(arch='agent_tiny', **_PROBE)},
                    benchmark={'pvt_s': dict(arch='small')}, layout=_layout_of('SoftFreePVT'),
                    # the official PVT / Agent-PVT detection and segmentation code (and mmdet's PVT) round down
                    downstream_padding={'pvt': dict(patch_grid='floor'), 'agent_pvt': dict(patch_grid='floor')})
    MMDET_LAYOUT = dict(patch_sizes=(4, 2, 2, 2), strides=(4, 2, 2, 2), paddings=(0, 0, 0, 0), use_abs_pos_embed=True,
                        norm_after_stage=False, use_conv_ffn=False)
    _common = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4),
                   sr_ratios=(8, 4, 2, 1))
    _inline = dict(_common, num_heads=(2, 4, 10, 16), sr_ratios=(1, 1, 1, 1), attn_cfg='inline')
    # the official Agent-PVT models (LeapLabTHU/Agent-Attention, models/agent_pvt.py, cfgs/agent_pvt_{t,s}.yaml: agents
    # 9-16-49-49, 'AAAA', agent_sr_ratios 1111, biases at the 56-28-14-7 grids); '_downstream': the detection /
    # segmentation set-up (downstream_agent_shapes 12-16-28-28)
    # (the official Agent-PVT code rounds its patch grids down: its detection / segmentation releases compute so)
    _agent = dict(_common, sr_ratios=(1, 1, 1, 1), patch_grid='floor',
                  attn_cfg=tuple(dict(type='agent', agent_num=n, window_size=w)
                                 for n, w in ((9, 56), (16, 28), (49, 14), (49, 7))))
    _agent_down = dict(_agent, attn_cfg=tuple(dict(c, downstream_agent_shape=(s, s))
                                              for c, s in zip(_agent['attn_cfg'], (12, 16, 28, 28))))
    # PVT's sizes; the official InLine models (LeapLabTHU/InLine, models/inline_pvt.py, cfgs/inline_pvt_{t,s,m,b}.yaml);
    # the Agent-PVT releases (tiny, small) and their downstream set-up
    arch_zoo = {**_sizes('', _common), **_sizes('inline_', _inline), **_sizes('agent_', _agent, ('tiny', 'small')),
                **_sizes('agent_', _agent_down, ('tiny', 'small'), '_downstream')}

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3,
                 embed_dims: Optional[Sequence[int]] = None, depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None, mlp_ratios: Optional[Sequence[float]] = None,
                 sr_ratios: Optional[Sequence[int]] = None, qkv_bias: bool = True,
                 attn_cfg: Union[str, dict, Sequence, None] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 drop_path_rate: float = 0.1, frozen_stages: int = -1, with_cp: bool = False,
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 init_cfg: Optional[dict] = None, pretrained: Optional[str] = None,
                 # mmdet's PyramidVisionTransformer arguments
                 num_layers: Optional[Sequence[int]] = None, num_stages: int = 4,
                 patch_sizes: Optional[Sequence[int]] = None, strides: Optional[Sequence[int]] = None,
                 paddings: Optional[Sequence[int]] = None, use_abs_pos_embed: Optional[bool] = None,
                 norm_after_stage: Optional[bool] = None, use_conv_ffn: Optional[bool] = None,
                 drop_rate: float = 0., attn_drop_rate: float = 0., act_cfg: Optional[dict] = None,
                 norm_cfg: Optional[dict] = None, convert_weights: bool = True, patch_grid: Optional[str] = None):
        mmdet_args = dict(num_stages=num_stages, patch_sizes=patch_sizes, strides=strides, paddings=paddings,
                          use_abs_pos_embed=use_abs_pos_embed, norm_after_stage=norm_after_stage,
                          use_conv_ffn=use_conv_ffn, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                          act_cfg=act_cfg, norm_cfg=norm_cfg, convert_weights=convert_weights)
        super().__init__(arch, in_channels, embed_dims, depths, num_heads, mlp_ratios, sr_ratios, False, qkv_bias,
                         attn_cfg, out_indices, drop_path_rate, frozen_stages, with_cp, pretrain_img_size, init_cfg,
                         pretrained, num_layers, mmdet_args, patch_grid)


@register_family
class SoftFreePVTv2(_PVTBase):
    """PVT v2 (b0-b5, b2_li): overlapping patch embeddings, depthwise conv in the MLP, per-stage LayerNorm,
    SRA (or linear SRA for 'b2_li': 7x7 adaptive pool + 1x1 conv + LN + GELU, with a ReLU in the MLP).

    Args: as ``SoftFreePVT`` (no positional tables; an arch dict may add ``linear``), plus ``linear`` to override
    the preset's SRA kind.

    mmdet's ``PyramidVisionTransformerV2`` arguments are accepted with their meanings (``type='SoftFreePVTv2'`` is the
    only change an mmdet config needs): ``num_layers`` (= depths), an int ``embed_dims`` (stage i gets
    ``embed_dims * num_heads[i]`` channels), ``convert_weights`` (checkpoints are always converted),
    ``pretrain_img_size`` (an int or (H, W), as mmdet checks it; it sizes an absolute position embedding, which v2
    does not have), and ``num_stages=4``, ``strides=(4, 2, 2, 2)``, ``drop_rate=attn_drop_rate=0``, GELU, LN with
    eps 1e-6; other values have no meaning here and are refused in one error naming them.
    """
    OWNER = 'SoftFreePVTv2'
    VERSION = 2
    arch_options = ('linear',)
    _convert = staticmethod(convert_pvt_v2)
    family = Family(tiny=dict(arch='b0', **_TINY), fit=_NO_REDUCTION, arch_spec=PVTv2ArchSpec(),
                    checkpoints={'pvt_v2': dict(arch='b0', **_PROBE)},
                    benchmark={'pvt_v2_b0': dict(arch='b0'), 'pvt_v2_b2': dict(arch='b2')},
                    layout=_layout_of('SoftFreePVTv2'))
    MMDET_LAYOUT = dict(strides=(4, 2, 2, 2))
    _wide = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4),
                 sr_ratios=(8, 4, 2, 1))
    arch_zoo = {
        'b0': dict(_wide, embed_dims=(32, 64, 160, 256), depths=(2, 2, 2, 2)),
        'b1': dict(_wide, depths=(2, 2, 2, 2)),
        'b2': dict(_wide, depths=(3, 4, 6, 3)),
        'b3': dict(_wide, depths=(3, 4, 18, 3)),
        'b4': dict(_wide, depths=(3, 8, 27, 3)),
        'b5': dict(_wide, depths=(3, 6, 40, 3), mlp_ratios=(4, 4, 4, 4)),
        'b2_li': dict(_wide, depths=(3, 4, 6, 3), linear=True),
    }

    def __init__(self, arch: Union[str, dict] = 'b0', in_channels: int = 3,
                 embed_dims: Optional[Sequence[int]] = None, depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None, mlp_ratios: Optional[Sequence[float]] = None,
                 sr_ratios: Optional[Sequence[int]] = None, linear: Optional[bool] = None, qkv_bias: bool = True,
                 attn_cfg: Union[str, dict, Sequence] = 'softmax', out_indices: Sequence[int] = (0, 1, 2, 3),
                 drop_path_rate: float = 0.1, frozen_stages: int = -1, with_cp: bool = False,
                 init_cfg: Optional[dict] = None, pretrained: Optional[str] = None,
                 # mmdet's PyramidVisionTransformerV2 arguments
                 num_layers: Optional[Sequence[int]] = None, num_stages: int = 4,
                 strides: Optional[Sequence[int]] = None, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 act_cfg: Optional[dict] = None, norm_cfg: Optional[dict] = None, convert_weights: bool = True,
                 pretrain_img_size: Union[int, Sequence[int]] = 224):
        mmdet_args = dict(num_stages=num_stages, strides=strides, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                          act_cfg=act_cfg, norm_cfg=norm_cfg, convert_weights=convert_weights)
        super().__init__(arch, in_channels, embed_dims, depths, num_heads, mlp_ratios, sr_ratios, linear, qkv_bias,
                         attn_cfg, out_indices, drop_path_rate, frozen_stages, with_cp, pretrain_img_size, init_cfg,
                         pretrained, num_layers, mmdet_args)
