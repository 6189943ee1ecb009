"""CSWin Transformer (Dong et al. 2022) whose stripe attention runs through any softfree_mm attention kernel.

Half the heads attend in vertical, half in horizontal stripes (LePE added); the last stage and ``global_window``
stages use one branch with all heads over the whole grid. Stripes that do not divide the grid are padded
symmetrically; ``pad_keys='mask'`` removes the pad keys by a key mask (kernels with ``supports_mask``; linear kernels
keep their factorised order), ``'zeros'`` keeps them as keys as the official segmentation code. Presets: tiny ..
large and the official InLine-CSwin models."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from ...attention.fit import require_kernel_fit
from ..attention import KernelAttention
from ..utils.cfg import expand_attn_cfg, global_first_stages, per_stage
from ..utils.mlp import Mlp
from ..utils.tokens import PatchEmbed
from ..utils.token_layout import TokenLayout
from ..utils.windows import _from_windows, _to_windows
from .base import AttentionBlock, Family, StagedBackbone, checkpointed, register_family
from .cswin_convert import CSWinArchSpec, convert_cswin

__all__ = ['SoftFreeCSWin']

_INLINE = dict(stripe_widths=(1, 2, 7, 7), attn_cfg=('inline', 'inline', 'softmax', 'softmax'),
               global_window=(True, True, False, False))
_AGENT = dict(_INLINE, attn_cfg=(dict(type='agent', agent_num=9, window_size=56, kernel_size=0),
                                  dict(type='agent', agent_num=16, window_size=28, kernel_size=0),
                                  'softmax', 'softmax'))
ARCH_ZOO: Dict[str, dict] = {
    'tiny': dict(embed_dims=64, depths=(1, 2, 21, 1), num_heads=(2, 4, 8, 16), stripe_widths=(1, 2, 7, 7)),
    'small': dict(embed_dims=64, depths=(2, 4, 32, 2), num_heads=(2, 4, 8, 16), stripe_widths=(1, 2, 7, 7)),
    'base': dict(embed_dims=96, depths=(2, 4, 32, 2), num_heads=(4, 8, 16, 32), stripe_widths=(1, 2, 7, 7)),
    'large': dict(embed_dims=144, depths=(2, 4, 32, 2), num_heads=(6, 12, 24, 24), stripe_widths=(1, 2, 7, 7)),
    # the official InLine models (LeapLabTHU/InLine, models/inline_cswin.py, cfgs/inline_cswin_{t,s,b}.yaml)
    'inline_tiny': dict(_INLINE, embed_dims=64, depths=(2, 4, 18, 1), num_heads=(2, 4, 8, 16)),
    'inline_small': dict(_INLINE, embed_dims=64, depths=(3, 6, 29, 2), num_heads=(2, 4, 8, 16)),
    'inline_base': dict(_INLINE, embed_dims=96, depths=(3, 6, 29, 2), num_heads=(4, 8, 16, 32)),
    # the official Agent-CSWin models (LeapLabTHU/Agent-Attention, models/agent_cswin.py, cfgs/agent_cswin_{t,s}.yaml:
    # 'AABB', agents 9-16, la_split_size 56-28: one branch over the whole grid; the official get_v is our LePE conv,
    # so the kernel has no dwc of its own)
    'agent_tiny': dict(_AGENT, embed_dims=64, depths=(2, 4, 18, 1), num_heads=(2, 4, 8, 16)),
    'agent_small': dict(_AGENT, embed_dims=64, depths=(3, 6, 29, 2), num_heads=(2, 4, 8, 16)),
}
PAD_KEYS = ('mask', 'zeros')


def stripe_geometry(hw: Tuple[int, int], stripe: Optional[Tuple[int, int]], clamp: bool = True):
    """Stripe size (sh, sw) and the symmetric padding (top, bottom, left, right). ``stripe`` None = one window over
    the whole grid. ``clamp``: a stripe wider than the grid is cut to it (ours: with pad keys removed that computes
    what padding would); without (the official segmentation code, ``pad_keys='zeros'``), the grid is padded up to it
    and the zero pad tokens are keys."""
    h, w = hw
    if stripe is None:
        return (h, w), (0, 0, 0, 0)
    sh, sw = (min(stripe[0], h), min(stripe[1], w)) if clamp else stripe
    ph, pw = (-h) % sh, (-w) % sw
    return (sh, sw), (ph // 2, ph - ph // 2, pw // 2, pw - pw // 2)


class StripeBranch(KernelAttention):
    """The stripe layout of a CSWin block's branch: stripes (or the whole grid) of the block's q, k, v -> kernel
    (+ pad-key mask) + LePE -> back to the grid; the block holds the projections its branches share."""

    def __init__(self, dim: int, num_heads: int, attn_cfg: dict, direction: Optional[str], stripe_width: int,
                 pad_keys: str = 'mask'):
        super().__init__(dim, num_heads, attn_cfg, owner='SoftFreeCSWin', where=f'{direction or "global"} branch',
                         inputs=None, out_proj=False)
        self.direction = direction  # 'vertical' | 'horizontal' | None (global)
        self.stripe_width = stripe_width
        self.pad_keys = pad_keys
        self.lepe = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def stripe(self, hw):
        if self.direction == 'vertical':
            return hw[0], self.stripe_width
        if self.direction == 'horizontal':
            return self.stripe_width, hw[1]
        return None

    def token_layout(self, nq, nk, q, k, v, context=None) -> TokenLayout:
        """Where the tokens of this branch's kernel call sit: stripes of the symmetrically padded grid (or the whole
        grid)."""
        h, w = q.shape[1:3]
        (sh, sw), (top, bottom, left, right) = stripe_geometry((h, w), self.stripe((h, w)), self.pad_keys == 'mask')
        hp, wp = h + top + bottom, w + left + right
        if self.direction is None or (sh, sw) == (h, w):
            kind, note = 'global', f'global over the {h}x{w} grid'
        else:
            kind, note = 'stripe', f'{self.direction} stripes of {sh}x{sw} on the {h}x{w} grid'
            note += f', padded symmetrically to {hp}x{wp}' if (hp, wp) != (h, w) else ''
        return TokenLayout.windows(kind, (h, w), (hp, wp), (sh, sw), note, origin=(top, left),
                                   extra=dict(stripe=(sh, sw), direction=self.direction,
                                              pad=(top, bottom, left, right)))

    def forward(self, q, k, v, context=None):
        """q, k, v: (B, H, W, c) -> (B, H, W, c); context (B, c): the kernel's context (when it takes one)."""
        b, h, w, c = q.shape
        (sh, sw), (top, bottom, left, right) = stripe_geometry((h, w), self.stripe((h, w)), self.pad_keys == 'mask')
        mask = None
        if top or bottom or left or right:
            q, k, v = (F.pad(t, (0, 0, left, right, top, bottom)) for t in (q, k, v))
            if self.pad_keys == 'mask':
                valid = torch.zeros(q.shape[1:3], dtype=torch.bool, device=q.device)
                valid[top:top + h, left:left + w] = True
                valid = _to_windows(valid[None, :, :, None], sh, sw)[..., 0]  # (nW, N)
                # a key mask (B * nW, 1, 1, N), batch-major like the windows: it only removes pad keys (every stripe
                # holds real tokens, the pad being less than a stripe), so a linear kernel keeps its factorised order
                mask = valid[:, None, None, :].repeat(b, 1, 1, 1)
        hp, wp = q.shape[1:3]
        n = sh * sw

        def heads(t):
            return _to_windows(t, sh, sw).view(-1, n, self.num_heads, self.head_dim).transpose(1, 2)

        if context is not None:  # one per image -> one per window (windows are batch-major)
            context = context.repeat_interleave((hp // sh) * (wp // sw), dim=0)
        out = self.attend(heads(q), heads(k), heads(v), hw=(sh, sw), mask=mask, context=context)
        v_img = _to_windows(v, sh, sw).transpose(1, 2).reshape(-1, c, sh, sw)  # (B * nW, c, sh, sw)
        lepe = self.lepe(v_img).view(-1, self.num_heads, self.head_dim, n).transpose(2, 3)
        out = (out + lepe.to(out.dtype)).transpose(1, 2).reshape(-1, n, c)
        out = _from_windows(out, sh, sw, hp, wp)
        return out[:, top:top + h, left:left + w]


class CSWinBlock(AttentionBlock):
    def __init__(self, dim, num_heads, stripe_width, global_window, last_stage, attn_cfg, mlp_ratio, qkv_bias,
                 drop, drop_path, with_cp, pad_keys='mask'):
        super().__init__()
        self.with_cp = with_cp
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        if last_stage or global_window:  # one branch, all heads, the whole grid
            self.branches = nn.ModuleList([StripeBranch(dim, num_heads, attn_cfg, None, stripe_width, pad_keys)])
        else:
            if num_heads % 2 or dim % 2:
                raise ValueError(f'SoftFreeCSWin: a stripe stage splits heads in two halves; num_heads={num_heads} '
                                 f'and dims={dim} must be even')
            self.branches = nn.ModuleList([StripeBranch(dim // 2, num_heads // 2, attn_cfg, d, stripe_width,
                                                        pad_keys) for d in ('vertical', 'horizontal')])
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def _forward(self, x):
        b, h, w, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, h, w, 3, c).unbind(3)
        parts = len(self.branches)
        size = c // parts
        # the official InLine context: the block input before its norm, averaged over the image
        mean = x.mean((1, 2)) if any(br.kernel.takes_context for br in self.branches) else None
        y = torch.cat([br(q[..., i * size:(i + 1) * size], k[..., i * size:(i + 1) * size],
                          v[..., i * size:(i + 1) * size],
                          mean[:, i * size:(i + 1) * size] if br.kernel.takes_context else None)
                       for i, br in enumerate(self.branches)], dim=-1)
        x = x + self.drop_path(self.proj_drop(self.proj(y)))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x):
        return checkpointed(self, self._forward, x)


