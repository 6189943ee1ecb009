"""Attention norms as N grows: the theory for poly on Gaussian inputs, and ``||A||_F`` / the score-Jacobian norm of
freshly built kernels over a range of token counts (the per-call measures of the norms hook, ``matrix_norms``)."""
import math
from typing import Dict, List, Sequence

import torch

from ..attention import build_attention, kernel_label, normalize_cfg
from ..engine.hooks.matrix_norms import matrix_norms


# ---------------------------------------------------------------------------------------------- theory
def gaussian_score_moment(order: int, head_dim: int) -> float:
    """E[S^order] for S = q.k / sqrt(d), q, k independent N(0, I_d) (order even):
    (order - 1)!! * prod_{i < order/2} (d + 2i) / d^(order/2)."""
    if order % 2:
        return 0.0
    p = order // 2
    dfact = math.prod(range(order - 1, 0, -2)) if order > 1 else 1
    return dfact * math.prod(head_dim + 2 * i for i in range(p)) / head_dim ** p


def poly_theory(n: int, degree: int, head_dim: int) -> Dict[str, float]:
    """Expected growth of poly with c = 1/sqrt(N) on unit Gaussian q, k: ||A||_F ~ sqrt(N E[S^2p]),
    ||J||_F ~ sqrt(N p^2 E[S^(2p-2)]): both grow like sqrt(N)."""
    return dict(fro=math.sqrt(n * gaussian_score_moment(2 * degree, head_dim)),
                jac=math.sqrt(n * degree ** 2 * gaussian_score_moment(2 * degree - 2, head_dim)))


def norms_vs_n(kernels: Sequence, sides: Sequence[int], heads: int = 4, head_dim: int = 32, batch: int = 2,
               std: float = 1.0, seed: int = 0) -> List[dict]:
    """||A||_F and the score-Jacobian norm at initialisation, for each kernel and N = side^2 tokens on a side x side
    grid: q, k ~ N(0, std^2) (one draw per N, shared by every kernel), kernels freshly built with their default
    initialisation. Each row: kernel, n, fro, jac (None with ``note`` when there is none or the kernel refused)."""
    rows = []
    for side in sides:
        n = side * side
        gen = torch.Generator().manual_seed(seed + n)
        q = torch.randn(batch, heads, n, head_dim, generator=gen) * std
        k = torch.randn(batch, heads, n, head_dim, generator=gen) * std
        for spec in kernels:
            cfg = normalize_cfg(spec)
            label = kernel_label(cfg)
            torch.manual_seed(seed)
            row = dict(kernel=label, n=n, fro=None, jac=None, note='')
            try:
                kern = build_attention(cfg, num_heads=heads, head_dim=head_dim).eval()
                res = matrix_norms(kern, dict(q=q, k=k, hw=(side, side), scale=None, bias=None, mask=None))
            except (ValueError, RuntimeError) as e:
                row['note'] = ' '.join(str(e).split())
            else:
                row['fro'] = float(res['fro'].mean())
                if res['jac'] is not None:
                    row['jac'] = float(res['jac'].mean())
                else:
                    row['note'] = res['note']
            rows.append(row)
    return rows
