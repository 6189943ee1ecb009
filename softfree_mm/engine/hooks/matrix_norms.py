"""Per kernel call: ``||A||_F`` and the Frobenius norm of the Jacobian of ``S -> A`` (the measures of arXiv
2410.18613; softmax bounds them by sqrt(N) and 2 sqrt(N)), for any kernel, read from what the kernel declares:

* its :meth:`~softfree_mm.attention.AttentionKernel.score_map` gives S and the row map S -> A (the Jacobian is block
  diagonal, a row's weights depending on that row's scores only) with an exact per-row closed form where the kernel
  has one; without one the rows' blocks come from autograd, one backward pass per key, for calls of at most
  ``max_autograd_keys`` keys;
* a kernel without a score map names why (``no_score_map``): :class:`NoScoreMap` carries that reason.
"""
from typing import Dict, Optional

import torch

from ...attention.base import no_autocast, work_dtype

# rows of the batch dimension handled at once keep (rows, h, Nq, Nk) near this many numbers
_CHUNK = 1 << 24
# the autograd Jacobian takes one backward pass through the map per key: beyond this many keys the call gets a note
AUTOGRAD_MAX_KEYS = 256


class NoScoreMap(ValueError):
    """The kernel's A is not a function of one per-pair score matrix (no Jacobian with respect to scores)."""


class JacobianSkipped(ValueError):
    """The kernel declares a score map without a closed form, and autograd over it would exceed the key budget."""


def no_score_map_reason(kernel) -> str:
    """Why ``kernel`` has no score Jacobian: its own words, or that it declares no score map."""
    return kernel.no_score_map or ('the kernel declares no score map (its _score_map returns None; a kernel whose '
                                   'weights are a row map of per-pair scores returns a ScoreMap)')


def keep_of(mask, q, k) -> torch.Tensor:
    """(B', h|1, Nq, Nk) float: 1 where a query may look at a key."""
    if mask is None:
        return torch.ones(1, 1, q.shape[2], k.shape[2], dtype=work_dtype(q), device=q.device)
    return mask.to(work_dtype(q))


def autograd_row_sq(weights, s: torch.Tensor) -> torch.Tensor:
    """(B', h, Nq): ``||d a_i / d s_i||_F^2`` of the row map ``weights`` at ``s``, by one backward pass per key
    column j: the gradient of column j summed over every row is, row by row, ``d a_ij / d s_i`` (a row of A depends
    on its own row of S only)."""
    s = s.detach().requires_grad_(True)
    total = torch.zeros(s.shape[:-1], dtype=s.dtype, device=s.device)
    with torch.enable_grad():
        a = weights(s)
        for j in range(s.shape[-1]):
            (g,) = torch.autograd.grad(a[..., j].sum(), s, retain_graph=True, allow_unused=True)
            if g is not None:
                total += (g * g).sum(-1)
    return total


def jacobian_row_sq(kernel, q, k, hw=None, scale=None, bias=None, mask=None,
                    max_autograd_keys: int = AUTOGRAD_MAX_KEYS) -> torch.Tensor:
    """(B', h, Nq): squared Frobenius norm of ``d a_i / d s_i`` for every row i, from the kernel's score map (its
    closed form, else autograd). Raises :class:`NoScoreMap` for kernels without one, :class:`JacobianSkipped` when
    autograd would take more than ``max_autograd_keys`` backward passes."""
    with torch.no_grad(), no_autocast(q):
        wd = work_dtype(q)
        sm = kernel.score_map(q.to(wd), k.to(wd), hw=hw, scale=scale, bias=None if bias is None else bias.to(wd),
                              mask=mask)
        if sm is None:
            raise NoScoreMap(f'{kernel.name}: {no_score_map_reason(kernel)}')
        if sm.row_jacobian_sq is not None:
            return sm.row_jacobian_sq(sm.scores)
    nk = sm.scores.shape[-1]
    if nk > max_autograd_keys:
        raise JacobianSkipped(f'{kernel.name}: no closed-form score Jacobian declared, and autograd would take one '
                              f'backward pass per key: Nk={nk} > max_autograd_keys={max_autograd_keys}')
    with no_autocast(q):
        return autograd_row_sq(sm.weights, sm.scores).detach()


def _masked_sum(rows_sq, query_valid):
    """(B', h, Nq) per-row squares -> (B', h) sums over the real query rows."""
    if query_valid is not None:
        rows_sq = rows_sq * query_valid.to(rows_sq.dtype).unsqueeze(1)
    return rows_sq.sum(-1)


def matrix_norms(kernel, inputs: dict, query_valid: Optional[torch.Tensor] = None, jacobian: bool = True,
                 max_autograd_keys: int = AUTOGRAD_MAX_KEYS):
    """Per attention problem and head: ``fro`` (B', h) = ||A||_F over the real query rows, ``jac`` (B', h) = the
    score Jacobian's Frobenius norm (None, with the reason in ``note``, when there is none), ``keys`` (B', h) mean
    valid keys per real row, ``rows`` (B',) real query rows. ``inputs``: q, k, hw, scale, bias, mask of one call;
    ``query_valid`` (B', Nq) bool (padding queries False)."""
    q, k = inputs['q'], inputs['k']
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    step = max(1, _CHUNK // max(1, h * nq * nk))
    fro, jac, keys = [], [], []
    note = None if jacobian else 'not asked for (jacobian=False)'
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
        if note is None:
            try:
                sq = jacobian_row_sq(kernel, part['q'], part['k'], inputs.get('hw'), part['scale'], part['bias'],
                                     part['mask'], max_autograd_keys=max_autograd_keys)
            except (NoScoreMap, JacobianSkipped) as e:
                note = str(e)
            else:
                jac.append(_masked_sum(sq.to(a.dtype), qv).sqrt())
    rows = query_valid.sum(-1) if query_valid is not None else torch.full((b,), nq)
    return dict(fro=torch.cat(fro), jac=None if note else torch.cat(jac), note=note, keys=torch.cat(keys),
                rows=rows)


def _rows(t, idx, n):
    if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == n and t.dim() == 4:
        return t[idx]
    return t


def call_stats(call, jacobian: bool = True, max_autograd_keys: int = AUTOGRAD_MAX_KEYS) -> Dict[str, object]:
    """Per head, averaged over the call's attention problems (images x windows): mean ||A||_F, mean score-Jacobian
    norm (None with a reason in ``jac_note`` when there is none), mean real query rows and mean valid keys per
    row."""
    qv = None
    if call.layout is not None and call.layout.query_pos is not None:
        reps = call.q.shape[0] // call.layout.groups
        qv = call.layout.query_valid().to(call.q.device).repeat(reps, 1)
    res = matrix_norms(call.kernel, dict(q=call.q, k=call.k, hw=call.hw, scale=call.scale, bias=call.bias,
                                         mask=call.mask), qv, jacobian=jacobian, max_autograd_keys=max_autograd_keys)
    out = dict(fro=res['fro'].mean(0), jac=None if res['jac'] is None else res['jac'].mean(0),
               rows=float(res['rows'].float().mean()), keys=float(res['keys'].mean()), complete=call.complete)
    if res['jac'] is None:
        out['jac_note'] = res['note']
    return out
