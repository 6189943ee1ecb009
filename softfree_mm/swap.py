"""Swap the attention kernel inside models we did not write (timm, mmdet, mmpretrain, mmseg, mmcv).

>>> model = timm.create_model('deit3_small_patch16_224', pretrained=True)
>>> swap_attention(model, dict(type='poly', degree=3))          # every attention layer, weights kept

Each foreign attention layout is an *adapter*, one small function pair found by the module's exact type: a
``layout`` function reads, from the module as it stands and its owner model, what a kernel will be handed
(heads, head_dim, token grid, class/register tokens, relative position bias, window masks, spatial reduction,
cross-attention), and a ``forward`` with the module's own signature computes q, k, v, scale, bias and mask
exactly as the module does (qk-norms, temperature, gates, layer scale, dropouts, output projection) and mixes
them through the kernel. The module keeps its class (a subclass is swapped in), its submodules, its weights and
its state-dict keys; the kernel is a child ``kernel`` (a kernel with learned weights adds its own keys under
``<module>.kernel.``; softmax adds none).

Rules (each refusal is an error naming the module path and the reason; nothing is changed when any is refused):

* A kernel that cannot honour a mask is refused where the layout hands masks (shifted windows, padded memory
  of DETR-family layers). A kernel that takes no additive bias runs without the relative position bias; the
  table is kept (frozen, so that no unused parameter waits for a gradient) and the summary says so.
* A kernel that needs the token grid (``needs_hw``: InLine's local residual, SOFT's landmarks, flatten's conv)
  gets it where queries and keys share one grid (windows, ViT patches, PVT without spatial reduction) and is
  refused elsewhere (spatially reduced keys, XCA's channels, class attention, DETR queries / memory).
* Class and register tokens (ViT, DeiT, DeiT-3): a kernel that needs no grid mixes all tokens alike. A grid
  kernel gets the patch tokens alone, on their (H, W) grid (patch queries x patch keys); the prefix tokens'
  queries then attend over ALL tokens (prefix and patches) through ``prefix_attention`` (softmax by default,
  any kernel that needs no grid, as in CaiT's class attention); no patch query reads a prefix token.
  ``prefix_attention=None`` refuses grid kernels where there are prefix tokens.
* A kernel whose weights are tied to token positions (``fixed_length``, synthesizer) is refused where the
  number of tokens follows the input size. A kernel that ties keys to queries (SOFT, ``tie_qk=True``) is
  refused in cross-attention.
* Attention dropout is kept: in training, with p > 0, the weights ``A`` are built explicitly and dropped out
  as the module did (so such a training step costs N^2 even for linear kernels).
* Modules that look like attention (class name with Attention / Attn / MSA / XCA and a ``num_heads``) but have no
  adapter are errors ("unknown layout") unless ``layers`` leaves them out.
"""
import copy
import fnmatch
import functools
import logging
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionKernel, build_attention, list_attentions, normalize_cfg, kernel_class

__all__ = ['swap_attention', 'restore_attention', 'swap_summary', 'supported_layouts', 'SwapError']

PROBE_BATCH = 1


class SwapError(ValueError):
    """A kernel that cannot fit a layout, an unknown attention layout, or a bad ``layers`` / ``attn_cfg``.

    ``refusals``: ``(module path, code, reason)`` for each module that could not be swapped; code is one of
    'layout' (no adapter / a variant the adapter does not reproduce), 'build', 'ties_qk', 'grid', 'prefix', 'mask',
    'length', 'probe'."""

    def __init__(self, message, refusals=()):
        super().__init__(message)
        self.refusals = list(refusals)


# ============================================================================================ layouts
@dataclass
class Layout:
    """What a kernel is handed inside one foreign attention module (for the fit checks and the probe)."""
    num_heads: int
    head_dim: Optional[int]  # None: XCA (the kernel's "head_dim" is the token count)
    nq: int  # query count of a probe (the real one where it is fixed)
    nk: int  # key count of a probe
    grid: Optional[Tuple[int, int]] = None  # the patch/window grid shared by queries and keys, for the probe
    no_grid: str = ''  # why there is no grid (when grid is None)
    prefix: int = 0  # class/register tokens before the grid tokens
    masks: str = ''  # non-empty: the layout hands masks (why)
    bias: str = ''  # non-empty: the module adds this score bias
    varying: str = ''  # non-empty: the number of tokens follows the input size (why)
    cross: str = ''  # non-empty: the keys are not the queries (why)
    scale: float = 1.0  # probe scale
    where: str = ''  # a short description for the summary


@dataclass
class Adapter:
    label: str  # e.g. 'timm ViT Attention'
    types: Tuple[str, ...]  # 'module.Qualname' of the attention classes it handles
    layout: Callable  # (module, path, model) -> Layout; raises SwapError for variants it cannot handle
    forward: Callable  # replaces the module's forward (same signature)
    install: Optional[Callable] = None  # (module, path, model, layout) -> None: per-module context (grid, prefix)


ADAPTERS: Dict[str, Adapter] = {}


def _register(label: str, types: Sequence[str], layout, forward, install=None):
    ad = Adapter(label, tuple(types), layout, forward, install)
    for t in types:
        ADAPTERS[t] = ad
    return ad


def supported_layouts() -> Dict[str, List[str]]:
    """adapter label -> the module types it handles."""
    out: Dict[str, List[str]] = {}
    for t, ad in ADAPTERS.items():
        out.setdefault(ad.label, []).append(t)
    return out


def _type_key(cls) -> str:
    return f'{cls.__module__}.{cls.__qualname__}'


def _original_class(module: nn.Module):
    return getattr(type(module), '_sf_original_class', type(module))


def _adapter_of(module: nn.Module) -> Optional[Adapter]:
    return ADAPTERS.get(_type_key(_original_class(module)))


def _need(module, path, *names):
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise SwapError(f'unknown layout: it lacks {missing}, which the adapter for its type reads (a library '
                        'version this adapter was not written for?)')


def _owner(model: nn.Module, path: str, predicate) -> Optional[nn.Module]:
    """The nearest module on the way from ``model`` to ``path`` (excluding the target) that satisfies predicate."""
    parts = path.split('.') if path else []
    chain = [model]
    for i in range(1, len(parts)):
        chain.append(model.get_submodule('.'.join(parts[:i])))
    for m in reversed(chain):
        if predicate(m):
            return m
    return None


