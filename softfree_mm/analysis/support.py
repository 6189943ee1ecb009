"""Which kernel runs in which backbone, and under which set-up: the README's backbone x kernel table.

Each cell is computed, not written: the tiny variant every backbone family declares (``Family.tiny``) is built with
the kernel and run forward on an odd-sized image. A refused build is retried with the set-up the family declares
for kernels its own layout refuses (``Family.fit``: global windows for Swin and CSwin, no spatial reduction for PVT),
which is what the cell then names.
"""
from typing import Dict, List, Tuple

import torch

from ..attention import list_attentions
from ..models.family import FAMILIES


def _try(cls, kwargs, size) -> Tuple[bool, str]:
    try:
        model = cls(**kwargs).eval()
        with torch.no_grad():
            model(torch.randn(1, 3, *size))
        return True, ''
    except (ValueError, TypeError, KeyError) as e:
        return False, str(e).splitlines()[0]


def kernel_cfg(kernel: str):
    """The config the support table builds ``kernel`` with (synthesizer mixed with dot products, to take any
    length its table covers)."""
    return dict(type=kernel, mix=True) if kernel == 'synthesizer' else kernel


def setup(cls, kernel: str, size=(67, 93)) -> Tuple[str, dict]:
    """(cell, build arguments) of ``kernel`` in the backbone family ``cls``: ('yes', its tiny preset with the
    kernel), (the family's fit label, the preset under its fit set-up), or ('no', {})."""
    tiny, fit = cls.family.tiny, cls.family.fit
    args = dict(tiny, attn_cfg=kernel_cfg(kernel))
    if _try(cls, args, size)[0]:
        return 'yes', args
    if fit is not None and _try(cls, dict(args, **fit[1]), size)[0]:
        return fit[0], dict(args, **fit[1])
    return 'no', {}


def support_matrix(size=(67, 93), kernels=None, families=None) -> Dict[str, Dict[str, str]]:
    """Backbone class name -> kernel -> 'yes', the family's fit label, or 'no'; every declared family (or those
    named in ``families``) against every registered kernel (or ``kernels``)."""
    kernels = kernels or list_attentions()
    return {name: {k: setup(FAMILIES[name], k, size)[0] for k in kernels} for name in families or list(FAMILIES)}


def markdown(table: Dict[str, Dict[str, str]]) -> str:
    """Kernels as rows, backbones as columns."""
    backbones = list(table)
    kernels: List[str] = list(table[backbones[0]])
    lines = ['| kernel | ' + ' | '.join(b.replace('SoftFree', '') for b in backbones) + ' |',
             '|---' * (len(backbones) + 1) + '|']
    for k in kernels:
        lines.append(f'| `{k}` | ' + ' | '.join(table[b][k] for b in backbones) + ' |')
    return '\n'.join(lines)


if __name__ == '__main__':  # python -m softfree_mm.analysis.support
    import softfree_mm  # noqa: F401

    print(markdown(support_matrix()))
