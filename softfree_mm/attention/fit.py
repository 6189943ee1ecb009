"""Whether a kernel fits the place a layer hands it its tokens, read from the kernel's declared abilities.

One set of rules for our backbones (checked at build) and for foreign models (``softfree_mm.swap``): the first rule
a kernel breaks gives a code and a reason naming what the place demands and which kernels would fit. Torch only.
"""
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch

from . import kernel_class, list_attentions

# what a backbone's place demands, in the words of its refusals
HANDS_MASKS = 'there it is handed attention masks (shifted windows / padded tokens)'
VARYING_LENGTH = 'there the number of tokens varies with the input size'


@dataclass
class Site:
    """What a place demands of a kernel. Each text, when non-empty, says why the demand holds there (it goes into
    the refusal)."""
    masks: str = ''  # the kernel is handed masks
    bias: str = ''  # the layer adds this score bias (a kernel without bias support runs without it)
    varying: str = ''  # the number of tokens follows the input size
    cross: str = ''  # the keys are not the queries
    no_grid: str = ''  # queries and keys share no (H, W) token grid
    prefix: int = 0  # class/register tokens beside the grid tokens


def kernels_where(ability: Callable[[type], bool]) -> str:
    """The registered kernel names whose class has ``ability``, comma-separated (the 'kernels that fit' list)."""
    return ', '.join(n for n in list_attentions() if ability(kernel_class(n)))


def misfit(kernel, site: Site, prefix_kernel: bool = True) -> Tuple[str, str]:
    """``(code, reason)`` of the first rule ``kernel`` (a built kernel or a kernel class) breaks at ``site``;
    ``('', '')`` when it fits. ``prefix_kernel``: the prefix tokens attend through a kernel of their own.

    Codes: 'ties_qk', 'grid', 'prefix', 'mask', 'length'."""
    if site.cross and getattr(kernel, 'tie_qk', False):
        return 'ties_qk', (f'it ties keys to queries (tie_qk=True), but {site.cross}; tie_qk=False would take the '
                           'given keys')
    if kernel.needs_hw and site.no_grid:
        return 'grid', (f'it needs the token grid (needs_hw=True), but {site.no_grid}; kernels without a grid: '
                        f'{kernels_where(lambda c: not c.needs_hw)}')
    if kernel.needs_hw and site.prefix and not prefix_kernel:
        return 'prefix', (f'it needs the token grid and the tokens include {site.prefix} class/register token(s) '
                          "that are not on it, and prefix_attention=None refuses them; pass "
                          "prefix_attention='softmax' (or another kernel without a grid) to let them attend over all "
                          'tokens')
    if site.masks and not kernel.supports_mask:
        return 'mask', (f'it cannot honour a mask, but {site.masks}; kernels that can: '
                        f'{kernels_where(lambda c: c.supports_mask)}')
    if site.varying and kernel.fixed_length:
        return 'length', ('its learned weights are tied to token positions up to a fixed length (fixed_length), '
                          f'but {site.varying}; kernels that fit: {kernels_where(lambda c: not c.fixed_length)}')
    return '', ''


def drops_bias(kernel, site: Site) -> bool:
    """True when the place adds a score bias that ``kernel`` cannot take (it then runs without it)."""
    return bool(site.bias) and not kernel.supports_bias


def refusal(name: str, reason: str, where: Optional[str] = None) -> str:
    """The refusal sentence: the kernel, the place (``where``; None: here) and the reason."""
    return f"attention kernel '{name}' cannot be used {f'in {where}' if where else 'here'}: {reason}"


def require_kernel_fit(cfg: dict, owner: str, where: str, *, needs_mask: bool = False,
                       varying_length: bool = False, no_grid: str = '', kernel=None) -> type:
    """The kernel class for ``cfg``; a ValueError ``'<owner>: attention kernel ... cannot be used in <where>: ...'``
    when the place hands it masks (``needs_mask``), token counts that follow the input size (``varying_length``) or
    no grid (``no_grid``: why) and it cannot take them. ``kernel``: the built kernel, when its abilities depend on
    its arguments (read from the class otherwise)."""
    cls = kernel_class(cfg)
    site = Site(masks=HANDS_MASKS if needs_mask else '', varying=VARYING_LENGTH if varying_length else '',
                no_grid=no_grid)
    code, why = misfit(cls if kernel is None else kernel, site)
    if code:
        raise ValueError(f"{owner}: {refusal(cfg['type'], why, where)}")
    return cls


def probe(kernel, num_heads: int, head_dim: int, nq: int, nk: int, *, hw: Optional[Sequence[int]] = None,
          scale: float = 1.0, bias: bool = False, mask: bool = False, batch: int = 1, seed: int = 0,
          finite: bool = True) -> str:
    """Run ``kernel`` once on random tensors of the shapes a place hands it (a bias, a mask that keeps every row
    non-empty, when asked); '' when it gives values of the right shape (finite ones, unless ``finite=False``), else
    the reason."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, nq, head_dim, generator=g)
    k = torch.randn(batch, num_heads, nk, head_dim, generator=g)
    v = torch.randn(batch, num_heads, nk, head_dim, generator=g)
    b = torch.randn(1, num_heads, nq, nk, generator=g) if bias else None
    m = None
    if mask:
        m = torch.ones(1, 1, nq, nk, dtype=torch.bool)
        m[..., -1] = False
        m[..., -1, -1] = True
    try:
        with torch.no_grad():
            out = kernel(q, k, v, hw=hw, scale=scale, bias=b, mask=m)
    except (ValueError, TypeError, RuntimeError) as e:
        return f'it fails on this layout: {str(e).splitlines()[0]}'
    if out.shape != (batch, num_heads, nq, head_dim) or (finite and not torch.isfinite(out).all()):
        return 'it gives a wrong shape or non-finite values on this layout'
    return ''