def _parent(model: nn.Module, path: str) -> Optional[nn.Module]:
    if not path:
        return None
    return model.get_submodule(path.rpartition('.')[0]) if '.' in path else model


# ============================================================================================ shared pieces
def _mix(kernel, q, k, v, hw, scale, bias, mask, drop_p: float, training: bool, context=None):
    """``kernel(q, k, v)``; in training with attention dropout p > 0, ``dropout(A) @ v`` with A built explicitly
    (plus the kernel's residual_output where A is not its whole output). ``context`` goes to kernels that take one."""
    context = context if kernel.takes_context else None
    if training and drop_p > 0:
        a = kernel.attention_matrix(q, k, hw=hw, scale=scale, bias=bias, mask=mask)
        a = F.dropout(a, drop_p, True)
        out = (a @ v.to(a.dtype)).to(v.dtype)
        if not kernel.matrix_is_complete:
            out = out + kernel.residual_output(q, k, v, hw=hw, scale=scale, bias=bias, mask=mask, context=context)
        return out
    return kernel(q, k, v, hw=hw, scale=scale, bias=bias, mask=mask, context=context)


def _context(kernel, x, heads, head_dim):
    """The per-sample summary a context-taking kernel gets (InLine's official residual): the mean over the kernel's
    tokens of the attention module's input, where its channels are the heads' channels."""
    if not kernel.takes_context or x.shape[-1] != heads * head_dim:
        return None
    return x.mean(1)


def _rows(t, start, stop):
    """Rows [start:stop) of a (.., Nq, Nk) mask/bias that may broadcast (size 1) along Nq."""
    if t is None or t.shape[-2] == 1:
        return t
    return t[..., start:stop, :]


def _cols(t, start):
    if t is None or t.shape[-1] == 1:
        return t
    return t[..., start:]


def _attend_tokens(self, q, k, v, hw, scale, bias, mask, drop_p, x):
    """Tokens = ``self._sf_prefix`` class/register tokens then the grid tokens (see the module docstring); ``x`` is
    the module's input (the context of kernels that take one: the mean over the grid tokens)."""
    kern, p = self.kernel, self._sf_prefix
    if not kern.needs_hw:
        return _mix(kern, q, k, v, None, scale, bias, mask, drop_p, self.training)
    n = q.shape[2]
    if hw is None or n - p != hw[0] * hw[1]:
        raise ValueError(f'{self._sf_path}: kernel {kern.name!r} needs the token grid; {n} tokens with {p} prefix '
                         f'token(s) do not match the grid {hw}')
    ctx = _context(kern, x[:, p:], q.shape[1], q.shape[3])
    if p == 0:
        return _mix(kern, q, k, v, hw, scale, bias, mask, drop_p, self.training, ctx)
    # prefix queries: over all tokens through the prefix kernel (class attention)
    out_prefix = _mix(self.prefix_kernel, q[:, :, :p], k, v, None, scale, _rows(bias, 0, p), _rows(mask, 0, p),
                      drop_p, self.training)
    # patch queries over patch keys on their grid
    out_grid = _mix(kern, q[:, :, p:], k[:, :, p:], v[:, :, p:], hw, scale, _cols(_rows(bias, p, n), p),
                    _cols(_rows(mask, p, n), p), drop_p, self.training, ctx)
    return torch.cat([out_prefix, out_grid], dim=2)


def _sdpa_mask(attn_mask, is_causal, nq, nk, device):
    """SDPA-style ``attn_mask`` (bool: True = may attend; float: added) / ``is_causal`` -> (keep mask, bias)."""
    if is_causal:
        keep = torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=0)
        return keep, None
    if attn_mask is None:
        return None, None
    if attn_mask.dtype == torch.bool:
        return attn_mask, None
    return None, attn_mask