class MergeBlock(nn.Module):
    """3x3 stride-2 conv (padding 1) + LayerNorm on (B, H, W, C) tokens."""

    def __init__(self, dim, out_dim):
        super().__init__()
        self.conv = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = nn.LayerNorm(out_dim)

    def forward(self, x):
        return self.norm(self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class CSWinStage(nn.Module):
    def __init__(self, in_dim, dim, downsample, blocks):
        super().__init__()
        self.downsample = MergeBlock(in_dim, dim) if downsample else None
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        if self.downsample is not None:
            x = self.downsample(x)
        for blk in self.blocks:
            x = blk(x)
        return x


@register_family
class SoftFreeCSWin(StagedBackbone):
    """CSWin Transformer backbone with swappable attention kernels.

    Args:
        arch: 'tiny' | 'small' | 'base' | 'large' | 'inline_tiny' | 'inline_small' | 'inline_base' | 'agent_tiny' |
            'agent_small' (the Agent-CSWin releases), or a dict
            with embed_dims, depths, num_heads, stripe_widths (and attn_cfg, global_window).
        embed_dims, depths, num_heads, stripe_widths: override the preset.
        attn_cfg: one kernel config for every stage, or one per stage (e.g. InLine's 'IISS':
            ``['inline', 'inline', 'softmax', 'softmax']``). Default: the preset's, else 'softmax'.
        global_window: bool or one per stage; True = one branch with all heads attends over the whole stage grid
            (no stripes). The last stage is always global. Default: the preset's, else False.
        pad_keys: 'mask' (default: padded stripe keys are removed by a key mask, padding changes nothing; a stripe
            wider than the grid is cut to it) or 'zeros' (the official segmentation code: zero pad tokens take part
            as keys, and a grid narrower than a stripe is padded up to it).
        patch_grid: 'ceil' (default, ours: the image is zero padded to a multiple of 4 before the 7x7 stride-4 stem)
            or 'floor' (the official code: the stem's own grid, floor((H - 3) / 4) + 1, a row less where H % 4 is 1
            or 2). They agree at 224 and on sides that are multiples of 4.
        out_indices, frozen_stages, drop_path_rate, with_cp, init_cfg, pretrained: as :class:`SoftFreeSwin`.
    """

    arch_zoo = ARCH_ZOO
    arch_keys = ('embed_dims', 'depths', 'num_heads', 'stripe_widths')
    arch_options = ('attn_cfg', 'global_window')
    _convert = staticmethod(convert_cswin)
    family = Family(
        tiny=dict(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4), stripe_widths=(1, 2, 4, 7))),
        fit=('global stripes', dict(global_window=True)), arch_spec=CSWinArchSpec(),
        checkpoints={'cswin': dict(arch='tiny', embed_dims=8, num_heads=(2, 2, 2, 2)),
                     'inline_cswin': dict(arch='inline_tiny', embed_dims=8, num_heads=(2, 2, 2, 2)),
                     'agent_cswin': dict(arch='agent_tiny', embed_dims=8, num_heads=(2, 2, 2, 2))},
        benchmark={'cswin_t': dict(arch='tiny')},
        layout=lambda cfg: 'global tokens' if global_first_stages(cfg.get('global_window')) else 'stripes',
        # the official UperNet releases keep pad keys and pad no image before the stem
        downstream_padding={'cswin': dict(pad_keys='zeros', patch_grid='floor')})

    def __init__(self, arch: Union[str, dict] = 'tiny', embed_dims: Optional[int] = None,
                 depths: Optional[Sequence[int]] = None, num_heads: Optional[Sequence[int]] = None,
                 stripe_widths: Optional[Sequence[int]] = None, attn_cfg: Union[str, dict, Sequence, None] = None,
                 global_window: Union[bool, Sequence[bool], None] = None, pad_keys: str = 'mask',
                 patch_grid: str = 'ceil',
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, in_channels: int = 3, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 with_cp: bool = False, init_cfg: Optional[Union[dict, List[dict]]] = None,
                 pretrained: Optional[str] = None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained, with_cp=with_cp)
        owner = 'SoftFreeCSWin'
        preset = self.resolve_arch(arch)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        depths = tuple(preset['depths'] if depths is None else depths)
        num_heads = tuple(preset['num_heads'] if num_heads is None else num_heads)
        stripe_widths = tuple(preset['stripe_widths'] if stripe_widths is None else stripe_widths)
        num_stages = len(depths)
        if len(num_heads) != num_stages or len(stripe_widths) != num_stages:
            raise ValueError(f'{owner}: depths {depths}, num_heads {num_heads} and stripe_widths {stripe_widths} '
                             'must have one entry per stage')
        if pad_keys not in PAD_KEYS:
            raise ValueError(f"{owner}: pad_keys must be one of {', '.join(map(repr, PAD_KEYS))}, got {pad_keys!r}")
        if patch_grid not in ('ceil', 'floor'):
            raise ValueError(f"{owner}: patch_grid must be 'ceil' (the image padded to a multiple of 4 first, ours) or "
                             f"'floor' (the stem conv's own grid, the official code), got {patch_grid!r}")
        if any(not isinstance(s, int) or s < 1 for s in stripe_widths):
            raise ValueError(f'{owner}: stripe_widths must be positive ints, got {stripe_widths}')
        dims = self._stages_from(arch, depths, num_heads, embed_dims, out_indices, frozen_stages)
        self.stripe_widths = stripe_widths
        attn_cfg = preset.get('attn_cfg', 'softmax') if attn_cfg is None else attn_cfg
        global_window = preset.get('global_window', False) if global_window is None else global_window
        cfgs = expand_attn_cfg(attn_cfg, num_stages, 'stage', owner)
        global_window = per_stage(global_window, num_stages, 'global_window', bool, owner)
        self.pad_keys = pad_keys
        self.attn_cfgs = cfgs
        self.global_window = tuple(global_window)

        # 'ceil': the image zero padded to a multiple of 4 first, ceil(H/4) x ceil(W/4); 'floor': the 7x7 stride-4
        # conv's own grid, floor((H - 3) / 4) + 1 (one row less where H % 4 is 1 or 2), as the official code
        self.patch_grid = patch_grid
        self.patch_embed = PatchEmbed(in_channels, embed_dims, 7, 4, padding=2,
                                      pad_to=4 if patch_grid == 'ceil' else 1)
        self.drop_after_pos = nn.Dropout(drop_rate)
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.stages = nn.ModuleList()
        for i in range(num_stages):
            last = i == num_stages - 1
            is_global = last or global_window[i]
            where = (f'stage {i} (attention over the whole stage, whose token count follows the input size)'
                     if is_global else
                     f'stage {i} (stripes of width {stripe_widths[i]}, symmetric padding, padded keys masked; set '
                     f'global_window=True for this stage to use it without masks)')
            require_kernel_fit(cfgs[i], owner, where,
                               needs_mask=not is_global and stripe_widths[i] > 1 and pad_keys == 'mask',
                               varying_length=True)
            start = sum(depths[:i])
            blocks = [CSWinBlock(dims[i], num_heads[i], stripe_widths[i], global_window[i], last, cfgs[i],
                                 mlp_ratio, qkv_bias, drop_rate, dpr[start + j], with_cp, pad_keys)
                      for j in range(depths[i])]
            self.stages.append(CSWinStage(dims[i - 1] if i else dims[0], dims[i], i > 0, blocks))
        self._add_out_norms(dims)
        self._init_default()
        self._freeze_stages()
