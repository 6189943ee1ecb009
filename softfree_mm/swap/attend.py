"""What every swapped forward shares: the kernel call (with attention dropout kept), the context of context-taking
kernels, class/register tokens beside the grid, mask conversions, and the token grid of the current input."""
import torch

from ..attention.base import mix  # noqa: F401  (the one kernel call, shared with the backbones' KernelAttention)


def context(kernel, x, heads, head_dim):
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


def attend_tokens(self, q, k, v, hw, scale, bias, mask, drop_p, x):
    """Tokens = ``self._sf_prefix`` class/register tokens then the grid tokens; ``x`` is the module's input.

    A kernel without a grid mixes all tokens alike. A grid kernel gets the patch tokens alone on their grid, and
    the prefix queries attend over all tokens through ``self.prefix_kernel`` (class attention, as in CaiT), so no
    patch query reads a prefix token."""
    kern, p = self.kernel, self._sf_prefix
    if not kern.needs_hw:
        return mix(kern, q, k, v, None, scale, bias, mask, drop_p, self.training)
    n = q.shape[2]
    if hw is None or n - p != hw[0] * hw[1]:
        raise ValueError(f'{self._sf_path}: kernel {kern.name!r} needs the token grid; {n} tokens with {p} prefix '
                         f'token(s) do not match the grid {hw}')
    ctx = context(kern, x[:, p:], q.shape[1], q.shape[3])
    if p == 0:
        return mix(kern, q, k, v, hw, scale, bias, mask, drop_p, self.training, ctx)
    out_prefix = mix(self.prefix_kernel, q[:, :, :p], k, v, None, scale, _rows(bias, 0, p), _rows(mask, 0, p),
                     drop_p, self.training)
    out_grid = mix(kern, q[:, :, p:], k[:, :, p:], v[:, :, p:], hw, scale, _cols(_rows(bias, p, n), p),
                   _cols(_rows(mask, p, n), p), drop_p, self.training, ctx)
    return torch.cat([out_prefix, out_grid], dim=2)


def sdpa_mask(attn_mask, is_causal, nq, nk, device):
    """SDPA-style ``attn_mask`` (bool: True = may attend; float: added) / ``is_causal`` -> (keep mask, bias)."""
    if is_causal:
        keep = torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=0)
        return keep, None
    if attn_mask is None:
        return None, None
    if attn_mask.dtype == torch.bool:
        return attn_mask, None
    return None, attn_mask


def window_keep(mask, b_, n):
    """Swin's (nW, N, N) additive window mask (0 = keep, -100 = apart) -> bool keep (B*nW, 1, N, N)."""
    if mask is None:
        return None
    keep = mask > -1.0 if mask.dtype != torch.bool else mask
    nw = keep.shape[0]
    return keep.view(1, nw, 1, n, n).expand(b_ // nw, nw, 1, n, n).reshape(b_, 1, n, n)


class GridContext:
    """The token grid of the current forward, recorded by a hook on the owner's patch embedding (for models whose
    input size may vary)."""

    def __init__(self, static=None):
        self.hw = static

    def timm_pre_hook(self, module, args):
        x = args[0]
        self.hw = tuple(int(s) for s in module.dynamic_feat_size((x.shape[-2], x.shape[-1])))

    def mm_post_hook(self, module, args, output):
        self.hw = tuple(int(s) for s in output[1])


class FixedGrid:
    """The grid of a timm patch embedding of fixed image size (read at each call: set_input_size may change it).
    A plain holder, so that the patch embedding is not registered as a child of the attention module."""

    def __init__(self, patch_embed):
        self.patch_embed = patch_embed

    @property
    def hw(self):
        return tuple(int(s) for s in self.patch_embed.grid_size)


def hook_context(pe, kind):
    """The one :class:`GridContext` of patch embedding ``pe`` ('timm': a pre-hook reading the input size; 'mm': a
    hook reading the (H, W) that OpenMMLab's PatchEmbed returns); restore_attention removes it."""
    ctx = getattr(pe, '_sf_grid_context', None)
    if ctx is None:
        ctx = GridContext()
        if kind == 'timm':
            pe.register_forward_pre_hook(ctx.timm_pre_hook)
        else:
            pe.register_forward_hook(ctx.mm_post_hook)
        pe._sf_grid_context = ctx
    return ctx


def grid_now(self):
    src = self._sf_grid
    return None if src is None else src.hw
