"""Putting a planned kernel into its module (a generated subclass of the module's own class, the kernel as a
child), taking it out again, and the per-module summary records."""
import logging
from typing import Dict, List

import torch
from torch import nn

from ..attention import normalize_cfg
from ..attention.fit import drops_bias
from .adapter import ADAPTERS, original_class, type_key
from .plan import Plan

_SWAPPED_CLASSES: Dict[type, type] = {}


def new_swapped(original: type):
    return swapped_class(original).__new__(swapped_class(original))


def _swapped_reduce_ex(self, protocol):
    # pickle / deepcopy by the original class (importable), not by the generated subclass
    return new_swapped, (type(self)._sf_original_class,), self.__dict__.copy()


def swapped_class(original: type) -> type:
    """The subclass of ``original`` whose forward is its adapter's (one per original class)."""
    cls = _SWAPPED_CLASSES.get(original)
    if cls is None:
        ad = ADAPTERS[type_key(original)]
        cls = type(f'SoftFree{original.__name__}', (original,), {
            'forward': ad.forward, '_sf_original_class': original, '_sf_adapter': ad,
            '__reduce_ex__': _swapped_reduce_ex, '__module__': 'softfree_mm.swap',
            '__doc__': f'{original.__name__} whose attention runs through a softfree_mm kernel ({ad.label}).'})
        _SWAPPED_CLASSES[original] = cls
    return cls


def _device_dtype(m: nn.Module):
    for p in m.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device('cpu'), torch.float32


def kernel_call(cfg: dict) -> str:
    """A kernel config as the swap summary shows it: 'poly(degree=3)'."""
    args = ', '.join(f'{k}={v!r}' for k, v in cfg.items() if k != 'type')
    return f"{cfg['type']}({args})" if args else cfg['type']


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


def install(model, plan: Plan) -> dict:
    """Swap the planned kernel in; returns the module's summary record."""
    m, lay, kern = plan.entry.module, plan.layout, plan.kernel
    if getattr(type(m), '_sf_original_class', None) is not None:  # swapped before: start from the original
        restore_attention(m)
    device, dtype = _device_dtype(m)
    m.__class__ = swapped_class(type(m))
    m.add_module('kernel', kern.to(device=device, dtype=dtype))
    if plan.prefix_kernel is not None:
        m.add_module('prefix_kernel', plan.prefix_kernel.to(device=device, dtype=dtype))
    m._sf_path = plan.entry.path or '<model>'
    m._sf_prefix = lay.prefix
    m._sf_grid = None
    if plan.entry.adapter.install is not None:
        plan.entry.adapter.install(m, plan.entry.path, model, lay)
    notes = [lay.where] if lay.where else []
    if drops_bias(kern, lay):
        # frozen, so that no unused parameter waits for a gradient (DDP); restore_attention unfreezes it
        frozen = [p for n, p in m.named_parameters(recurse=False) if 'relative_position_bias' in n and p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        m._sf_frozen = frozen
        notes.append(f'{lay.bias} left out (the kernel takes no bias; table kept, frozen)')
    if kern.takes_context:
        notes.append("context: the mean of the module's input over the kernel's tokens")
    if kern.needs_hw and lay.prefix:
        notes.append(f"{lay.prefix} prefix token(s) attend over all tokens through "
                     f"{kernel_call(normalize_cfg(plan.prefix_kernel.name))}; patch tokens through the kernel on "
                     'their grid')
    record = dict(index=plan.entry.index, path=m._sf_path, type=type_key(original_class(m)),
                  adapter=plan.entry.adapter.label, kernel=kernel_call(plan.cfg), notes=notes)
    m._sf_record = record
    return record


def swap_summary(model: nn.Module) -> List[dict]:
    """One record per swapped module of ``model``: index, path, type, adapter, kernel, notes."""
    return [m._sf_record for _, m in model.named_modules() if hasattr(type(m), '_sf_original_class')
            and hasattr(m, '_sf_record')]


def log_summary(model, records):
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
