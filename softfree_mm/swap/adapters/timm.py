"""timm: ViT / DeiT / DeiT-3 ``Attention``, Swin ``WindowAttention``, PVTv2 ``Attention``, XCiT's ``XCA`` and the
class attention of XCiT and CaiT."""
import torch.nn.functional as F

from ..adapter import Layout, need, owner, parent, register
from ..attend import FixedGrid, attend_tokens, context, grid_now, hook_context, mix, sdpa_mask
from ..layouts import sra_layout, vit_tokens_layout, window_forward, window_layout


# ------------------------------------------------------------------------------------ ViT / DeiT
def _vit_owner(m):
    return hasattr(m, 'num_prefix_tokens') and hasattr(m, 'patch_embed') and hasattr(m.patch_embed, 'grid_size')


def _dynamic(vit) -> bool:
    return bool(getattr(vit, 'dynamic_img_size', False)) or not getattr(vit.patch_embed, 'strict_img_size', True)


def _vit_layout(m, path, model):
    need(m, 'qkv', 'q_norm', 'k_norm', 'attn_drop', 'proj', 'proj_drop', 'num_heads', 'head_dim', 'scale')
    vit = owner(model, path, _vit_owner)
    if vit is None:
        return vit_tokens_layout(m.num_heads, m.head_dim, m.scale)
    p = int(vit.num_prefix_tokens)
    grid = tuple(int(s) for s in vit.patch_embed.grid_size)
    lay = vit_tokens_layout(m.num_heads, m.head_dim, m.scale, p, grid)
    dynamic = _dynamic(vit)
    if dynamic:
        lay.varying = f'{type(vit).__name__} takes any image size (dynamic_img_size), so the token count varies'
    drop = getattr(vit, 'patch_drop', None)
    if drop is not None and getattr(drop, 'prob', 0) > 0:
        lay.grid = None
        lay.no_grid = (f'patch dropout (patch_drop_rate={drop.prob}) removes random patch tokens in training, so '
                       'the tokens do not form a grid')
    lay.where = f'{p} prefix + {grid[0]}x{grid[1]} patch tokens' + (' (grid per input)' if dynamic else '')
    return lay


def _vit_install(m, path, model, lay):
    vit = owner(model, path, _vit_owner)
    if vit is None or lay.grid is None or not m.kernel.needs_hw:
        return
    m._sf_grid = hook_context(vit.patch_embed, 'timm') if _dynamic(vit) else FixedGrid(vit.patch_embed)


def _vit_forward(self, x, attn_mask=None, is_causal=False):
    b, n, _ = x.shape
    gate = self.gate(x).sigmoid() if getattr(self, 'gate', None) is not None else None
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    keep, bias = sdpa_mask(attn_mask, is_causal, n, n, x.device)
    out = attend_tokens(self, q, k, v, grid_now(self), self.scale, bias, keep, self.attn_drop.p, x)
    x = out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
    x = self.norm(x) if hasattr(self, 'norm') else x
    if gate is not None:
        x = x * gate
    return self.proj_drop(self.proj(x))


register('timm ViT attention', ['timm.layers.attention.Attention', 'timm.models.vision_transformer.Attention'],
         _vit_layout, _vit_forward, _vit_install)


# ------------------------------------------------------------------------------------ Swin windows
def _swin_layout(m, path, model):
    block = parent(model, path)
    shift = tuple(getattr(block, 'shift_size', (0, 0)) or (0, 0))
    dynamic = getattr(block, 'dynamic_mask', False)
    return window_layout(m, '_get_rel_pos_bias', shift if any(shift) or dynamic else None)


def _swin_forward(self, x, mask=None):
    return window_forward(self, x, mask, lambda m, n: m._get_rel_pos_bias())


register('timm Swin window attention', ['timm.models.swin_transformer.WindowAttention'], _swin_layout,
         _swin_forward)


