"""One module's plan: its layout read by the adapter, its kernel built, the fit rules of ``attention/fit.py`` asked,
and one probe run on the layout's shapes; or the refusal ``(where, code, reason)``."""
from dataclasses import dataclass
from typing import Optional

from ..attention import AttentionKernel, build_attention
from ..attention.fit import misfit, probe, refusal
from .adapter import Layout, SwapError, original_class, type_key
from .discover import Entry

PROBE_BATCH = 1


@dataclass
class Plan:
    entry: Entry
    cfg: dict
    layout: Layout
    kernel: AttentionKernel
    prefix_kernel: Optional[AttentionKernel]


def _probe(kern: AttentionKernel, lay: Layout, prefix_kern) -> str:
    """The kernel once on random tensors shaped as the layout hands them (a grid kernel: the grid tokens, and the
    prefix queries over all tokens through the prefix kernel); '' or the reason it fails."""
    d = lay.head_dim if lay.head_dim is not None else 5
    on_grid = kern.needs_hw and lay.grid is not None
    nq, nk = (lay.grid[0] * lay.grid[1],) * 2 if on_grid else (lay.nq, lay.nk)
    why = probe(kern, lay.num_heads, d, nq, nk, hw=lay.grid if on_grid else None, scale=lay.scale,
                bias=bool(lay.bias) and kern.supports_bias, mask=bool(lay.masks) and kern.supports_mask,
                batch=PROBE_BATCH)
    if not why and on_grid and lay.prefix:
        why = probe(prefix_kern, lay.num_heads, d, lay.prefix, nk + lay.prefix, scale=lay.scale, batch=PROBE_BATCH)
    return why


def plan(model, entry: Entry, cfg: dict, prefix_attention: Optional[dict]):
    """A :class:`Plan`, or the refusal ``(where, code, reason)``; changes nothing."""
    where = f'{entry.path or "<model>"} ({type_key(original_class(entry.module))})'
    if entry.adapter is None:
        return where, 'layout', entry.unknown
    try:
        lay = entry.adapter.layout(entry.module, entry.path, model)
    except SwapError as e:
        return where, 'layout', str(e)
    if lay.grid is None and not lay.no_grid:  # the grid rule reads no_grid: an adapter that gives none says so
        lay.no_grid = 'its adapter gives no token grid'
    if not hasattr(type(entry.module), '_sf_original_class'):
        taken = [n for n in ('kernel', 'prefix_kernel') if hasattr(entry.module, n)]
        if taken:
            return where, 'layout', f'the module already has an attribute {taken[0]!r}, where the kernel would go'
    name = cfg['type']
    try:
        kern = build_attention(cfg, num_heads=lay.num_heads, head_dim=lay.head_dim)
    except (ValueError, TypeError) as e:
        xca = ' (XCA: the token count)' if lay.head_dim is None else ''
        return where, 'build', refusal(name, f'it cannot be built for this layout (num_heads={lay.num_heads}, '
                                             f'head_dim={lay.head_dim}{xca}): {e}')
    prefix_kern = None
    if kern.needs_hw and lay.prefix and prefix_attention is not None:
        prefix_kern = build_attention(prefix_attention, num_heads=lay.num_heads, head_dim=lay.head_dim)
        if prefix_kern.needs_hw:
            return where, 'prefix', (f"prefix_attention '{prefix_attention['type']}' needs the token grid itself; "
                                     'the class/register tokens are not on it')
    code, why = misfit(kern, lay, prefix_kernel=prefix_attention is not None)
    if not code:
        why = _probe(kern, lay, prefix_kern)
        code = 'probe' if why else ''
    if code:
        return where, code, refusal(name, why)
    return Plan(entry, cfg, lay, kern, prefix_kern)