def _window_keep(mask, b_, n):
    """Swin's (nW, N, N) additive window mask (0 = keep, -100 = apart) -> bool keep (B*nW, 1, N, N)."""
    if mask is None:
        return None
    keep = mask > -1.0 if mask.dtype != torch.bool else mask
    nw = keep.shape[0]
    return keep.view(1, nw, 1, n, n).expand(b_ // nw, nw, 1, n, n).reshape(b_, 1, n, n)


class _GridContext:
    """The token grid of the current forward, recorded by a hook on the owner's patch embedding (for models whose
    input size may vary)."""

    def __init__(self, static=None):
        self.hw = static

    def timm_pre_hook(self, module, args):
        x = args[0]
        self.hw = tuple(int(s) for s in module.dynamic_feat_size((x.shape[-2], x.shape[-1])))

    def mm_post_hook(self, module, args, output):
        self.hw = tuple(int(s) for s in output[1])


class _FixedGrid:
    """The grid of a timm patch embedding of fixed image size (read at each call: set_input_size may change it).
    A plain holder, so that the patch embedding is not registered as a child of the attention module."""

    def __init__(self, patch_embed):
        self.patch_embed = patch_embed

    @property
    def hw(self):
        return tuple(int(s) for s in self.patch_embed.grid_size)


def _grid_now(self):
    src = self._sf_grid
    return None if src is None else src.hw


# ============================================================================================ timm: ViT / DeiT
def _timm_vit_owner(m):
    return hasattr(m, 'num_prefix_tokens') and hasattr(m, 'patch_embed') and hasattr(m.patch_embed, 'grid_size')


def _timm_vit_layout(m, path, model):
    _need(m, path, 'qkv', 'q_norm', 'k_norm', 'attn_drop', 'proj', 'proj_drop', 'num_heads', 'head_dim', 'scale')
    owner = _owner(model, path, _timm_vit_owner)
    lay = Layout(num_heads=m.num_heads, head_dim=m.head_dim, nq=16, nk=16, scale=m.scale)
    if owner is None:
        lay.no_grid = 'no owner model with a patch embedding was found above it, so its token grid is unknown'
        lay.varying = 'the number of tokens is not known to be fixed'
        lay.where = 'tokens (no grid known)'
        return lay
    pe = owner.patch_embed
    dynamic = bool(getattr(owner, 'dynamic_img_size', False)) or not getattr(pe, 'strict_img_size', True)
    p = int(owner.num_prefix_tokens)
    grid = tuple(int(s) for s in pe.grid_size)
    lay.prefix, lay.grid = p, grid
    lay.nq = lay.nk = p + grid[0] * grid[1]
    if dynamic:
        lay.varying = f'{type(owner).__name__} takes any image size (dynamic_img_size), so the token count varies'
    drop = getattr(owner, 'patch_drop', None)
    if drop is not None and getattr(drop, 'prob', 0) > 0:
        lay.grid = None
        lay.no_grid = (f'patch dropout (patch_drop_rate={drop.prob}) removes random patch tokens in training, so '
                       'the tokens do not form a grid')
    lay.where = f'{p} prefix + {grid[0]}x{grid[1]} patch tokens' + (' (grid per input)' if dynamic else '')
    return lay


def _timm_vit_install(m, path, model, lay):
    owner = _owner(model, path, _timm_vit_owner)
    m._sf_prefix = lay.prefix
    m._sf_grid = None
    if owner is None or lay.grid is None or not m.kernel.needs_hw:
        return
    pe = owner.patch_embed
    if getattr(owner, 'dynamic_img_size', False) or not getattr(pe, 'strict_img_size', True):
        m._sf_grid = _hook_context(pe, 'timm')
    else:
        m._sf_grid = _FixedGrid(pe)


def _hook_context(pe, kind):
    ctx = getattr(pe, '_sf_grid_context', None)
    if ctx is None:
        ctx = _GridContext()
        if kind == 'timm':
            pe.register_forward_pre_hook(ctx.timm_pre_hook)
        else:
            pe.register_forward_hook(ctx.mm_post_hook)
        pe._sf_grid_context = ctx
    return ctx


def _timm_vit_forward(self, x, attn_mask=None, is_causal=False):
    b, n, _ = x.shape
    gate = self.gate(x).sigmoid() if getattr(self, 'gate', None) is not None else None
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    keep, bias = _sdpa_mask(attn_mask, is_causal, n, n, x.device)
    out = _attend_tokens(self, q, k, v, _grid_now(self), self.scale, bias, keep, self.attn_drop.p, x)
    x = out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
    x = self.norm(x) if hasattr(self, 'norm') else x
    if gate is not None:
        x = x * gate
    return self.proj_drop(self.proj(x))


_register('timm ViT attention', ['timm.layers.attention.Attention', 'timm.models.vision_transformer.Attention'],
          _timm_vit_layout, _timm_vit_forward, _timm_vit_install)


# ============================================================================================ Swin windows
def _window_layout(m, path, bias_reader: str, shift) -> Layout:
    """Windows of ``m.window_size`` with a relative position bias; ``shift``: the block's shift (falsy: none)."""
    _need(m, path, 'qkv', 'proj', 'proj_drop', 'attn_drop', 'num_heads', 'scale', 'window_size',
          'relative_position_bias_table', bias_reader)
    wh, ww = m.window_size
    lay = Layout(num_heads=m.num_heads, head_dim=m.qkv.out_features // (3 * m.num_heads), nq=wh * ww, nk=wh * ww,
                 grid=(wh, ww), scale=m.scale, bias='relative position bias')
    if shift:
        lay.masks = f'the block shifts its windows (shift_size={shift}) and keeps the regions apart with a mask'
    lay.where = f'{wh}x{ww} windows' + (', shifted (mask)' if lay.masks else '')
    return lay


def _window_forward(self, x, mask, rel_pos_bias):
    """(B * nW, N, C) window tokens, Swin's additive (nW, N, N) shift mask -> the kernel, as timm's and mm's W-MSA."""
    b_, n, _ = x.shape
    q, k, v = self.qkv(x).reshape(b_, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    bias = rel_pos_bias(self, n) if self.kernel.supports_bias else None
    keep = _window_keep(mask, b_, n)
    hw = tuple(self.window_size) if self.kernel.needs_hw else None
    ctx = _context(self.kernel, x, q.shape[1], q.shape[3])
    out = _mix(self.kernel, q, k, v, hw, self.scale, bias, keep, self.attn_drop.p, self.training, ctx)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b_, n, -1)))


def _timm_swin_layout(m, path, model):
    block = _parent(model, path)
    shift = tuple(getattr(block, 'shift_size', (0, 0)) or (0, 0))
    dynamic = getattr(block, 'dynamic_mask', False)
    return _window_layout(m, path, '_get_rel_pos_bias', shift if any(shift) or dynamic else None)


def _timm_swin_forward(self, x, mask=None):
    return _window_forward(self, x, mask, lambda m, n: m._get_rel_pos_bias())


_register('timm Swin window attention', ['timm.models.swin_transformer.WindowAttention'], _timm_swin_layout,
          _timm_swin_forward)


def _mm_window_layout(m, path, model):
    return _window_layout(m, path, 'relative_position_index', getattr(_parent(model, path), 'shift_size', 0))


def _mm_rel_pos_bias(self, n):
    table = self.relative_position_bias_table[self.relative_position_index.view(-1)]
    return table.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)


def _mm_window_forward(self, x, mask=None):
    return _window_forward(self, x, mask, _mm_rel_pos_bias)


_register('OpenMMLab Swin window attention (W-MSA)',
          ['mmdet.models.backbones.swin.WindowMSA', 'mmpretrain.models.utils.attention.WindowMSA',
           'mmseg.models.backbones.swin.WindowMSA'], _mm_window_layout, _mm_window_forward)


# ============================================================================================ PVT spatial reduction
def _sra_layout(heads, head_dim, scale, sr_ratio, pooled) -> Layout:
    """Global attention over an image's tokens, keys spatially reduced by ``sr_ratio`` or pooled to 7x7."""
    lay = Layout(num_heads=heads, head_dim=head_dim, nq=24, nk=24, grid=(4, 6), scale=scale,
                 varying='global attention: the token count follows the image size',
                 where='global, no spatial reduction')
    if pooled:
        lay.grid, lay.nk = None, 49
        lay.no_grid = 'linear SRA pools the keys to a 7x7 grid, so queries and keys do not share one grid'
        lay.where = 'linear SRA (7x7 pooled keys)'
    elif sr_ratio > 1:
        lay.grid, lay.nk = None, 6
        lay.no_grid = (f'spatial reduction (sr_ratio={sr_ratio}) gives keys on a coarser grid than the queries; a '
                       'grid kernel fits the stages without it (sr_ratio=1)')
        lay.where = f'spatial reduction sr_ratio={sr_ratio}'
    return lay


