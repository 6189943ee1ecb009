"""XCiT (Cross-Covariance Image Transformer) with a swappable kernel inside cross-covariance attention.

XCA's "tokens" are the d_h channels of a head and its "head_dim" the token count, so kernels are built with
``head_dim=None``; the learned temperature is folded into the L2-normalised q (``scale=1``). ``out_type='featmap'``
gives four maps through the official stride adapter, ``'cls_token'`` the class token after two softmax
class-attention layers. Names follow timm's ``Xcit``; ``convert_xcit`` maps the official release."""
import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from timm.layers import DropPath
from torch import nn

from ...attention.base import ceil_div
from ...attention.fit import probe, refusal, require_kernel_fit
from ..attention import KernelAttention
from ..utils.cfg import expand_attn_cfg
from ..utils.mlp import Mlp, gelu_inference
from ..utils.token_layout import TokenLayout
from ..utils.tokens import grid_view, token_view
from ..utils.deconv import BlockDeconv
from .base import AttentionBlock, Family, SoftFreeBackbone, checkpointed, register_family
from .xcit_convert import XCiTArchSpec, convert_xcit

__all__ = ['SoftFreeXCiT']

OWNER = 'SoftFreeXCiT'
_BN = dict(type='BN')


class FourierPositions(nn.Module):
    """Sine/cosine features of the normalised (y, x) grid position, recomputed for every grid, then a 1x1 conv."""

    def __init__(self, dim: int, hidden_dim: int = 32, temperature: float = 10000.):
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
        self.hidden_dim = hidden_dim
        self.temperature = temperature

    def forward(self, batch: int, h: int, w: int) -> torch.Tensor:
        weight = self.token_projection.weight
        # positions and frequencies in float32 (large exponents, sin/cos of large arguments)
        ys = torch.arange(1, h + 1, device=weight.device, dtype=torch.float32)
        xs = torch.arange(1, w + 1, device=weight.device, dtype=torch.float32)
        ys = ys / (h + 1e-6) * (2 * math.pi)
        xs = xs / (w + 1e-6) * (2 * math.pi)
        i = torch.arange(self.hidden_dim, device=weight.device, dtype=torch.float32)
        freq = self.temperature ** (2 * torch.div(i, 2, rounding_mode='floor') / self.hidden_dim)

        def encode(pos):  # (L,) -> (L, hidden): sin on even slots, cos on odd slots, interleaved
            a = pos[:, None] / freq
            return torch.stack([a[:, 0::2].sin(), a[:, 1::2].cos()], dim=-1).flatten(1)

        fy = encode(ys)[:, None, :].expand(h, w, self.hidden_dim)
        fx = encode(xs)[None, :, :].expand(h, w, self.hidden_dim)
        pos = torch.cat([fy, fx], dim=-1).permute(2, 0, 1)[None]  # (1, 2*hidden, H, W)
        pos = self.token_projection(pos.to(weight.dtype))
        return pos.expand(batch, -1, -1, -1)


def _conv_bn(cin, cout, norm_cfg):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
                         build_norm_layer(norm_cfg, cout)[1])


class ConvPatchEmbed(nn.Module):
    """log2(p) stride-2 3x3 conv + norm layers with GELU between them (channels D/8, D/4, D/2, D for p16)."""

    def __init__(self, patch_size: int, in_channels: int, dim: int, norm_cfg: dict):
        super().__init__()
        steps = {16: 4, 8: 3}[patch_size]
        chans = [in_channels] + [dim // 2 ** (steps - 1 - i) for i in range(steps)]
        layers = []
        for i in range(steps):
            if i:
                layers.append(nn.GELU())
            layers.append(_conv_bn(chans[i], chans[i + 1], norm_cfg))
        self.proj = nn.Sequential(*layers)

    def forward(self, x):
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class LPI(nn.Module):
    """Local patch interaction: depthwise 3x3 -> GELU -> norm -> depthwise 3x3 on the token grid."""

    def __init__(self, dim: int, norm_cfg: dict):
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = nn.GELU()
        self.bn = build_norm_layer(norm_cfg, dim)[1]
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x, hw):
        x = self.conv2(self.bn(gelu_inference(self.conv1(grid_view(x, hw)), self.act)))
        return token_view(x)


