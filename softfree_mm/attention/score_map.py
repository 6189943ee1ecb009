"""How a kernel's weights depend on its scores: the declaration the score Jacobian (arXiv 2410.18613's
``||dA/dS||_F``) and the norms hook read, for a built-in kernel and a user's alike.

A kernel whose weights are a function of one per-pair score matrix returns a :class:`ScoreMap` from
``_score_map``: the scores S (B, h, Nq, Nk) and the map S -> A, where each row of A depends on the same row of S only
(so the Jacobian is block diagonal over rows), with an exact per-row closed form of ``||d a_i / d s_i||_F^2`` where it
has one; without one, callers differentiate the map. A kernel whose A is no such function says why in its
``no_score_map`` instead. The helpers below build the maps the built-in kernels share.
"""
from typing import Callable, Optional

import torch

from .base import no_autocast


class ScoreMap:
    """``A = weights(scores)``, row by row.

    Args:
        scores: S (B, h, Nq, Nk) in the working dtype (float32, float64 for float64 inputs), expanded to full size.
        weights: S -> A (B, h, Nq, Nk); row i of A may depend on row i of S only (and on anything that is no score).
        row_jacobian_sq: S -> (B, h, Nq), the squared Frobenius norm of ``d a_i / d s_i`` per row, exact; None when
            the kernel gives no closed form (then it is computed by autograd through ``weights``).
    """

    def __init__(self, scores: torch.Tensor, weights: Callable[[torch.Tensor], torch.Tensor],
                 row_jacobian_sq: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        self.scores, self.weights, self.row_jacobian_sq = scores, weights, row_jacobian_sq

    def matrix(self) -> torch.Tensor:
        """A itself, ``weights(scores)`` (autocast off: the map runs in the scores' dtype)."""
        with no_autocast(self.scores):
            return self.weights(self.scores)


def _keep_count(mask, s):
    """(B, h, Nq, 1) number of keys each row may look at, in the dtype of ``s``."""
    if mask is None:
        return torch.full((1, 1, 1, 1), float(s.shape[-1]), dtype=s.dtype, device=s.device)
    return mask.expand(s.shape).sum(-1, keepdim=True).to(s.dtype)


def _masked(x, mask):
    return x if mask is None else x.masked_fill(~mask, 0.0)


def masked_softmax(logits: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax over the last dim with masked entries at -inf; a row with no valid entry gives zeros (and finite
    gradients, where a softmax of -inf only would give NaN). Call it in fp32 / fp64."""
    if mask is None:
        return torch.softmax(logits, dim=-1)
    any_valid = mask.any(-1, keepdim=True)
    logits = logits.masked_fill(~mask, float('-inf')).masked_fill(~any_valid, 0.0)
    return torch.softmax(logits, dim=-1) * any_valid.to(logits.dtype)


def softmax_map(s: torch.Tensor, mask: Optional[torch.Tensor]) -> ScoreMap:
    """``A = softmax(S)`` over the keys a row may look at (a row that keeps none is zero);
    ``J_i = diag(a_i) - a_i a_i^T``, whose squared norm is ``sum a^2 - 2 sum a^3 + (sum a^2)^2``."""

    def weights(x):
        return masked_softmax(x, mask)

    def row_jacobian_sq(x):
        a = weights(x)
        a2 = (a * a).sum(-1)
        return a2 - 2.0 * (a * a * a).sum(-1) + a2 * a2
    return ScoreMap(s, weights, row_jacobian_sq)


def pointwise_map(s: torch.Tensor, mask: Optional[torch.Tensor], f: Callable, df: Callable) -> ScoreMap:
    """``a_ij = f(s_ij)`` on the keys a row may look at, 0 elsewhere: J is diagonal, its squared norm per row is
    ``sum_j f'(s_ij)^2`` over those keys."""

    def row_jacobian_sq(x):
        d = _masked(df(x), mask)
        return (d * d).sum(-1)
    return ScoreMap(s, lambda x: _masked(f(x), mask), row_jacobian_sq)


def row_normalised_map(s: torch.Tensor, mask: Optional[torch.Tensor], eps: float = 0.0, floor: float = 0.0,
                       offset: Optional[torch.Tensor] = None) -> ScoreMap:
    """``a_ij = s_ij / (sum_j s_ij + eps)`` over the keys a row may look at (the denominator at least ``floor``), plus
    ``offset``, a term that is no function of the scores (a local convolution's weights). Per row with n keys and
    that denominator z: ``||J_i||_F^2 = (n - 2 sum a + n sum a^2) / z^2``, a without the offset."""

    def denominator(x):
        z = x.sum(-1, keepdim=True)
        z = z + eps if eps else z
        return z.clamp_min(floor) if floor else z

    def weights(x):
        x = _masked(x, mask)
        a = x / denominator(x)
        return a if offset is None else a + offset

    def row_jacobian_sq(x):
        x = _masked(x, mask)
        z = denominator(x)
        a = x / z
        n = _keep_count(mask, x)
        return ((n - 2.0 * a.sum(-1, keepdim=True) + n * (a * a).sum(-1, keepdim=True)) / (z * z)).squeeze(-1)
    return ScoreMap(s, weights, row_jacobian_sq)
