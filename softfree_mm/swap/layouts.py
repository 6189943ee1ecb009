"""Layouts that several libraries share: ViT-style tokens (prefix + patch grid), Swin windows (timm's and OpenMMLab's
W-MSA, one class copied into mmdet, mmseg and mmpretrain), PVT spatial reduction, and the inner
``torch.nn.MultiheadAttention`` that OpenMMLab's attention modules wrap."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .adapter import Layout, SwapError, need, parent
from .attend import context, mix, window_keep


# ------------------------------------------------------------------------------------ ViT tokens
def vit_tokens_layout(num_heads, head_dim, scale, prefix=0, grid: Optional[Tuple[int, int]] = None) -> Layout:
    """``prefix`` class/register tokens then the patch tokens on ``grid``; grid None: no owner model with a patch
    embedding was found, so neither the grid nor a fixed token count is known."""
    lay = Layout(num_heads=num_heads, head_dim=head_dim, nq=16, nk=16, scale=scale)
    if grid is None:
        lay.no_grid = 'no owner model with a patch embedding was found above it, so its token grid is unknown'
        lay.varying = 'the number of tokens is not known to be fixed'
        lay.where = 'tokens (no grid known)'
        return lay
    lay.prefix, lay.grid = prefix, grid
    lay.nq = lay.nk = prefix + grid[0] * grid[1]
    return lay


# ------------------------------------------------------------------------------------ Swin windows
def window_layout(m, bias_reader: str, shift) -> Layout:
    """Windows of ``m.window_size`` with a relative position bias; ``shift``: the block's shift (falsy: none)."""
    need(m, 'qkv', 'proj', 'proj_drop', 'attn_drop', 'num_heads', 'scale', 'window_size',
         'relative_position_bias_table', bias_reader)
    wh, ww = m.window_size
    lay = Layout(num_heads=m.num_heads, head_dim=m.qkv.out_features // (3 * m.num_heads), nq=wh * ww, nk=wh * ww,
                 grid=(wh, ww), scale=m.scale, bias='relative position bias')
    if shift:
        lay.masks = f'the block shifts its windows (shift_size={shift}) and keeps the regions apart with a mask'
    lay.where = f'{wh}x{ww} windows' + (', shifted (mask)' if lay.masks else '')
    return lay


def window_forward(self, x, mask, rel_pos_bias):
    """(B * nW, N, C) window tokens, Swin's additive (nW, N, N) shift mask -> the kernel, as timm's and mm's W-MSA."""
    b_, n, _ = x.shape
    q, k, v = self.qkv(x).reshape(b_, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    bias = rel_pos_bias(self, n) if self.kernel.supports_bias else None
    keep = window_keep(mask, b_, n)
    hw = tuple(self.window_size) if self.kernel.needs_hw else None
    ctx = context(self.kernel, x, q.shape[1], q.shape[3])
    out = mix(self.kernel, q, k, v, hw, self.scale, bias, keep, self.attn_drop.p, self.training, ctx)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b_, n, -1)))


def mm_window_layout(m, path, model):
    return window_layout(m, 'relative_position_index', getattr(parent(model, path), 'shift_size', 0))


def _mm_rel_pos_bias(self, n):
    table = self.relative_position_bias_table[self.relative_position_index.view(-1)]
    return table.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)


def mm_window_forward(self, x, mask=None):
    return window_forward(self, x, mask, _mm_rel_pos_bias)


MM_WINDOW_LABEL = 'OpenMMLab Swin window attention (W-MSA)'


# ------------------------------------------------------------------------------------ PVT spatial reduction
def sra_layout(heads, head_dim, scale, sr_ratio, pooled) -> Layout:
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


# ------------------------------------------------------------------------------------ torch MultiheadAttention
def torch_mha_check(mha):
    """SwapError unless ``mha`` is a torch MultiheadAttention in the variant the OpenMMLab adapters reproduce."""
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


def torch_mha_qkv(mha, query, key, value):
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


def torch_mha_out(mha, out):
    """(B, h, L, d) kernel output -> (B, L, E) through the inner MultiheadAttention's output projection."""
    return F.linear(out.transpose(1, 2).flatten(2), mha.out_proj.weight, mha.out_proj.bias)


def torch_mha_attend(self, mha, query, key, value, attn_mask, key_padding_mask):
    """Batch-first tensors through the inner torch MultiheadAttention's weights and the kernel."""
    q, k, v = torch_mha_qkv(mha, query, key, value)
    b, h, nq, d = q.shape
    keep, bias = _torch_mha_masks(attn_mask, key_padding_mask, b, h, nq, k.shape[2])
    out = mix(self.kernel, q, k, v, None, d ** -0.5, bias, keep, float(mha.dropout), self.training)
    return torch_mha_out(mha, out)
