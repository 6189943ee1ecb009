"""Swin Transformer (Liu et al. 2021) whose window attention runs through any softfree_mm attention kernel.

Window stages pad the grid bottom/right to a window multiple; shifted blocks roll by window // 2 and mask the regions
the roll joins (kernels with ``supports_mask``). The padding rule is declared (``pad_keys``, ``always_shift``): ours
removes pad keys (a key mask, which keeps a linear kernel's factorised order in unshifted windows) and does not shift
an axis one window long; mmdet's and the official detection / segmentation code attend to zero pad tokens and always
shift (``MMDET_PADDING``, taken by the presets and configs of the releases trained so).
``global_window`` makes a stage's window its whole grid (no pad, shift, mask or bias table: every kernel fits, the
InLine set-up). Grid kernels get ``hw`` = the window, context kernels the mean of its real tokens. Presets: tiny ..
large and the official InLine models. Layout: timm's names, patch merging at the start of stage i > 0. The layers
are swin_layers.py's."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmengine.logging import print_log
from torch import nn

from ...attention.fit import require_kernel_fit
from ..utils.cfg import check_foreign_args, expand_per_block, global_first_stages, pretrain_hw
from ..utils.tokens import PatchEmbed
from ..utils.windows import PAD_KEYS
from .base import Family, StagedBackbone, mmdet_checks, register_family
from .swin_convert import SwinArchSpec, convert_swin
from .swin_layers import SwinStage

__all__ = ['SoftFreeSwin']

_T = dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_S = dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
_B = dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))


def agent_cfg(agent_num: int, window: int, shape=None, **kw) -> dict:
    """One stage's agent kernel as the Agent Attention releases build it: ``agent_num`` agents (biases trained at
    the stage's ``window`` x ``window`` grid, 224 input), ``shape`` the agent grid the detection / segmentation
    set-ups pool instead (their ``downstream_agent_shapes``; the biases' agent axis is resized to it)."""
    cfg = dict(type='agent', agent_num=agent_num, window_size=window, **kw)
    if shape is not None:
        cfg['downstream_agent_shape'] = tuple(shape)
    return cfg


# the official Agent-Swin models (LeapLabTHU/Agent-Attention, cfgs/agent_swin_{t,s}.yaml: window 56, agents 9-16-49-49,
# 'AAAB' / 'AABB'); '_downstream': the detection / segmentation set-up (downstream_agent_shapes 9-12-14-7)
_AGENT_SWIN = tuple(agent_cfg(n, w) for n, w in ((9, 56), (16, 28), (49, 14), (49, 7)))
_AGENT_SWIN_DOWN = tuple(agent_cfg(n, w, (s, s)) for n, w, s in ((9, 56, 9), (16, 28, 12), (49, 14, 14), (49, 7, 7)))
# the padding rule of mmdet's SwinTransformer and of the official Swin / Agent-Swin detection and segmentation code
# (windows.WindowGeometry): pad tokens attended as zero keys, shifted blocks roll along both axes whatever the grid
MMDET_PADDING = dict(pad_keys='zeros', always_shift=True)
_DOWNSTREAM_PADDING = MMDET_PADDING
ARCH_ZOO: Dict[str, dict] = {
    'tiny': _T,
    'small': _S,
    'base': _B,
    'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
    # the official InLine models (LeapLabTHU/InLine, cfgs/inline_swin_{t,s,b}.yaml)
    'inline_tiny': dict(_T, attn_cfg=('inline', 'inline', 'inline', 'softmax'),
                        global_window=(True, True, True, False)),
    'inline_small': dict(_S, attn_cfg=('inline', 'inline', 'softmax', 'softmax'),
                         global_window=(True, True, False, False)),
    'inline_base': dict(_B, attn_cfg=('inline', 'inline', ('inline',) * 2 + ('softmax',) * 16, 'softmax'),
                        global_window=(True, True, (True,) * 2 + (False,) * 16, False)),
    'agent_tiny': dict(_T, attn_cfg=_AGENT_SWIN[:3] + ('softmax',), global_window=(True, True, True, False)),
    'agent_small': dict(_S, attn_cfg=_AGENT_SWIN[:2] + ('softmax',) * 2, global_window=(True, True, False, False)),
    # the downstream code pads windows with zero tokens attended as keys and always shifts (its detection /
    # segmentation swin: the pad rule of mmdet's SwinTransformer): the released detectors were trained so
    'agent_tiny_downstream': dict(_T, attn_cfg=_AGENT_SWIN_DOWN[:3] + ('softmax',),
                                  global_window=(True, True, True, False), **_DOWNSTREAM_PADDING),
    'agent_small_downstream': dict(_S, attn_cfg=_AGENT_SWIN_DOWN[:2] + ('softmax',) * 2,
                                   global_window=(True, True, False, False), **_DOWNSTREAM_PADDING),
}


# ---------------------------------------------------------------------------------------------- backbone
@register_family
class SoftFreeSwin(StagedBackbone):
    """Swin Transformer backbone with swappable attention kernels.

    Args:
        arch: 'tiny' | 'small' | 'base' | 'large' | 'inline_tiny' | 'inline_small' | 'inline_base' | 'agent_tiny' |
            'agent_small' (the Agent-Swin releases) | 'agent_tiny_downstream' | 'agent_small_downstream' (their
            detection / segmentation set-up: more agents per stage, the same weights), or a dict with
            embed_dims, depths, num_heads (and attn_cfg, global_window).
        embed_dims, depths, num_heads: override the preset.
        attn_cfg: one kernel config (name or dict) for every stage, or a list with one per stage, where a stage's
            entry may itself be a list with one config per block. Default: the preset's, else 'softmax'.
        global_window: bool, or one per stage (a stage's entry may be one per block); True = the window is the
            stage's whole token grid (no shift, no padding, no mask, no relative position bias). Default: the
            preset's, else False.
        window_size: window side of the non-global stages (7).
        pad_keys: how a window stage pads a grid that is no multiple of the window (every COCO image): 'mask' (ours,
            the default: pad keys removed, so padding changes nothing) or 'zeros' (mmdet's SwinTransformer and the
            official detection / segmentation code: zero pad tokens attended as keys). Default: the preset's, else
            'mask'. A released detector or segmentor computes its numbers with the rule it was trained with
            (docs/official_weights.md): ``MMDET_PADDING`` for mmdet's Swin detectors and the Agent downstream presets.
        always_shift: False (ours, the default: no shift along an axis that holds one window, as the classification
            code at 224) or True (mmdet's and the official downstream code: shifted blocks roll along both axes
            whatever the grid). Default: the preset's, else False.
        downsample: 'merge' (Swin's patch merging: the official) or 'conv' (ours: PVTv2's overlapping 3x3 stride-2
            patch embedding between stages).
        mlp: 'linear' (Swin's MLP: the official) or 'dwconv' (ours: PVTv2's, a depthwise 3x3 conv on the grid
            after fc1). The two 'ours' forms make the study's windowed backbone (configs/demo/study_swin_digits.py):
            a Swin whose convolutions are PVTv2-b0's; a plain Swin does not leave chance in the study's 300
            iterations (docs/warm_start.md). With either, every conv takes PVTv2's initialisation (normal,
            std sqrt(2 / fan_out), zero bias: ``conv_init='fan_out'``) instead of torch's: under torch's the same
            model stayed at chance in the study's recipe.
        out_indices: which stage outputs to return (NCHW, strides 4, 8, 16, 32), each through ``norm{i}``.
        frozen_stages: -1 none; 0 the patch embedding; k >= 1 also stages 0..k-1, the patch merging after each
            and their output norms (as mmdet's SwinTransformer).
        with_cp: activation checkpointing per block in training (``use_reentrant=False``).
        init_cfg: ``dict(type='Pretrained', checkpoint=..., prefix=None)`` loads official / timm / mmdet
            Swin files through :func:`convert_swin`; ``pretrained=PATH`` is its deprecated alias.

    mmdet's ``SwinTransformer`` arguments are accepted with their meanings, so that ``type='SoftFreeSwin'`` is the
    only change an mmdet config needs: ``qk_scale`` (the factor on q.k; None = head_dim^-1/2), ``strides``
    (``(patch_size, 2, 2, 2)``: the only layout), ``convert_weights`` (checkpoints are always converted),
    ``use_abs_pos_embed`` (a learned ``absolute_pos_embed`` (1, H/patch * W/patch, C) at ``pretrain_img_size``
    (an int or (H, W)), added after the patch embedding; on another token grid it is resized bicubically, as
    mmpretrain's Swin does, where mmdet's adds it unresized and so runs at the pretrain size only),
    ``attn_drop_rate=0``, ``act_cfg=dict(type='GELU')``, ``norm_cfg=dict(type='LN')``; other values of the last
    three have no meaning here and are refused in one error naming them.
    """

    arch_zoo = ARCH_ZOO
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    arch_options = ('attn_cfg', 'global_window', 'pad_keys', 'always_shift')
    trunc_normal_params = ('absolute_pos_embed',)
    stem = ('patch_embed', 'absolute_pos_embed')
    _convert = staticmethod(convert_swin)
    family = Family(
        tiny=dict(arch=dict(embed_dims=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4))),  # shifted blocks too
        fit=('global windows', dict(global_window=True)), arch_spec=SwinArchSpec(),
        # mmdet's and the official files may hold the absolute positions; InLine-Swin-B's layout holds both block
        # kinds (InLine with the residual, softmax with the bias table)
        checkpoints={'swin': dict(arch='tiny', use_abs_pos_embed=True, embed_dims=8, num_heads=(1, 1, 1, 1)),
                     'inline_swin': dict(arch='inline_base', embed_dims=8, num_heads=(1, 1, 1, 1)),
                     'agent_swin': dict(arch='agent_tiny', embed_dims=8, num_heads=(1, 1, 1, 1))},
        benchmark={'swin_t': dict(arch='tiny'), 'swin_s': dict(arch='small')},
        # mmdet's Swin detectors / segmentors and the official Agent-Swin downstream releases pad as mmdet does
        downstream_padding={'swin': MMDET_PADDING, 'agent_swin': MMDET_PADDING},
        layout=lambda cfg: 'global tokens' if global_first_stages(cfg.get('global_window')) else 'windows')
    freeze_next_downsample = True

    def __init__(self, arch: Union[str, dict] = 'tiny', embed_dims: Optional[int] = None,
                 depths: Optional[Sequence[int]] = None, num_heads: Optional[Sequence[int]] = None,
                 attn_cfg: Union[str, dict, Sequence, None] = None, global_window: Union[bool, Sequence, None] = None,
                 window_size: int = 7, pad_keys: Optional[str] = None, always_shift: Optional[bool] = None,
                 downsample: str = 'merge', mlp: str = 'linear', mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, in_channels: int = 3,
                 patch_size: int = 4, patch_norm: bool = True, drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1, with_cp: bool = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, pretrained: Optional[str] = None,
                 # mmdet's SwinTransformer arguments
                 qk_scale: Optional[float] = None, strides: Optional[Sequence[int]] = None,
                 convert_weights: bool = True, pretrain_img_size: Union[int, Sequence[int]] = 224,
                 use_abs_pos_embed: bool = False, attn_drop_rate: float = 0.0, act_cfg: dict = dict(type='GELU'),
                 norm_cfg: dict = dict(type='LN')):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained, with_cp=with_cp)
        check_foreign_args('SoftFreeSwin', dict(
            strides=(strides, strides is None or tuple(strides) == (patch_size,) + (2,) * (len(tuple(strides)) - 1),
                     f'patch embedding stride patch_size={patch_size}, then 2 per stage'),
            use_abs_pos_embed=(use_abs_pos_embed, isinstance(use_abs_pos_embed, bool), 'True or False'),
            qk_scale=(qk_scale, qk_scale is None or (isinstance(qk_scale, (int, float)) and qk_scale > 0),
                      'a positive float or None'),
            **mmdet_checks(attn_drop_rate, act_cfg, norm_cfg, convert_weights)))
        pretrain_size = pretrain_hw('SoftFreeSwin', pretrain_img_size)
        preset = self.resolve_arch(arch)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        depths = tuple(preset['depths'] if depths is None else depths)
        num_heads = tuple(preset['num_heads'] if num_heads is None else num_heads)
        num_stages = len(depths)
        if len(num_heads) != num_stages:
            raise ValueError(f'SoftFreeSwin: depths {depths} and num_heads {num_heads} must have the same length')
        if downsample not in ('merge', 'conv'):
            raise ValueError(f"SoftFreeSwin: downsample must be 'merge' (Swin's) or 'conv' (PVTv2's), got "
                             f"{downsample!r}")
        if mlp not in ('linear', 'dwconv'):
            raise ValueError(f"SoftFreeSwin: mlp must be 'linear' (Swin's) or 'dwconv' (PVTv2's), got {mlp!r}")
        if mlp == 'dwconv' and drop_rate:
            raise ValueError(f"SoftFreeSwin: mlp='dwconv' has no dropout (PVTv2's MLP), got drop_rate={drop_rate!r}")
        if not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f'SoftFreeSwin: window_size must be a positive int, got {window_size!r}')
        pad_keys = preset.get('pad_keys', 'mask') if pad_keys is None else pad_keys
        always_shift = preset.get('always_shift', False) if always_shift is None else always_shift
        if pad_keys not in PAD_KEYS:
            raise ValueError(f"SoftFreeSwin: pad_keys must be one of {', '.join(map(repr, PAD_KEYS))} ('mask': pad "
                             "keys removed, ours; 'zeros': zero pad tokens attended as keys, mmdet's and the official "
                             f'detection / segmentation code), got {pad_keys!r}')
        if not isinstance(always_shift, bool):
            raise ValueError(f'SoftFreeSwin: always_shift must be True (shift along both axes whatever the grid: mmdet '
                             'and the official detection / segmentation code) or False (no shift along an axis one '
                             f'window long), got {always_shift!r}')
        self.pad_keys, self.always_shift = pad_keys, always_shift
        dims = self._stages_from(arch, depths, num_heads, embed_dims, out_indices, frozen_stages)
        self.window_size = window_size

        attn_cfg = preset.get('attn_cfg', 'softmax') if attn_cfg is None else attn_cfg
        global_window = preset.get('global_window', False) if global_window is None else global_window
        cfgs = expand_per_block(attn_cfg, depths, 'attn_cfg', 'SoftFreeSwin')
        global_window = expand_per_block(global_window, depths, 'global_window', 'SoftFreeSwin', kind=bool)
        self.attn_cfgs = cfgs
        self.global_window = tuple(tuple(g) for g in global_window)

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size, patch_size, pad_to=patch_size,
                                      norm=patch_norm)
        self.pos_grid = None
        self.absolute_pos_embed = None
        if use_abs_pos_embed:  # mmdet's: one row per patch of the pretrain image (floor), row-major
            self.pos_grid = (pretrain_size[0] // patch_size, pretrain_size[1] // patch_size)
            if min(self.pos_grid) < 1:
                raise ValueError(f'SoftFreeSwin: pretrain_img_size {pretrain_img_size!r} is smaller than one patch '
                                 f'(patch_size={patch_size}): the absolute position embedding would be empty')
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], embed_dims))
        self.drop_after_pos = nn.Dropout(drop_rate)
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        no_bias = []
        self.stages = nn.ModuleList()
        for i in range(num_stages):
            windows, with_bias = [], []
            uniform = len(set(global_window[i])) == 1 and all(c == cfgs[i][0] for c in cfgs[i])
            for j, (cfg, is_global) in enumerate(zip(cfgs[i], global_window[i])):
                where = f'stage {i}' if uniform else f'stage {i} block {j}'
                if is_global:
                    cls = require_kernel_fit(cfg, 'SoftFreeSwin', f'{where} (global window)', varying_length=True)
                    window = None
                else:
                    pads = 'padded keys masked' if pad_keys == 'mask' else 'zero pad keys'
                    cls = require_kernel_fit(
                        cfg, 'SoftFreeSwin',
                        f'{where} ({window_size}x{window_size} shifted windows, {pads}; '
                        f'set global_window=True for this stage to use it without masks)', needs_mask=True)
                    window = window_size
                windows.append(window)
                with_bias.append(cls.supports_bias and window is not None)
                if not with_bias[-1]:
                    note = (f"stage {i} ('{cfg['type']}', "
                            f"{'global window' if window is None else 'kernel takes no bias'})")
                    if note not in no_bias:
                        no_bias.append(note)
            start = sum(depths[:i])
            self.stages.append(SwinStage(
                dims[i - 1] if i else dims[0], dims[i], num_heads[i], windows, cfgs[i], mlp_ratio,
                qkv_bias, drop_rate, dpr[start:start + depths[i]], with_bias, with_cp,
                downsample=downsample if i > 0 else None, qk_scale=qk_scale, where=f'stage {i}',
                conv_mlp=mlp == 'dwconv', pad_keys=pad_keys, always_shift=always_shift))
        if no_bias:
            print_log('SoftFreeSwin: no relative position bias table in ' + ', '.join(no_bias), logger='current')
        self._add_out_norms(dims)
        if downsample == 'conv' or mlp == 'dwconv':
            self.conv_init = 'fan_out'  # PVTv2's convolutions with PVTv2's initialisation
        self._init_default()
        self._freeze_stages()

    def _frozen(self):
        frozen = super()._frozen()
        if self.frozen_stages >= 0 and self.absolute_pos_embed is not None:  # frozen with the patch embedding
            frozen.append(self.absolute_pos_embed)
        return frozen

    def _embed(self, x):
        x = self.patch_embed(x)
        if self.absolute_pos_embed is None:
            return x
        return x + self.positions(tuple(x.shape[1:3]))

    def positions(self, hw: Tuple[int, int]) -> torch.Tensor:
        """``absolute_pos_embed`` as (1, H, W, C) on an (H, W) token grid: bicubically resized (align_corners=False,
        in float32 as mmpretrain's Swin) when the grid is not the pretrain one."""
        gh, gw = self.pos_grid
        pos = self.absolute_pos_embed.view(1, gh, gw, -1)
        if tuple(hw) == (gh, gw):
            return pos
        grid = F.interpolate(pos.permute(0, 3, 1, 2).float(), size=tuple(hw), mode='bicubic', align_corners=False)
        return grid.to(pos.dtype).permute(0, 2, 3, 1)
