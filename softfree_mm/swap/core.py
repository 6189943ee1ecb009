"""``swap_attention``: discover the attention modules, select, plan each (refusing all-or-nothing), install."""
from torch import nn

from .adapter import SwapError, supported_layouts
from .discover import assign_cfgs, checked_cfg, discover, select
from .install import install, log_summary
from .plan import Plan, plan


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
        prefix_attention = checked_cfg(prefix_attention, 'prefix_attention')
    entries = discover(model)
    if not entries:
        raise SwapError(f'swap_attention: no attention module found in {type(model).__name__}; supported layouts: '
                        f'{", ".join(supported_layouts())}')
    selected = select(entries, layers)
    cfgs = assign_cfgs(attn_cfg, entries, selected)

    plans, problems = [], []
    for entry, cfg in zip(selected, cfgs):
        plan_or_refusal = plan(model, entry, cfg, prefix_attention)
        if isinstance(plan_or_refusal, Plan):
            plans.append(plan_or_refusal)
        else:
            problems.append(plan_or_refusal)
    if problems:
        head = (f'swap_attention: {len(problems)} of {len(selected)} selected attention module(s) cannot be swapped '
                '(nothing was changed); select others with layers=..., or give them another attn_cfg:')
        raise SwapError('\n  '.join([head] + [f'{p}: {why}' for p, _, why in problems]), problems)

    records = [install(model, p) for p in plans]
    log_summary(model, records)
    return model
