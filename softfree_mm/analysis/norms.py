"""Frobenius norms of attention matrices and of their Jacobians with respect to the scores (the polynomial-attention paper's measures).

Rethinking Softmax (arXiv 2410.18613) argues from two numbers per attention layer: ``||A||_F`` (softmax bounds it
by sqrt(N), each row having L2 norm <= 1) and the Frobenius norm of the Jacobian of the map ``S -> A`` (softmax:
at most 2 sqrt(N)). A row's weights depend only on that row's scores, so the Jacobian is block diagonal and
``||J||_F^2 = sum_i ||d a_i / d s_i||_F^2``. Exact closed forms per row:

* softmax (and the synthesizer, a softmax of its logits): ``J = diag(a) - a a^T``, so
  ``||J||_F^2 = sum a^2 - 2 sum a^3 + (sum a^2)^2``;
* pointwise kernels ``a_ij = f(s_ij)`` (poly ``c s^p``, relu ``relu(s)/N``, sigmoid ``sigmoid(s - log N)``): J is
  diagonal, ``||J||_F^2 = sum_j f'(s_ij)^2`` over the valid keys;
* row-normalised feature kernels ``a = s / (sum s + eps)`` with ``s = phi(q).phi(k)`` (linear; taylor with
  ``s = 1 + q^.k^``): ``d a_j / d s_k = (delta_jk - a_j) / (sum s + eps)``, so
  ``||J||_F^2 = (n - 2 sum a + n sum a^2) / (sum s + eps)^2``, n valid keys;
* inline: ``a = s / n + (1 - mean s) / n`` with ``s = scale * phi(q).phi(k)`` (the local residual does not depend on
  s): ``||J||_F^2 = (n - 1) / n^2``.

Other kernels (efficient, soft, nystrom, performer, cosformer, flatten) build A from factors that are not one
per-pair score matrix here: :func:`jacobian_row_sq` raises :class:`NoScoreMap` naming the reason instead of
inventing a number. Everything runs in float32 (float64 for float64 inputs) without autograd.
"""
import math
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..attention import build_attention, normalize_cfg
from ..attention.base import default_scale, key_count, scores, work_dtype
from ..attention.inline import InLineAttention
from ..attention.linear import LinearAttention, TaylorAttention
from ..attention.pointwise import ReluAttention, SigmoidAttention
from ..attention.poly import PolyAttention
from ..attention.softmax import SoftmaxAttention
from ..attention.synthesizer import SynthesizerAttention

# rows of the batch dimension handled at once keep (rows, h, Nq, Nk) near this many numbers
_CHUNK = 1 << 24


class NoScoreMap(ValueError):
    """The kernel's A is not a function of one per-pair score matrix (no Jacobian with respect to scores)."""


NO_SCORE_MAP = {
    'efficient': 'A = softmax over channels of q times softmax over tokens of k: no per-pair score map',
    'soft': 'A = K(Q, L) pinv(K(L, L)) K(L, K), a Nystrom product of Gaussian kernels: no per-pair score map',
    'nystrom': 'A is a product of three landmark softmaxes: no per-pair score map',
    'performer': 'A is built from random features whose stabilisers rescale the scores: no closed form here',
    'cosformer': 'A re-weights feature products by position: no closed form here',
    'flatten': 'A is built from learned focused features: no closed form here',
}


def keep_of(mask, q, k) -> torch.Tensor:
    """(B', h|1, Nq, Nk) float: 1 where a query may look at a key."""
    if mask is None:
        return torch.ones(1, 1, q.shape[2], k.shape[2], dtype=work_dtype(q), device=q.device)
    return mask.to(work_dtype(q))


def _row_normalised_sq(a, s_sum, keep):
    n = keep.sum(-1)
    return (n - 2.0 * a.sum(-1) + n * (a * a).sum(-1)) / (s_sum * s_sum)


def jacobian_row_sq(kernel, q, k, hw=None, scale=None, bias=None, mask=None, a=None) -> torch.Tensor:
    """(B', h, Nq): squared Frobenius norm of ``d a_i / d s_i`` for every row i (exact, closed form).

    ``a`` is the kernel's A for these inputs when already computed. Raises :class:`NoScoreMap` for kernels without
    a per-pair score map.
    """
    with torch.no_grad():
        wd = work_dtype(q)
        q, k = q.to(wd), k.to(wd)
        bias = None if bias is None else bias.to(wd)
        if isinstance(kernel, (SoftmaxAttention, SynthesizerAttention)):
            if a is None:
                a = kernel.attention_matrix(q, k, hw=hw, scale=scale, bias=bias, mask=mask)
            a2 = (a * a).sum(-1)
            return a2 - 2.0 * (a * a * a).sum(-1) + a2 * a2
        keep = keep_of(mask, q, k)
        if isinstance(kernel, (PolyAttention, ReluAttention, SigmoidAttention)):
            s = scores(q, k, default_scale(scale, q.shape[-1], q), bias)
            n = key_count(mask, q, k)
            if isinstance(kernel, PolyAttention):
                c = n.rsqrt() if kernel.scale == 'sqrt_n' else kernel.scale
                d = c * kernel.degree * s.pow(kernel.degree - 1)
            elif isinstance(kernel, ReluAttention):
                d = (s > 0).to(s.dtype) / n
            else:
                sig = torch.sigmoid(s - torch.log(n))
                d = sig * (1.0 - sig)
            d = d * keep
            return (d * d).sum(-1)
        if isinstance(kernel, LinearAttention):
            s = kernel.phi(q) @ kernel.phi(k).transpose(-2, -1) * keep
            s_sum = s.sum(-1, keepdim=True) + kernel.eps
            return _row_normalised_sq(s / s_sum, s_sum.squeeze(-1), keep)
        if isinstance(kernel, TaylorAttention):
            s = (1.0 + F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)).clamp_min(0.0) * keep
            s_sum = s.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
            return _row_normalised_sq(s / s_sum, s_sum.squeeze(-1), keep)
        if isinstance(kernel, InLineAttention):
            n = keep.sum(-1).expand(q.shape[0], q.shape[1], q.shape[2])
            return (n - 1.0).clamp_min(0.0) / (n * n).clamp_min(1.0)
    raise NoScoreMap(f"{kernel.name}: {NO_SCORE_MAP.get(kernel.name, 'no closed-form score Jacobian for this kernel')}")