def _timm_pvt_layout(m, path, model):
    _need(m, path, 'q', 'kv', 'proj', 'proj_drop', 'attn_drop', 'num_heads', 'head_dim', 'scale', 'sr', 'pool')
    return _sra_layout(m.num_heads, m.head_dim, m.scale, m.sr.stride[0] if m.sr is not None else 1, m.pool is not None)


def _timm_pvt_forward(self, x, feat_size):
    b, n, c = x.shape
    h, w = feat_size
    q = self.q(x).reshape(b, n, self.num_heads, -1).permute(0, 2, 1, 3)
    ctx = _context(self.kernel, x, self.num_heads, self.head_dim)
    if self.pool is not None:
        x = x.permute(0, 2, 1).reshape(b, c, h, w)
        x = self.act(self.norm(self.sr(self.pool(x)).reshape(b, c, -1).permute(0, 2, 1)))
    elif self.sr is not None:
        x = x.permute(0, 2, 1).reshape(b, c, h, w)
        x = self.norm(self.sr(x).reshape(b, c, -1).permute(0, 2, 1))
    k, v = self.kv(x).reshape(b, -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    hw = (int(h), int(w)) if self.kernel.needs_hw else None
    out = _mix(self.kernel, q, k, v, hw, self.scale, None, None, self.attn_drop.p, self.training, ctx)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


_register('timm PVTv2 spatial-reduction attention', ['timm.models.pvt_v2.Attention'], _timm_pvt_layout,
          _timm_pvt_forward)


# ============================================================================================ timm: XCiT, CaiT
def _timm_xca_layout(m, path, model):
    _need(m, path, 'qkv', 'temperature', 'attn_drop', 'proj', 'proj_drop', 'num_heads')
    d = m.qkv.in_features // m.num_heads
    return Layout(num_heads=m.num_heads, head_dim=None, nq=d, nk=d, scale=1.0,
                  no_grid=f'XCA attends over the {d} channels of a head (its "head_dim" is the token count), '
                          'which have no spatial grid',
                  where=f'cross-covariance over {d} channels per head')


def _timm_xca_forward(self, x):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 4, 1).unbind(0)
    # as timm: q and k L2-normalised over the tokens; the temperature is folded into q (scale 1), which for a
    # kernel scoring ``scale * q.k`` is exactly the temperature as the score scale
    q = F.normalize(q, dim=-1) * self.temperature
    k = F.normalize(k, dim=-1)
    out = _mix(self.kernel, q, k, v, None, 1.0, None, None, self.attn_drop.p, self.training)
    return self.proj_drop(self.proj(out.permute(0, 3, 1, 2).reshape(b, n, c)))


_register('timm XCiT cross-covariance attention (XCA)', ['timm.models.xcit.XCA'], _timm_xca_layout,
          _timm_xca_forward)


def _timm_class_attn_layout(m, path, model):
    _need(m, path, 'q', 'k', 'v', 'proj', 'proj_drop', 'attn_drop', 'num_heads', 'scale')
    d = m.q.out_features // m.num_heads
    return Layout(num_heads=m.num_heads, head_dim=d, nq=1, nk=17, scale=m.scale,
                  no_grid='class attention: the only query is the class token',
                  cross='class attention: the only query is the class token, the keys are all tokens',
                  varying='the number of keys follows the image size', where='class token over all tokens')


def _timm_class_attn_forward(self, x):
    b, n, c = x.shape
    h = self.num_heads
    q = self.q(x[:, 0]).unsqueeze(1).reshape(b, 1, h, c // h).permute(0, 2, 1, 3)
    k = self.k(x).reshape(b, n, h, c // h).permute(0, 2, 1, 3)
    v = self.v(x).reshape(b, n, h, c // h).permute(0, 2, 1, 3)
    out = _mix(self.kernel, q, k, v, None, self.scale, None, None, self.attn_drop.p, self.training)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, 1, c)))


_register('timm class attention (XCiT, CaiT)', ['timm.models.cait.ClassAttn'], _timm_class_attn_layout,
          _timm_class_attn_forward)


# ============================================================================================ mmpretrain: ViT
def _mmpretrain_vit_owner(m):
    return hasattr(m, 'num_extra_tokens') and hasattr(m, 'patch_embed') and hasattr(m, 'patch_resolution')


def _mmpretrain_scale(m):
    f = m.scaled_dot_product_attention
    if isinstance(f, functools.partial) and f.keywords.get('scale'):
        # mmpretrain's python SDPA (used when qk_scale is given) DIVIDES the scores by its ``scale`` argument
        return 1.0 / float(f.keywords['scale'])
    return m.head_dims ** -0.5


def _mmpretrain_mha_layout(m, path, model):
    _need(m, path, 'qkv', 'proj', 'proj_drop', 'out_drop', 'gamma1', 'attn_drop', 'num_heads', 'head_dims',
          'embed_dims', 'v_shortcut', 'scaled_dot_product_attention')
    lay = Layout(num_heads=m.num_heads, head_dim=m.head_dims, nq=16, nk=16, scale=_mmpretrain_scale(m))
    owner = _owner(model, path, _mmpretrain_vit_owner)
    if owner is None:
        lay.no_grid = 'no owner model with a patch embedding was found above it, so its token grid is unknown'
        lay.varying = 'the number of tokens is not known to be fixed'
        lay.where = 'tokens (no grid known)'
        return lay
    p = int(owner.num_extra_tokens)
    grid = tuple(int(s) for s in owner.patch_resolution)
    lay.prefix, lay.grid = p, grid
    lay.nq = lay.nk = p + grid[0] * grid[1]
    lay.varying = f'{type(owner).__name__} takes any image size, so the token count varies'
    lay.where = f'{p} prefix + patch tokens on their grid ({grid[0]}x{grid[1]} at the configured size)'
    return lay


def _mmpretrain_mha_install(m, path, model, lay):
    owner = _owner(model, path, _mmpretrain_vit_owner)
    m._sf_prefix = lay.prefix
    m._sf_grid = _hook_context(owner.patch_embed, 'mm') if owner is not None and m.kernel.needs_hw else None


def _mmpretrain_mha_forward(self, x):
    b, n, _ = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4).unbind(0)
    out = _attend_tokens(self, q, k, v, _grid_now(self), self._sf_scale, None, None, float(self.attn_drop), x)
    x = self.proj(out.transpose(1, 2).reshape(b, n, self.embed_dims))
    x = self.out_drop(self.gamma1(self.proj_drop(x)))
    if self.v_shortcut:
        x = v.squeeze(1) + x
    return x