# ------------------------------------------------------------------------------------ PVTv2 spatial reduction
def _pvt_layout(m, path, model):
    need(m, 'q', 'kv', 'proj', 'proj_drop', 'attn_drop', 'num_heads', 'head_dim', 'scale', 'sr', 'pool')
    return sra_layout(m.num_heads, m.head_dim, m.scale, m.sr.stride[0] if m.sr is not None else 1, m.pool is not None)


def _pvt_forward(self, x, feat_size):
    b, n, c = x.shape
    h, w = feat_size
    q = self.q(x).reshape(b, n, self.num_heads, -1).permute(0, 2, 1, 3)
    ctx = context(self.kernel, x, self.num_heads, self.head_dim)
    if self.pool is not None:
        x = x.permute(0, 2, 1).reshape(b, c, h, w)
        x = self.act(self.norm(self.sr(self.pool(x)).reshape(b, c, -1).permute(0, 2, 1)))
    elif self.sr is not None:
        x = x.permute(0, 2, 1).reshape(b, c, h, w)
        x = self.norm(self.sr(x).reshape(b, c, -1).permute(0, 2, 1))
    k, v = self.kv(x).reshape(b, -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    hw = (int(h), int(w)) if self.kernel.needs_hw else None
    out = mix(self.kernel, q, k, v, hw, self.scale, None, None, self.attn_drop.p, self.training, ctx)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


register('timm PVTv2 spatial-reduction attention', ['timm.models.pvt_v2.Attention'], _pvt_layout, _pvt_forward)


# ------------------------------------------------------------------------------------ XCiT, CaiT
def _xca_layout(m, path, model):
    need(m, 'qkv', 'temperature', 'attn_drop', 'proj', 'proj_drop', 'num_heads')
    d = m.qkv.in_features // m.num_heads
    return Layout(num_heads=m.num_heads, head_dim=None, nq=d, nk=d, scale=1.0,
                  no_grid=f'XCA attends over the {d} channels of a head (its "head_dim" is the token count), '
                          'which have no spatial grid',
                  where=f'cross-covariance over {d} channels per head')


def _xca_forward(self, x):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 4, 1).unbind(0)
    # as timm: q and k L2-normalised over the tokens; the temperature is folded into q (scale 1), which for a
    # kernel scoring ``scale * q.k`` is exactly the temperature as the score scale
    q = F.normalize(q, dim=-1) * self.temperature
    k = F.normalize(k, dim=-1)
    out = mix(self.kernel, q, k, v, None, 1.0, None, None, self.attn_drop.p, self.training)
    return self.proj_drop(self.proj(out.permute(0, 3, 1, 2).reshape(b, n, c)))


register('timm XCiT cross-covariance attention (XCA)', ['timm.models.xcit.XCA'], _xca_layout, _xca_forward)


def _class_attn_layout(m, path, model):
    need(m, 'q', 'k', 'v', 'proj', 'proj_drop', 'attn_drop', 'num_heads', 'scale')
    d = m.q.out_features // m.num_heads
    return Layout(num_heads=m.num_heads, head_dim=d, nq=1, nk=17, scale=m.scale,
                  no_grid='class attention: the only query is the class token',
                  cross='class attention: the only query is the class token, the keys are all tokens',
                  varying='the number of keys follows the image size', where='class token over all tokens')


def _class_attn_forward(self, x):
    b, n, c = x.shape
    h = self.num_heads
    q = self.q(x[:, 0]).unsqueeze(1).reshape(b, 1, h, c // h).permute(0, 2, 1, 3)
    k = self.k(x).reshape(b, n, h, c // h).permute(0, 2, 1, 3)
    v = self.v(x).reshape(b, n, h, c // h).permute(0, 2, 1, 3)
    out = mix(self.kernel, q, k, v, None, self.scale, None, None, self.attn_drop.p, self.training)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, 1, c)))


register('timm class attention (XCiT, CaiT)', ['timm.models.cait.ClassAttn'], _class_attn_layout,
         _class_attn_forward)