def has_score_map(kernel) -> bool:
    return isinstance(kernel, (SoftmaxAttention, SynthesizerAttention, PolyAttention, ReluAttention,
                               SigmoidAttention, LinearAttention, TaylorAttention, InLineAttention))


def no_score_map_reason(kernel) -> str:
    return NO_SCORE_MAP.get(kernel.name, 'no closed-form score Jacobian for this kernel')


def _masked_sum(rows_sq, query_valid):
    """(B', h, Nq) per-row squares -> (B', h) sums over the real query rows."""
    if query_valid is not None:
        rows_sq = rows_sq * query_valid.to(rows_sq.dtype).unsqueeze(1)
    return rows_sq.sum(-1)


def matrix_norms(kernel, inputs: dict, query_valid: Optional[torch.Tensor] = None, jacobian: bool = True):
    """Per attention problem and head: ``fro`` (B', h) = ||A||_F over the real query rows, ``jac`` (B', h) = the
    score Jacobian's Frobenius norm (None when the kernel has no score map), ``keys`` (B', h) mean valid keys per
    real row, ``rows`` (B',) real query rows. ``inputs``: q, k, hw, scale, bias, mask of one call;
    ``query_valid`` (B', Nq) bool (padding queries False)."""
    q, k = inputs['q'], inputs['k']
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    step = max(1, _CHUNK // max(1, h * nq * nk))
    fro, jac, keys = [], [], []
    do_jac = jacobian and has_score_map(kernel)
    for start in range(0, b, step):
        idx = slice(start, min(b, start + step))
        part = {key: _rows(val, idx, b) for key, val in inputs.items() if key in ('q', 'k', 'bias', 'mask', 'scale')}
        qv = None if query_valid is None else query_valid[idx]
        with torch.no_grad():
            a = kernel.attention_matrix(part['q'], part['k'], hw=inputs.get('hw'), scale=part['scale'],
                                        bias=part['bias'], mask=part['mask'])
            a = a.float() if a.dtype != torch.float64 else a
            fro.append(_masked_sum((a * a).sum(-1), qv).sqrt())
            kc = keep_of(part['mask'], part['q'], part['k']).sum(-1).expand(a.shape[0], h, nq)
            rows = (qv.sum(-1) if qv is not None else torch.full((a.shape[0],), nq, device=a.device)).to(a.dtype)
            keys.append(_masked_sum(kc.to(a.dtype), qv) / rows.clamp_min(1).unsqueeze(-1))
            if do_jac:
                sq = jacobian_row_sq(kernel, part['q'], part['k'], inputs.get('hw'), part['scale'], part['bias'],
                                     part['mask'], a=a)
                jac.append(_masked_sum(sq.to(a.dtype), qv).sqrt())
    rows = query_valid.sum(-1) if query_valid is not None else torch.full((b,), nq)
    return dict(fro=torch.cat(fro), jac=torch.cat(jac) if do_jac else None, keys=torch.cat(keys), rows=rows)


def _rows(t, idx, n):
    if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == n and t.dim() == 4:
        return t[idx]
    return t


def call_stats(call, jacobian: bool = True) -> Dict[str, object]:
    """Per head, averaged over the call's attention problems (images x windows): mean ||A||_F, mean score-Jacobian
    norm (None with a reason when the kernel has none), mean real query rows and mean valid keys per row."""
    qv = None
    if call.layout is not None and call.layout.query_pos is not None:
        reps = call.q.shape[0] // call.layout.groups
        qv = call.layout.query_valid().to(call.q.device).repeat(reps, 1)
    res = matrix_norms(call.kernel, dict(q=call.q, k=call.k, hw=call.hw, scale=call.scale, bias=call.bias,
                                         mask=call.mask), qv, jacobian=jacobian)
    out = dict(fro=res['fro'].mean(0), jac=None if res['jac'] is None else res['jac'].mean(0),
               rows=float(res['rows'].float().mean()), keys=float(res['keys'].mean()), complete=call.complete)
    if res['jac'] is None:
        out['jac_note'] = (f'{call.kernel.name}: {no_score_map_reason(call.kernel)}' if jacobian
                           else 'not asked for (jacobian=False)')
    return out


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
            except NoScoreMap as e:
                row['note'] = str(e)
            except (ValueError, RuntimeError) as e:
                row['note'] = ' '.join(str(e).split())
            else:
                row['fro'] = float(res['fro'].mean())
                if res['jac'] is not None:
                    row['jac'] = float(res['jac'].mean())
                else:
                    row['note'] = f'{kern.name}: {no_score_map_reason(kern)}'
            rows.append(row)
    return rows


def kernel_label(cfg) -> str:
    """'poly' / dict(type='poly', degree=1) -> 'poly' / 'poly:degree=1' (the tools' kernel syntax)."""
    cfg = normalize_cfg(cfg)
    args = ','.join(f'{k}={v}' for k, v in cfg.items() if k != 'type')
    return cfg['type'] + (f':{args}' if args else '')