def _mmpretrain_mha_install_all(m, path, model, lay):
    _mmpretrain_mha_install(m, path, model, lay)
    m._sf_scale = lay.scale


_register('mmpretrain MultiheadAttention (ViT)', ['mmpretrain.models.utils.attention.MultiheadAttention'],
          _mmpretrain_mha_layout, _mmpretrain_mha_forward, _mmpretrain_mha_install_all)


# ============================================================================================ torch/mmcv MHA
def _torch_mha_check(mha, path):
    if not isinstance(mha, nn.MultiheadAttention):
        raise SwapError(f'unknown layout: its .attn is {type(mha).__name__}, not torch.nn.MultiheadAttention')
    bad = []
    if mha.bias_k is not None or mha.bias_v is not None:
        bad.append('add_bias_kv=True')
    if mha.add_zero_attn:
        bad.append('add_zero_attn=True')
    if getattr(mha, 'batch_first', False):
        bad.append('an inner batch_first=True')
    if bad:
        raise SwapError(f'its torch.nn.MultiheadAttention uses {", ".join(bad)}, which this adapter does '
                        'not reproduce')


def _torch_mha_qkv(mha, query, key, value):
    """Batch-first (B, L, E) inputs -> q, k, v (B, h, L, d) through the packed or separate input projections."""
    if mha._qkv_same_embed_dim:
        wq, wk, wv = mha.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    bq = bk = bv = None
    if mha.in_proj_bias is not None:
        bq, bk, bv = mha.in_proj_bias.chunk(3)
    h, d = mha.num_heads, mha.head_dim

    def heads(t, wt, bt):
        return F.linear(t, wt, bt).view(t.shape[0], t.shape[1], h, d).transpose(1, 2)
    return heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)


def _torch_mha_masks(attn_mask, key_padding_mask, b, h, nq, nk):
    """torch.nn.MultiheadAttention mask semantics (bool / byte: True = may NOT attend; float: added) -> keep, bias."""
    keep = bias = None
    if attn_mask is not None:
        am = attn_mask.view(1, 1, nq, nk) if attn_mask.dim() == 2 else attn_mask.view(b, h, nq, nk)
        if am.dtype in (torch.bool, torch.uint8):
            keep = ~am.bool()
        else:
            bias = am
    if key_padding_mask is not None:
        kp = key_padding_mask.view(b, 1, 1, nk)
        if kp.dtype in (torch.bool, torch.uint8):
            kp = ~kp.bool()
            keep = kp if keep is None else keep & kp
        else:
            bias = kp if bias is None else bias + kp
    return keep, bias


def _torch_mha_attend(self, mha, query, key, value, attn_mask, key_padding_mask):
    """Batch-first tensors through the inner torch MultiheadAttention's weights and the kernel."""
    q, k, v = _torch_mha_qkv(mha, query, key, value)
    b, h, nq, d = q.shape
    keep, bias = _torch_mha_masks(attn_mask, key_padding_mask, b, h, nq, k.shape[2])
    out = _mix(self.kernel, q, k, v, None, d ** -0.5, bias, keep, float(mha.dropout), self.training)
    out = out.transpose(1, 2).reshape(b, nq, h * d)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def _mmcv_mha_layout(m, path, model):
    _need(m, path, 'attn', 'proj_drop', 'dropout_layer', 'batch_first', 'num_heads', 'embed_dims')
    _torch_mha_check(m.attn, path)
    lay = Layout(num_heads=m.num_heads, head_dim=m.attn.head_dim, nq=5, nk=5, scale=m.attn.head_dim ** -0.5,
                 no_grid='mmcv MultiheadAttention receives token sequences without an (H, W) grid',
                 masks='mmcv MultiheadAttention is handed attention / key-padding masks (DETR-family layers pass '
                       'the padding mask of batched images)',
                 varying='the number of keys follows the image size')
    name = path.rpartition('.')[2]
    if 'cross' in name:
        lay.nk = 7
        lay.cross = 'in cross-attention the keys come from another sequence (the memory), not from the queries'
        lay.where = 'cross-attention (queries x memory)'
    else:
        lay.where = 'sequence attention'
    return lay


def _mmcv_mha_forward(self, query, key=None, value=None, identity=None, query_pos=None, key_pos=None,
                      attn_mask=None, key_padding_mask=None, **kwargs):
    # the signature and the data flow are mmcv's MultiheadAttention.forward (whose **kwargs pass extra layer
    # arguments through unused); the attention itself goes through the kernel
    if 'residual' in kwargs:  # mmcv's deprecated name for identity
        warnings.warn("'residual' is deprecated in MultiheadAttention, use 'identity'", DeprecationWarning)
        identity = kwargs.pop('residual')
    if key is None:
        key = query
    if value is None:
        value = key
    if identity is None:
        identity = query
    if key_pos is None and query_pos is not None:
        if query_pos.shape == key.shape:
            key_pos = query_pos
        else:
            warnings.warn(f'position encoding of key is missing in {type(self).__name__}.')
    if query_pos is not None:
        query = query + query_pos
    if key_pos is not None:
        key = key + key_pos
    if not self.batch_first:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    out = _torch_mha_attend(self, self.attn, query, key, value, attn_mask, key_padding_mask)
    if not self.batch_first:
        out = out.transpose(0, 1)
    return identity + self.dropout_layer(self.proj_drop(out))


_register('mmcv MultiheadAttention (DETR-family layers)', ['mmcv.cnn.bricks.transformer.MultiheadAttention'],
          _mmcv_mha_layout, _mmcv_mha_forward)


# ============================================================================================ mmdet/mmseg: PVT SRA
def _mm_sra_layout(m, path, model):
    _need(m, path, 'attn', 'proj_drop', 'dropout_layer', 'batch_first', 'num_heads', 'sr_ratio')
    _torch_mha_check(m.attn, path)
    if 'forward' in vars(m):
        raise SwapError('unknown layout: the instance replaces its forward (legacy mmcv < 1.3.17 path)')
    return _sra_layout(m.num_heads, m.attn.head_dim, m.attn.head_dim ** -0.5, m.sr_ratio, False)


