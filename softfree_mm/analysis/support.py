"""Which kernel runs in which backbone, and under which set-up: the README's backbone x kernel table.

Each cell is computed, not written: a tiny variant of the backbone is built with the kernel and run forward on an
odd-sized image. A refused build is retried with the set-up that makes the kernel fit (global windows for Swin and
CSwin, no spatial reduction for PVT), which is what the cell then names.
"""
from typing import Dict, List, Tuple

import torch

from ..attention import list_attentions

BN = dict(type='BN')
TINY = {
    'SoftFreeXCiT': dict(arch='t12', embed_dims=32, num_heads=4, depth=4, out_indices=(0, 1, 2, 3), norm_cfg=BN),
    'SoftFreePVT': dict(arch='tiny', embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1)),
    'SoftFreePVTv2': dict(arch='b0', embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1)),
    'SoftFreeSwin': dict(arch=dict(embed_dims=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4))),
    'SoftFreeCSWin': dict(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4),
                                    stripe_widths=(1, 2, 4, 7))),
}
FITS = {
    'SoftFreeSwin': ('global windows', dict(global_window=True)),
    'SoftFreeCSWin': ('global stripes', dict(global_window=True)),
    'SoftFreePVT': ('sr_ratios=(1,1,1,1)', dict(sr_ratios=(1, 1, 1, 1))),
    'SoftFreePVTv2': ('sr_ratios=(1,1,1,1)', dict(sr_ratios=(1, 1, 1, 1))),
}


def _try(cls, kwargs, size) -> Tuple[bool, str]:
    try:
        model = cls(**kwargs).eval()
        with torch.no_grad():
            model(torch.randn(1, 3, *size))
        return True, ''
    except (ValueError, TypeError, KeyError) as e:
        return False, str(e).splitlines()[0]


def support_matrix(size=(67, 93), kernels=None) -> Dict[str, Dict[str, str]]:
    from .. import models

    kernels = kernels or list_attentions()
    table = {}
    for bb, tiny in TINY.items():
        cls = getattr(models, bb)
        row = {}
        for k in kernels:
            cfg = dict(type=k, mix=True) if k == 'synthesizer' else k
            ok, why = _try(cls, dict(tiny, attn_cfg=cfg), size)
            if ok:
                row[k] = 'yes'
                continue
            if bb in FITS:
                label, extra = FITS[bb]
                ok2, _ = _try(cls, dict(tiny, attn_cfg=cfg, **extra), size)
                if ok2:
                    row[k] = label
                    continue
            row[k] = 'no'
        table[bb] = row
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
