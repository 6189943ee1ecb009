"""Per kernel call: ``||A||_F`` and the Frobenius norm of the Jacobian of ``S -> A`` (the measures of arXiv
2410.18613; softmax bounds them by sqrt(N) and 2 sqrt(N)), exact closed forms per row (the Jacobian is block
diagonal, a row's weights depending on that row's scores only):

* softmax, synthesizer (``J = diag(a) - a a^T``): ``sum a^2 - 2 sum a^3 + (sum a^2)^2``;
* pointwise ``a_ij = f(s_ij)`` (poly, relu, sigmoid; J diagonal): ``sum_j f'(s_ij)^2`` over the valid keys;
* row-normalised ``a = s / (sum s + eps)`` (linear, taylor): ``(n - 2 sum a + n sum a^2) / (sum s + eps)^2``;
* inline (its local residual does not depend on s): ``(n - 1) / n^2``.

Kernels whose A is not a function of one per-pair score matrix raise :class:`NoScoreMap` with the reason.
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ...attention.base import default_scale, key_count, scores, work_dtype
from ...attention.inline import InLineAttention
from ...attention.linear import LinearAttention, TaylorAttention
from ...attention.pointwise import ReluAttention, SigmoidAttention
from ...attention.poly import PolyAttention
from ...attention.softmax import SoftmaxAttention
from ...attention.synthesizer import SynthesizerAttention

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