def _mm_sra_forward(self, x, hw_shape, identity=None):
    x_q = x
    if self.sr_ratio > 1:
        b, n, c = x.shape
        x_kv = self.sr(x.transpose(1, 2).reshape(b, c, *hw_shape))
        x_kv = self.norm(x_kv.flatten(2).transpose(1, 2))
    else:
        x_kv = x
    if identity is None:
        identity = x_q
    if self.kernel.needs_hw:  # only reached without spatial reduction: queries and keys share the grid
        q, k, v = _torch_mha_qkv(self.attn, x_q, x_kv, x_kv)
        out = _mix(self.kernel, q, k, v, (int(hw_shape[0]), int(hw_shape[1])), self.attn.head_dim ** -0.5, None,
                   None, float(self.attn.dropout), self.training, _context(self.kernel, x_q, q.shape[1], q.shape[3]))
        out = F.linear(out.transpose(1, 2).flatten(2), self.attn.out_proj.weight, self.attn.out_proj.bias)
    else:
        out = _torch_mha_attend(self, self.attn, x_q, x_kv, x_kv, None, None)
    return identity + self.dropout_layer(self.proj_drop(out))


_register('OpenMMLab PVT spatial-reduction attention',
          ['mmdet.models.backbones.pvt.SpatialReductionAttention',
           'mmseg.models.backbones.mit.EfficientMultiheadAttention'], _mm_sra_layout, _mm_sra_forward)


# ============================================================================================ discovery
_ATTN_NAME = re.compile(r'attention|attn|msa|xca', re.IGNORECASE)


def _looks_like_attention(m: nn.Module) -> bool:
    if isinstance(m, AttentionKernel):
        return False
    if isinstance(m, nn.MultiheadAttention):
        return True
    return bool(_ATTN_NAME.search(type(m).__name__)) and hasattr(m, 'num_heads')


def _inside(path: str, parent: str) -> bool:
    return parent == '' or path.startswith(parent + '.')


@dataclass
class _Entry:
    index: int
    path: str
    module: nn.Module
    adapter: Optional[Adapter]
    unknown: str = ''  # why it has no adapter


def _discover(model: nn.Module) -> List[_Entry]:
    """Attention modules in module order: those with an adapter, and unknown attention-like modules that neither
    contain nor sit inside a module with an adapter."""
    claimed: List[str] = []
    candidates = []
    for path, m in model.named_modules():
        if any(_inside(path, c) for c in claimed):
            continue
        if isinstance(m, AttentionKernel):
            continue
        ad = _adapter_of(m)
        if ad is not None:
            claimed.append(path)
            candidates.append((path, m, ad))
        elif _looks_like_attention(m):
            candidates.append((path, m, None))
    entries = []
    for path, m, ad in candidates:
        if ad is None:
            if any(_inside(c, path) and c != path for c in claimed):
                continue  # a wrapper (e.g. ShiftWindowMSA) of an adapted module
            own = any(isinstance(ch, AttentionKernel) for ch in m.children())
            why = ('it already runs a softfree_mm kernel (a softfree_mm backbone): set that backbone\'s attn_cfg'
                   if own else f'no adapter for this attention layout; supported: {", ".join(supported_layouts())}')
            entries.append(_Entry(len(entries), path, m, None, why))
        else:
            entries.append(_Entry(len(entries), path, m, ad))
    return entries


def _stage_key(path: str) -> Optional[str]:
    """The first numbered container in a module path: 'stages.2.blocks.1.attn.w_msa' -> 'stages.2'."""
    parts = path.split('.')
    for i, p in enumerate(parts):
        if p.isdigit():
            return '.'.join(parts[:i + 1])
    return None


def _select(entries: List[_Entry], layers) -> List[_Entry]:
    if layers is None:
        return list(entries)
    items = [layers] if isinstance(layers, (int, str)) else layers
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeError(f'swap_attention: layers must be None, an int, a path pattern or a non-empty list of them, '
                        f'got {layers!r}')
    chosen = set()
    listing = ', '.join(f'{e.index}: {e.path or "<model>"}' for e in entries[:40]) + (
        ' ...' if len(entries) > 40 else '')
    for it in items:
        if isinstance(it, bool) or not isinstance(it, (int, str)):
            raise TypeError(f'swap_attention: layers entries must be ints (indices) or strings (module paths / '
                            f'fnmatch patterns), got {it!r}')
        if isinstance(it, int):
            if not -len(entries) <= it < len(entries):
                raise SwapError(f'swap_attention: layers index {it} is out of range; the model has {len(entries)} '
                                f'attention modules: {listing}')
            chosen.add(entries[it].index)
        else:
            hits = [e.index for e in entries if fnmatch.fnmatchcase(e.path, it)]
            if not hits:
                raise SwapError(f'swap_attention: layers pattern {it!r} matches no attention module; the model has: '
                                f'{listing}')
            chosen.update(hits)
    return [e for e in entries if e.index in chosen]


def _message(e: Exception) -> str:
    return str(e.args[0]) if e.args else str(e)


def _assign_cfgs(attn_cfg, entries: List[_Entry], selected: List[_Entry]) -> List[dict]:
    if not isinstance(attn_cfg, (list, tuple)):
        try:
            cfg = normalize_cfg(attn_cfg)
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f'swap_attention: attn_cfg: {_message(e)}') from None
        return [copy.deepcopy(cfg) for _ in selected]
    keys = [_stage_key(e.path) for e in entries]
    stages = list(dict.fromkeys(k for k in keys if k is not None))
    has_stages = None not in keys and len(stages) < len(entries)
    cfgs = []
    for i, c in enumerate(attn_cfg):
        try:
            cfgs.append(normalize_cfg(c))
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f'swap_attention: attn_cfg[{i}]: {_message(e)}') from None
    if has_stages and len(cfgs) == len(stages):
        return [copy.deepcopy(cfgs[stages.index(_stage_key(e.path))]) for e in selected]
    if len(cfgs) == len(selected):
        return [copy.deepcopy(c) for c in cfgs]
    stage_txt = f'{len(stages)} stages ({", ".join(stages)}), ' if has_stages else ''
    per_stage = f'one per stage ({len(stages)}), ' if has_stages else ''
    raise SwapError(f'swap_attention: attn_cfg is a list of {len(cfgs)} kernel configs; the model has {stage_txt}'
                    f'{len(selected)} selected attention module(s); give one config for all, {per_stage}'
                    f'or one per module ({len(selected)})')


# ============================================================================================ fit checks
def _kernel_label(cfg: dict) -> str:
    args = ', '.join(f'{k}={v!r}' for k, v in cfg.items() if k != 'type')
    return f"{cfg['type']}({args})" if args else cfg['type']


