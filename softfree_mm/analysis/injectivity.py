"""Confusions (InLine, NeurIPS 2024): pairs of distinct queries that an attention function maps to the same row.

Plain linear attention divides by the row sum, so ``q`` and ``2 q`` give the same row; softmax and InLine do not.
Pairs are counted within each attention problem (a window's queries share its keys) and summed per head; distances
are float64, as float32's Gram-matrix form loses about 1e-4 to cancellation, near the 1e-3 threshold.
"""
from typing import Optional

import torch

DEFAULT_THRESHOLD = 1e-3
_PAIR_BUDGET = 1 << 23  # query pairs handled at once (float64 distances: 64 MiB)


def pair_distances(x: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (..., N, N) L2 distances, in float64."""
    x = x.double()
    return torch.cdist(x, x)


def confusions(a: torch.Tensor, q: Optional[torch.Tensor] = None, threshold: float = DEFAULT_THRESHOLD,
               query_threshold: float = DEFAULT_THRESHOLD, query_valid: Optional[torch.Tensor] = None):
    """Confused pairs per attention problem and head.

    Args:
        a: (B', h, Nq, Nk) attention rows.
        q: (B', h, Nq, d) the queries (None: every pair of distinct positions counts as distinct queries).
        threshold: rows closer than this (L2) are the same distribution.
        query_threshold: queries at least this far apart (L2) are distinct.
        query_valid: (B', Nq) bool, False for padding queries (left out).
    Returns:
        (confused, pairs): (B', h) long tensors, confused pairs and distinct-query pairs.
    """
    if threshold <= 0 or query_threshold < 0:
        raise ValueError(f'threshold must be > 0 and query_threshold >= 0, got {threshold}, {query_threshold}')
    bp, h, nq = a.shape[0], a.shape[1], a.shape[-2]
    upper = torch.ones(nq, nq, dtype=torch.bool, device=a.device).triu(1)
    ok = upper.expand(bp, h, nq, nq)
    if query_valid is not None:
        v = query_valid.to(a.device)
        ok = ok & (v.unsqueeze(-1) & v.unsqueeze(-2)).unsqueeze(1)
    flat_a, flat_q, flat_ok = a.reshape(bp * h, nq, -1), None if q is None else q.reshape(bp * h, nq, -1), \
        ok.reshape(bp * h, nq, nq)
    step = max(1, _PAIR_BUDGET // (nq * nq))  # bounds the float64 (rows, Nq, Nq) distance matrices
    confused, pairs = [], []
    for start in range(0, bp * h, step):
        sl = slice(start, start + step)
        pair_ok = flat_ok[sl]
        if flat_q is not None:
            pair_ok = pair_ok & (pair_distances(flat_q[sl]) >= query_threshold)
        confused.append((pair_ok & (pair_distances(flat_a[sl]) < threshold)).sum((-2, -1)))
        pairs.append(pair_ok.sum((-2, -1)))
    return torch.cat(confused).view(bp, h), torch.cat(pairs).view(bp, h)


def call_confusions(call, image: int, threshold: float = DEFAULT_THRESHOLD,
                    query_threshold: float = DEFAULT_THRESHOLD):
    """Per head, summed over the image's attention problems: (confused (h,), pairs (h,), queries)."""
    rows = call.image_rows(image)
    a = call.matrix(rows)
    qv = None if call.layout is None or call.layout.query_pos is None else call.layout.query_valid()
    c, p = confusions(a, call.q[rows], threshold, query_threshold, qv)
    queries = int(qv.sum()) if qv is not None else a.shape[0] * a.shape[2]
    return c.sum(0), p.sum(0), queries
