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


def support_matrix(size=(67, 93), kernels=None, families=None) -> Dict[str, Dict[str, str]]:
    """Backbone class name -> kernel -> 'yes', the family's fit label, or 'no'; every declared family (or those
    named in ``families``) against every registered kernel (or ``kernels``)."""
    kernels = kernels or list_attentions()
    table = {}
    for name in families or list(FAMILIES):
        cls = FAMILIES[name]
        tiny, fit = cls.family.tiny, cls.family.fit
        row = {}
        for k in kernels:
            cfg = dict(type=k, mix=True) if k == 'synthesizer' else k
            if _try(cls, dict(tiny, attn_cfg=cfg), size)[0]:
                row[k] = 'yes'
            elif fit is not None and _try(cls, dict(tiny, attn_cfg=cfg, **fit[1]), size)[0]:
                row[k] = fit[0]
            else:
                row[k] = 'no'
        table[name] = row
    return table


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