def _fits(*flags):
    return ', '.join(n for n in list_attentions() if all(f(kernel_class(n)) for f in flags))


def _misfit(cfg: dict, kern: AttentionKernel, lay: Layout, prefix_cfg) -> Tuple[str, str]:
    """(code, why) ``kern`` cannot run in ``lay`` (('', '') when it fits), from its declared abilities."""
    name = cfg['type']
    if lay.cross and getattr(kern, 'tie_qk', False):
        return 'ties_qk', (f"kernel '{name}' ties keys to queries (tie_qk=True), but {lay.cross}; tie_qk=False "
                           'would take the given keys')
    if kern.needs_hw and lay.grid is None:
        return 'grid', (f"kernel '{name}' needs the token grid (needs_hw), but {lay.no_grid}; kernels without a grid: "
                f"{_fits(lambda c: not c.needs_hw)}")
    if kern.needs_hw and lay.prefix and prefix_cfg is None:
        return 'prefix', (f"kernel '{name}' needs the token grid and the tokens include {lay.prefix} class/register "
                          "token(s) that are not on it, and prefix_attention=None refuses them; pass "
                          "prefix_attention='softmax' (or another kernel without a grid) to let them attend over all "
                          'tokens')
    if lay.masks and not kern.supports_mask:
        return 'mask', (f"kernel '{name}' cannot honour a mask, but {lay.masks}; kernels that can: "
                f"{_fits(lambda c: c.supports_mask)}")
    if lay.varying and kern.fixed_length:
        return 'length', (f"kernel '{name}' has learned weights tied to token positions (fixed_length), but "
                          f'{lay.varying}')
    return '', ''


def _probe(kern: AttentionKernel, lay: Layout, prefix_kern) -> str:
    """Run the kernel once on random tensors shaped as the layout hands them; '' or the kernel's own error."""
    g = torch.Generator().manual_seed(0)
    d = lay.head_dim if lay.head_dim is not None else 5
    grid_kernel = kern.needs_hw and lay.grid is not None
    nq, nk = lay.nq, lay.nk
    if grid_kernel:
        nq = nk = lay.grid[0] * lay.grid[1]
    q = torch.randn(PROBE_BATCH, lay.num_heads, nq, d, generator=g)
    k = torch.randn(PROBE_BATCH, lay.num_heads, nk, d, generator=g)
    v = torch.randn(PROBE_BATCH, lay.num_heads, nk, d, generator=g)
    bias = torch.randn(1, lay.num_heads, nq, nk, generator=g) if lay.bias and kern.supports_bias else None
    mask = None
    if lay.masks and kern.supports_mask:
        mask = torch.ones(1, 1, nq, nk, dtype=torch.bool)
        mask[..., -1] = False
        mask[..., -1, -1] = True
    try:
        with torch.no_grad():
            out = kern(q, k, v, hw=lay.grid if grid_kernel else None, scale=lay.scale, bias=bias, mask=mask)
            if grid_kernel and lay.prefix:
                qp = torch.randn(PROBE_BATCH, lay.num_heads, lay.prefix, d, generator=g)
                kp = torch.randn(PROBE_BATCH, lay.num_heads, nk + lay.prefix, d, generator=g)
                prefix_kern(qp, kp, kp, hw=None, scale=lay.scale)
    except (ValueError, TypeError, RuntimeError) as e:
        return f"kernel '{kern.name}' fails on this layout: {str(e).splitlines()[0]}"
    if out.shape != (PROBE_BATCH, lay.num_heads, nq, d) or not torch.isfinite(out).all():
        return f"kernel '{kern.name}' gives a wrong shape or non-finite values on this layout"
    return ''


# ============================================================================================ install
_SWAPPED_CLASSES: Dict[type, type] = {}


def _new_swapped(original: type):
    return _swapped_class(original).__new__(_swapped_class(original))


def _swapped_reduce_ex(self, protocol):
    # pickle / deepcopy by the original class (importable), not by the generated subclass
    return _new_swapped, (type(self)._sf_original_class,), self.__dict__.copy()


def _swapped_class(original: type) -> type:
    cls = _SWAPPED_CLASSES.get(original)
    if cls is None:
        ad = ADAPTERS[_type_key(original)]
        cls = type(f'SoftFree{original.__name__}', (original,), {
            'forward': ad.forward, '_sf_original_class': original, '_sf_adapter': ad,
            '__reduce_ex__': _swapped_reduce_ex, '__module__': __name__,
            '__doc__': f'{original.__name__} whose attention runs through a softfree_mm kernel ({ad.label}).'})
        _SWAPPED_CLASSES[original] = cls
    return cls


def _device_dtype(m: nn.Module):
    for p in m.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device('cpu'), torch.float32


def restore_attention(model: nn.Module) -> nn.Module:
    """Undo :func:`swap_attention`: every swapped module gets back its class and loses its kernel(s)."""
    for _, m in model.named_modules():
        orig = getattr(type(m), '_sf_original_class', None)
        if orig is None or type(m) is orig:
            continue
        for name in ('kernel', 'prefix_kernel'):
            if name in m._modules:
                del m._modules[name]
        for p in getattr(m, '_sf_frozen', ()):
            p.requires_grad_(True)
        for attr in [a for a in vars(m) if a.startswith('_sf_')]:
            delattr(m, attr)
        m.__class__ = orig
    if not any(hasattr(type(m), '_sf_original_class') for m in model.modules()):
        for m in model.modules():  # the grid hooks on patch embeddings, once nothing under model reads them
            ctx = vars(m).pop('_sf_grid_context', None)
            if ctx is not None:
                for hooks in (m._forward_pre_hooks, m._forward_hooks):
                    for key in [k for k, h in hooks.items() if getattr(h, '__self__', None) is ctx]:
                        del hooks[key]
    return model


@dataclass
class _Plan:
    entry: _Entry
    cfg: dict
    layout: Layout
    kernel: AttentionKernel
    prefix_kernel: Optional[AttentionKernel]


