"""Confusions (InLine, seed 003): pairs of distinct queries that an attention function maps to the same row.

InLine counts, per image, the pairs of queries ``q_i != q_j`` whose attention distributions are equal up to an L2
distance below 1e-3 (two float vectors are rarely exactly equal). Plain linear attention divides by the row sum, so
``q`` and ``2 q`` (and, with relu features, any two queries with the same positive part up to scale) give the same
row; softmax and InLine do not. A pair counts when its rows lie closer than ``threshold`` and its queries at least
``query_threshold`` apart; pairs are counted within each attention problem (a window's queries share its keys) and
summed per head. Distances are computed in float64 (the float32 Gram-matrix form loses about 1e-4 to cancellation,
near the threshold).
"""
from typing import Optional

import torch

DEFAULT_THRESHOLD = 1e-3


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
    nq = a.shape[-2]
    upper = torch.ones(nq, nq, dtype=torch.bool, device=a.device).triu(1)
    confused, pairs = [], []
    for h in range(a.shape[1]):  # one head at a time bounds the (B', Nq, Nq) distance matrices
        close = pair_distances(a[:, h]) < threshold
        distinct = pair_distances(q[:, h]) >= query_threshold if q is not None else torch.ones_like(close)
        ok = upper & distinct
        if query_valid is not None:
            v = query_valid.to(a.device)
            ok = ok & v.unsqueeze(-1) & v.unsqueeze(-2)
        confused.append((close & ok).sum((-2, -1)))
        pairs.append(ok.sum((-2, -1)))
    return torch.stack(confused, 1), torch.stack(pairs, 1)


def call_confusions(call, image: int, threshold: float = DEFAULT_THRESHOLD,
                    query_threshold: float = DEFAULT_THRESHOLD):
    """Per head, summed over the image's attention problems: (confused (h,), pairs (h,), queries)."""
    rows = call.image_rows(image)
    a = call.matrix(rows)
    qv = None if call.layout is None or call.layout.query_pos is None else call.layout.query_valid()
    c, p = confusions(a, call.q[rows], threshold, query_threshold, qv)
    queries = int(qv.sum()) if qv is not None else a.shape[0] * a.shape[2]
    return c.sum(0), p.sum(0), queries
