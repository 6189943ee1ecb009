"""mmpretrain: the ViT ``MultiheadAttention`` (class/extra tokens, patch grid from the owner model) and Swin's
``WindowMSA`` (the OpenMMLab W-MSA layout)."""
import functools

from ..adapter import need, owner, register
from ..attend import attend_tokens, grid_now, hook_context
from ..layouts import MM_WINDOW_LABEL, mm_window_forward, mm_window_layout, vit_tokens_layout


def _vit_owner(m):
    return hasattr(m, 'num_extra_tokens') and hasattr(m, 'patch_embed') and hasattr(m, 'patch_resolution')


def _scale(m):
    f = m.scaled_dot_product_attention
    if isinstance(f, functools.partial) and f.keywords.get('scale'):
        # mmpretrain's python SDPA (used when qk_scale is given) DIVIDES the scores by its ``scale`` argument
        return 1.0 / float(f.keywords['scale'])
    return m.head_dims ** -0.5


def _mha_layout(m, path, model):
    need(m, 'qkv', 'proj', 'proj_drop', 'out_drop', 'gamma1', 'attn_drop', 'num_heads', 'head_dims', 'embed_dims',
         'v_shortcut', 'scaled_dot_product_attention')
    vit = owner(model, path, _vit_owner)
    if vit is None:
        return vit_tokens_layout(m.num_heads, m.head_dims, _scale(m))
    p = int(vit.num_extra_tokens)
    grid = tuple(int(s) for s in vit.patch_resolution)
    lay = vit_tokens_layout(m.num_heads, m.head_dims, _scale(m), p, grid)
    lay.varying = f'{type(vit).__name__} takes any image size, so the token count varies'
    lay.where = f'{p} prefix + patch tokens on their grid ({grid[0]}x{grid[1]} at the configured size)'
    return lay


def _mha_install(m, path, model, lay):
    vit = owner(model, path, _vit_owner)
    if vit is not None and m.kernel.needs_hw:  # the grid of each input, as its PatchEmbed returns it
        m._sf_grid = hook_context(vit.patch_embed, 'mm')
    m._sf_scale = lay.scale


def _mha_forward(self, x):
    b, n, _ = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4).unbind(0)
    out = attend_tokens(self, q, k, v, grid_now(self), self._sf_scale, None, None, float(self.attn_drop), x)
    x = self.proj(out.transpose(1, 2).reshape(b, n, self.embed_dims))
    x = self.out_drop(self.gamma1(self.proj_drop(x)))
    if self.v_shortcut:
        x = v.squeeze(1) + x
    return x


register('mmpretrain MultiheadAttention (ViT)', ['mmpretrain.models.utils.attention.MultiheadAttention'],
         _mha_layout, _mha_forward, _mha_install)
register(MM_WINDOW_LABEL, ['mmpretrain.models.utils.attention.WindowMSA'], mm_window_layout, mm_window_forward)