def swap_attention(model: nn.Module, attn_cfg, *, layers=None, prefix_attention='softmax') -> nn.Module:
    """Make the attention modules of ``model`` compute through a softfree_mm kernel, keeping every weight and key.

    Args:
        model: any model holding supported attention modules (see :func:`supported_layouts`), or one such module.
        attn_cfg: a kernel name or config dict (``dict(type='poly', degree=3)``), or a list: one per stage (the
            first numbered container of the module paths, e.g. ``stages.2``) or one per selected module.
        layers: which attention modules: None (all), indices into the discovered list (see the summary), module
            paths or fnmatch patterns (``'blocks.1?.attn'``, ``'stages.0.*'``), or a list of those.
        prefix_attention: how class/register tokens attend when the kernel needs the token grid (the patch
            tokens use the kernel on their grid; the prefix queries attend over all tokens through this kernel,
            which must need no grid); None refuses grid kernels where there are prefix tokens.

    Returns ``model`` itself (modified in place). Raises :class:`SwapError` naming every module that cannot take
    its kernel and why (nothing is modified then). The summary is logged and kept in ``swap_summary(model)``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f'swap_attention: model must be a torch.nn.Module, got {type(model).__name__}')
    if prefix_attention is not None:
        try:
            prefix_attention = normalize_cfg(prefix_attention)
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f'swap_attention: prefix_attention: {_message(e)}') from None
    entries = _discover(model)
    if not entries:
        raise SwapError(f'swap_attention: no attention module found in {type(model).__name__}; supported layouts: '
                        f'{", ".join(supported_layouts())}')
    selected = _select(entries, layers)
    cfgs = _assign_cfgs(attn_cfg, entries, selected)

    plans, problems = [], []
    for entry, cfg in zip(selected, cfgs):
        plan_or_refusal = _plan(model, entry, cfg, prefix_attention)
        if isinstance(plan_or_refusal, _Plan):
            plans.append(plan_or_refusal)
        else:
            problems.append(plan_or_refusal)
    if problems:
        head = (f'swap_attention: {len(problems)} of {len(selected)} selected attention module(s) cannot be swapped '
                '(nothing was changed); select others with layers=..., or give them another attn_cfg:')
        raise SwapError('\n  '.join([head] + [f'{p}: {why}' for p, _, why in problems]), problems)

    records = []
    for plan in plans:
        records.append(_install(model, plan))
    _log(model, records)
    return model


def _plan(model, entry: _Entry, cfg: dict, prefix_attention):
    """A _Plan, or the refusal (where, code, reason)."""
    where = f'{entry.path or "<model>"} ({_type_key(_original_class(entry.module))})'
    if entry.adapter is None:
        return where, 'layout', entry.unknown
    try:
        lay = entry.adapter.layout(entry.module, entry.path, model)
    except SwapError as e:
        return where, 'layout', str(e)
    if not hasattr(type(entry.module), '_sf_original_class'):
        taken = [n for n in ('kernel', 'prefix_kernel') if hasattr(entry.module, n)]
        if taken:
            return where, 'layout', f'the module already has an attribute {taken[0]!r}, where the kernel would go'
    try:
        kern = build_attention(cfg, num_heads=lay.num_heads, head_dim=lay.head_dim)
    except (ValueError, TypeError) as e:
        return where, 'build', (f"kernel '{cfg['type']}' cannot be built for this layout (num_heads={lay.num_heads}, "
                                f'head_dim={lay.head_dim}{" (XCA: the token count)" if lay.head_dim is None else ""})'
                                f': {e}')
    prefix_kern = None
    if kern.needs_hw and lay.prefix and prefix_attention is not None:
        prefix_kern = build_attention(prefix_attention, num_heads=lay.num_heads, head_dim=lay.head_dim)
        if prefix_kern.needs_hw:
            return where, 'prefix', (f"prefix_attention '{prefix_attention['type']}' needs the token grid itself; "
                                     'the class/register tokens are not on it')
    code, why = _misfit(cfg, kern, lay, prefix_attention)
    if not code:
        why = _probe(kern, lay, prefix_kern)
        code = 'probe' if why else ''
    if code:
        return where, code, why
    return _Plan(entry, cfg, lay, kern, prefix_kern)


def _install(model, plan: _Plan) -> dict:
    m, lay, kern = plan.entry.module, plan.layout, plan.kernel
    if getattr(type(m), '_sf_original_class', None) is not None:  # swapped before: start from the original
        restore_attention(m)
    device, dtype = _device_dtype(m)
    m.__class__ = _swapped_class(type(m))
    m.add_module('kernel', kern.to(device=device, dtype=dtype))
    if plan.prefix_kernel is not None:
        m.add_module('prefix_kernel', plan.prefix_kernel.to(device=device, dtype=dtype))
    m._sf_path = plan.entry.path or '<model>'
    m._sf_prefix = lay.prefix
    m._sf_grid = None
    if plan.entry.adapter.install is not None:
        plan.entry.adapter.install(m, plan.entry.path, model, lay)
    notes = [lay.where] if lay.where else []
    if lay.bias and not kern.supports_bias:
        frozen = [p for n, p in m.named_parameters(recurse=False) if 'relative_position_bias' in n and p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        m._sf_frozen = frozen
        notes.append(f'{lay.bias} left out (the kernel takes no bias; table kept, frozen)')
    if kern.takes_context:
        notes.append("context: the mean of the module's input over the kernel's tokens")
    if kern.needs_hw and lay.prefix:
        notes.append(f"{lay.prefix} prefix token(s) attend over all tokens through "
                     f"{_kernel_label(normalize_cfg(plan.prefix_kernel.name))}; patch tokens through the kernel on "
                     'their grid')
    record = dict(index=plan.entry.index, path=m._sf_path, type=_type_key(_original_class(m)),
                  adapter=plan.entry.adapter.label, kernel=_kernel_label(plan.cfg), notes=notes)
    m._sf_record = record
    return record


def swap_summary(model: nn.Module) -> List[dict]:
    """One record per swapped module of ``model``: index, path, type, adapter, kernel, notes."""
    return [m._sf_record for _, m in model.named_modules() if hasattr(type(m), '_sf_original_class')
            and hasattr(m, '_sf_record')]


def _log(model, records):
    lines = [f'swap_attention: {len(records)} attention module(s) of {type(model).__name__} swapped:']
    for r in records:
        lines.append(f"  [{r['index']}] {r['path']} ({r['adapter']}) -> {r['kernel']}"
                     + (f"  [{'; '.join(r['notes'])}]" if r['notes'] else ''))
    msg = '\n'.join(lines)
    try:
        from mmengine.logging import print_log
    except ImportError:
        logging.getLogger('softfree_mm.swap').info(msg)
    else:
        print_log(msg, logger='current')