class XCA(KernelAttention):
    """Cross-covariance attention: the channel layout, whose kernel attends over the d_h x d_h channel matrix of a
    head (its "tokens" are the channels, its "head_dim" the token count)."""

    def __init__(self, dim: int, num_heads: int, attn_cfg: dict, qkv_bias: bool = True, where: str = ''):
        super().__init__(dim, num_heads, attn_cfg, owner=OWNER, where=where, inputs='qkv', qkv_bias=qkv_bias,
                         build_kernel=False, scale=1.0)
        self.head_channels = self.head_dim
        # per-head temperature; excluded from weight decay by name (paramwise_cfg custom_keys={'temperature': ...})
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self._add_xca_kernel(attn_cfg, where)

    def _add_xca_kernel(self, cfg: dict, where: str):
        """The kernel built with head_dim=None (its "head_dim" is the token count, which follows the input size),
        refused when it needs a grid, and run once on the XCA geometry so that e.g. a length-limited kernel fails
        here, not mid-training."""
        place = f'{where} (cross-covariance attention)'
        try:
            kern = self.add_kernel(cfg, head_dim=None)
        except (ValueError, TypeError, KeyError) as e:
            why = ('XCA builds kernels with head_dim=None because its "head_dim" is the token count, which varies '
                   f'with the input size; building failed with: {e}')
            raise ValueError(f"{OWNER}: {refusal(cfg['type'], why, place)}") from None
        require_kernel_fit(cfg, OWNER, place, kernel=kern,
                           no_grid=f'XCA attends over the {self.head_channels} channels of a head, which have no grid')
        # whether it runs on this geometry; values that blow up are the training's to report (the non-finite guard)
        why = probe(kern, self.num_heads, 4, self.head_channels, self.head_channels, scale=1.0, finite=False)
        if why:
            raise ValueError(f"{OWNER}: {refusal(cfg['type'], why, place)} (the {self.head_channels} channels of an "
                             'XCA head as tokens)')

    def forward(self, x):
        b, n, c = x.shape
        # (B, N, 3C) -> (3, B, h, d_h, N): the kernel's "tokens" are the d_h channels of a head
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_channels).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)
        # the temperature is folded into q (scale=1): for every kernel whose score is scale * q.k this equals
        # scale=temperature, and kernels without a score scale (linear, efficient) still feel the temperature
        # (one product q * (temperature / |q|) instead of normalize(q) * temperature: autograd then keeps one
        # (B, h, d_h, N) tensor for q instead of two)
        q = q * (self.temperature / q.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        k = F.normalize(k, dim=-1)
        out = self.attend(q, k, v)
        return self.proj(out.permute(0, 3, 1, 2).reshape(b, n, c))


class XCABlock(AttentionBlock):
    def __init__(self, dim, num_heads, attn_cfg, mlp_ratio, qkv_bias, drop_path, eta, norm_cfg, where):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = XCA(dim, num_heads, attn_cfg, qkv_bias, where)
        self.norm3 = nn.LayerNorm(dim, eps=1e-6)
        self.local_mp = LPI(dim, norm_cfg)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma3 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))

    def _residual(self, x, gamma, y):
        """x + drop_path(gamma * y); without drop path one fused pass (addcmul), no gamma * y temporary."""
        if isinstance(self.drop_path, nn.Identity) or not self.training:
            return torch.addcmul(x, gamma, y)
        return x + self.drop_path(gamma * y)

    def token_layout(self, nq, nk, x, hw) -> TokenLayout:
        """Attention over the d_h channels of each head: its tokens are channels, the values token maps."""
        h, w = (int(s) for s in hw)
        return TokenLayout.channels((h, w), f'cross-covariance attention over {nq} channels per head; the values '
                                            f'are {h}x{w} token maps')

    def forward(self, x, hw: Tuple[int, int]):
        x = self._residual(x, self.gamma1, self.attn(self.norm1(x)))
        x = self._residual(x, self.gamma3, self.local_mp(self.norm3(x), hw))
        return self._residual(x, self.gamma2, self.mlp(self.norm2(x)))


class ClassAttention(nn.Module):
    """Softmax attention of the class token over all tokens (CaiT's class attention, kept softmax as official)."""

    def __init__(self, dim, num_heads, qkv_bias):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(x[:, :1]).reshape(b, 1, h, c // h).transpose(1, 2)
        k = self.k(x).reshape(b, n, h, c // h).transpose(1, 2)
        v = self.v(x).reshape(b, n, h, c // h).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, 1, c))


class ClassAttentionBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio, qkv_bias, eta, tokens_norm):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClassAttention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))
        self.tokens_norm = tokens_norm

    def forward(self, x):
        xn = self.norm1(x)
        x = x + self.gamma1 * torch.cat([self.attn(xn), xn[:, 1:]], dim=1)
        if self.tokens_norm:
            x = self.norm2(x)
        else:
            x = torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        cls = self.gamma2 * self.mlp(x[:, :1])
        return x + torch.cat([cls, torch.zeros_like(x[:, 1:])], dim=1)


@register_family
class SoftFreeXCiT(SoftFreeBackbone):
    """XCiT backbone whose XCA layers use any attention kernel of ``softfree_mm.attention`` that fits XCA.

    Args:
        arch: 't12' | 's12' | 's24' | 'm24' (embed dims / depth / heads / LayerScale eta), or a dict with
            embed_dims, depth, num_heads, eta; explicit arguments below override the preset.
        patch_size: 16 or 8.
        attn_cfg: one kernel config for every XCA layer, or a list with one per layer.
        out_type: 'featmap' (four NCHW maps at strides 4/8/16/32) or 'cls_token' (class token, for classifiers).
        out_indices: the four blocks feeding strides 4, 8, 16, 32 (featmap mode; negative ones count from the
            end); default per depth.
        frozen_stages: -1 none; 0 the patch embedding and positions; k >= 1 also blocks 0..k-1.
        norm_cfg: norm of the conv stem, LPI and adapter (default SyncBN, as the official detection code).
        with_cp: activation checkpointing per block (in training).
        init_cfg: ``dict(type='Pretrained', checkpoint=...)`` loads official / timm XCiT files through
            :func:`convert_xcit`; ``pretrained=PATH`` is its deprecated alias (as mmdet's and mmseg's backbones).
        norm_eval: keep the BatchNorms (stem, LPI, adapter) in eval mode (frozen statistics) while training.
    """

    arch_zoo = {
        't12': dict(embed_dims=192, depth=12, num_heads=4, eta=1.0),
        's12': dict(embed_dims=384, depth=12, num_heads=8, eta=1.0),
        's24': dict(embed_dims=384, depth=24, num_heads=8, eta=1e-5),
        'm24': dict(embed_dims=512, depth=24, num_heads=8, eta=1e-5),
    }
    arch_keys = ('embed_dims', 'depth', 'num_heads', 'eta')
    default_out_indices = {12: (3, 5, 7, 11), 24: (7, 11, 15, 23)}
    OUT_TYPES = ('featmap', 'cls_token')
    trunc_normal_params = ('cls_token',)
    stem = ('patch_embed', 'pos_embed', 'cls_token')
    _convert = staticmethod(convert_xcit)
    family = Family(
        tiny=dict(arch='t12', embed_dims=32, num_heads=4, depth=4, out_indices=(0, 1, 2, 3), norm_cfg=_BN),
        checkpoints={'xcit': dict(arch='t12', embed_dims=8, num_heads=1, norm_cfg=_BN)}, arch_spec=XCiTArchSpec(),
        benchmark={'xcit_s12': dict(arch='s12', patch_size=16, norm_cfg=_BN),
                   'xcit_t12': dict(arch='t12', patch_size=16, norm_cfg=_BN)},
        mixes='channels', layout='channels')

    def __init__(self, arch: Union[str, dict] = 's12', patch_size: int = 16, in_channels: int = 3,
                 embed_dims: Optional[int] = None, depth: Optional[int] = None, num_heads: Optional[int] = None,
                 eta: Optional[float] = None, mlp_ratio: float = 4., qkv_bias: bool = True,
                 attn_cfg: Union[str, dict, Sequence] = 'softmax', out_type: str = 'featmap',
                 out_indices: Optional[Sequence[int]] = None, cls_attn_layers: int = 2, tokens_norm: bool = True,
                 drop_path_rate: float = 0., norm_cfg: dict = dict(type='SyncBN', requires_grad=True),
                 frozen_stages: int = -1, with_cp: bool = False, norm_eval: bool = False,
                 init_cfg: Optional[dict] = None, pretrained: Optional[str] = None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained, with_cp=with_cp, norm_eval=norm_eval)
        self.arch = arch
        preset = self.resolve_arch(arch)
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        depth = preset['depth'] if depth is None else depth
        num_heads = preset['num_heads'] if num_heads is None else num_heads
        eta = preset['eta'] if eta is None else eta
        if patch_size not in (8, 16):
            raise ValueError(f'{OWNER}: patch_size must be 16 or 8, got {patch_size!r}')
        if out_type not in self.OUT_TYPES:
            raise ValueError(f'{OWNER}: unknown out_type {out_type!r}; valid: {", ".join(self.OUT_TYPES)}')
        if embed_dims % 8 or embed_dims % num_heads:
            raise ValueError(f'{OWNER}: embed_dims={embed_dims} must be divisible by 8 (conv stem) and by '
                             f'num_heads={num_heads}')
        if out_indices is None:
            if depth not in self.default_out_indices and out_type == 'featmap':
                raise ValueError(f'{OWNER}: no default out_indices for depth={depth} (defaults exist for '
                                 f'{sorted(self.default_out_indices)}); pass four block indices')
            out_indices = self.default_out_indices.get(depth, ())
        # the four blocks feeding strides 4, 8, 16, 32 (no maps in cls_token mode)
        self.out_indices = self.check_out_indices(out_indices, depth, 'block', count=4) if out_type == 'featmap' \
            else tuple(out_indices)
        self.frozen_stages = self.check_frozen_stages(frozen_stages, depth)
        self.patch_size = patch_size
        self.embed_dims = embed_dims
        self.depth = self.num_layers = depth
        self.num_heads = num_heads
        self.out_type = out_type
        attn_cfgs = expand_attn_cfg(attn_cfg, depth, 'layer', OWNER)
        self.attn_cfgs = attn_cfgs

        self.patch_embed = ConvPatchEmbed(patch_size, in_channels, embed_dims, norm_cfg)
        self.pos_embed = FourierPositions(embed_dims)
        # official XCiT uses a constant drop-path rate for every block
        dpr = [drop_path_rate] * depth
        self.blocks = nn.ModuleList([
            XCABlock(embed_dims, num_heads, attn_cfgs[i], mlp_ratio, qkv_bias, dpr[i], eta, norm_cfg,
                     where=f'layer {i}') for i in range(depth)])

        if out_type == 'cls_token':
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
            self.cls_attn_blocks = nn.ModuleList([
                ClassAttentionBlock(embed_dims, num_heads, mlp_ratio, qkv_bias, eta, tokens_norm)
                for _ in range(cls_attn_layers)])
            self.norm = nn.LayerNorm(embed_dims, eps=1e-6)
            self.out_channels = (embed_dims,)
        else:
            d = embed_dims
            if patch_size == 16:
                self.fpn1 = nn.Sequential(BlockDeconv(d, d, 2, stride=2), build_norm_layer(norm_cfg, d)[1],
                                          nn.GELU(), BlockDeconv(d, d, 2, stride=2))
                self.fpn2 = nn.Sequential(BlockDeconv(d, d, 2, stride=2))
                self.fpn3 = nn.Identity()
                self.fpn4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
            else:
                self.fpn1 = nn.Sequential(BlockDeconv(d, d, 2, stride=2))
                self.fpn2 = nn.Identity()
                self.fpn3 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
                self.fpn4 = nn.MaxPool2d(4, stride=4, ceil_mode=True)
            self.out_channels = (d,) * 4
        self.num_features = self.out_channels
        self._init_default()
        self._freeze_stages()

    def _frozen(self):
        if self.frozen_stages < 0:
            return []
        return [self.patch_embed, self.pos_embed, *self.blocks[:self.frozen_stages]]

    # ------------------------------------------------------------------ forward
    def forward(self, x):
        b, img_hw = x.shape[0], x.shape[-2:]
        x, hw = self.patch_embed(x)
        # tokens contiguous (the patch embedding's NCHW output seen as tokens is not): every LayerNorm would copy
        # its input, three per block, and the LPI's grid view would not be a view
        x = (x + self.pos_embed(b, hw[0], hw[1]).flatten(2).transpose(1, 2)).contiguous()
        feats = []
        for i, blk in enumerate(self.blocks):
            x = checkpointed(self, blk, x, hw)
            if self.out_type == 'featmap' and i in self.out_indices:
                # a channels-last view of the tokens (no copy): the adapter's first layers read it as it is, so
                # autograd keeps the tokens the next block keeps anyway; the outputs are made NCHW below
                feats.append(grid_view(x, hw))
            if self.out_type == 'featmap' and i == self.out_indices[-1]:
                break  # later blocks feed no output
        if self.out_type == 'cls_token':
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
            for blk in self.cls_attn_blocks:
                x = checkpointed(self, blk, x)
            return (self.norm(x)[:, 0],)
        ops = (self.fpn1, self.fpn2, self.fpn3, self.fpn4)
        # the upsampled maps of a partial last patch reach past the image: crop to ceil(H / stride) like the other
        # backbones (no-op when H and W are multiples of the patch size); every output is a contiguous NCHW map, as
        # mmcv's CPU RoIAlign reads it (a no-op for maps that already are)
        return tuple(op(f)[..., :ceil_div(img_hw[0], s), :ceil_div(img_hw[1], s)].contiguous()
                     for op, f, s in zip(ops, feats, (4, 8, 16, 32)))

    # ------------------------------------------------------------------ optimiser helpers
    def _layer_count(self):
        return self.depth

    def _layer_id(self, name):
        """As mmpretrain's VisionTransformer: stem 0, block i -> i + 1, the rest last."""
        if name.startswith('blocks.'):
            return int(name.split('.')[1]) + 1
        return super()._layer_id(name)

    @property
    def by_design_keys(self):
        """A classifier's checkpoint into the feature maps (or the other way): the parts one mode has alone."""
        adapter = r'^fpn[1-4]\.'
        if self.out_type == 'cls_token':
            return (('of the stride-fixing adapter, not used by the class token', adapter),)
        head = ('classification-only, not used by the feature maps (class attention, class token, final norm)',
                r'^(cls_attn_blocks\.|cls_token$|norm\.)')
        return head, ('of the stride-fixing adapter, new to the feature maps', adapter)

    def no_weight_decay_keys(self):
        """Parameter-name fragments to exclude from weight decay (mmengine paramwise_cfg custom_keys)."""
        return ('temperature', 'pos_embed', 'cls_token')
