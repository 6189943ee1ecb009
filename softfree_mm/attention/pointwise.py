"""Pointwise activations in place of softmax, normalised by the number of keys a row may look at.

``relu``: ``A = relu(S) / N * keep`` (Wortsman et al. 2023, ReLU divided by the sequence length).
``sigmoid``: ``A = sigmoid(S - log N) * keep`` (Apple 2024, sigmoid attention with bias -log N).

``S = s * q @ k^T (+ bias)``; N counts the True entries of the row's mask (all keys without a mask), so a
masked key gives exactly the result of deleting it. A row with no valid key is a zero row. Where one (batch, head)
matrix is larger than a tile, forward and backward run in tiles (``blocked.py``) and never hold ``A``; on CUDA the
explicit matrix within a memory budget and the fused Triton kernel beyond it (``dispatch.py``).

Args (both): ``impl`` ('auto' | 'explicit' | 'tiled' | 'fused', see ``dispatch.py``; SOFTFREE_ATTN_IMPL overrides
it) and ``explicit_mib`` (on CUDA with 'auto': the memory the explicit matrix may take, MiB; None: the smaller of
512 MiB and an eighth of the free GPU memory).
"""
import math

import torch

from . import ATTENTION, dispatch
from .base import AttentionKernel, cast_back, default_scale, key_count, scores, upcast, no_autocast, work_dtype
from .blocked import memory as blocked_memory, pointwise_attention
from .score_map import pointwise_map


class _PointwiseAttention(AttentionKernel):
    supports_bias = True
    supports_mask = True
    complexity = 'quadratic'
    kind = ''

    def __init__(self, num_heads=None, head_dim=None, impl='auto', explicit_mib=None):
        super().__init__(num_heads, head_dim)
        self.impl = dispatch.check_impl(self.name, impl)
        self.explicit_mib = dispatch.check_explicit_mib(self.name, explicit_mib)
        dispatch.forced()  # a bad SOFTFREE_ATTN_IMPL is refused at build time

    def extra_repr(self) -> str:
        return super().extra_repr() + ('' if self.impl == 'auto' else f', impl={self.impl!r}')

    def _activation(self, s, n):
        raise NotImplementedError

    def _derivative(self, s, n):
        """d activation / d s, elementwise."""
        raise NotImplementedError

    # Nq x Nk tensors the explicit matrix keeps for backward: the scores and the weights (sigmoid: the weights)
    kept_per_score = 2

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return nq * nk * (d + dv)  # S = q k^T, A @ v

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        return blocked_memory(nq, nk, d, dv, self.kept_per_score, masked, key_mask)

    def _tiled(self, q, k, v, scale, bias, mask):
        """``A @ v`` in tiles; inputs in the working dtype."""
        raise NotImplementedError

    def _row_terms(self, q, k, mask):
        """(coef, shift) of the fused kernel: floats without a mask, per-row tensors with one."""
        raise NotImplementedError

    def path(self, q, k, v, bias=None, mask=None) -> str:
        """'explicit' | 'tiled' | 'fused': the path of a call (``dispatch.py``)."""
        return dispatch.choose(dispatch.resolve(self.impl), q, k, self.explicit_mib)

    def describe_path(self, q, k, v, bias=None, mask=None) -> str:
        return self.path(q, k, v, bias, mask)

    def _score_map(self, q, k, hw, scale, bias, mask):
        q, k = upcast(q, k)
        with no_autocast(q):  # activation and normaliser in fp32 (fp64 for fp64 inputs)
            s = scores(q, k, default_scale(scale, q.shape[-1], q), bias)
            n = key_count(mask, q, k)
            return pointwise_map(s, mask, lambda x: self._activation(x, n), lambda x: self._derivative(x, n))

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def _forward(self, q, k, v, hw, scale, bias, mask):
        path = self.path(q, k, v, bias, mask)
        if path == 'fused':  # in the inputs' dtype; scores and activation in fp32 inside the kernel
            from .fused_pointwise import attend
            with no_autocast(v):
                coef, shift = self._row_terms(q, k, mask)
                out = attend(q, k, v, self.kind, 1, default_scale(scale, q.shape[-1], q), coef, bias=bias,
                             shift=shift, mask=mask)
            if out is not None:
                return cast_back(out, v.dtype)
            path = 'tiled'
        if path == 'tiled':
            dtype, wd = v.dtype, work_dtype(v)
            with no_autocast(v):  # activation and normaliser in fp32 (fp64 for fp64 inputs)
                q, k, v = q.to(wd), k.to(wd), v.to(wd)
                return cast_back(self._tiled(q, k, v, default_scale(scale, q.shape[-1], q), bias, mask), dtype)
        a = self._matrix(q, k, hw, scale, bias, mask)
        with no_autocast(v):  # A @ v in the working dtype
            return (a @ v.to(a.dtype)).to(v.dtype)


@ATTENTION.register('relu')
class ReluAttention(_PointwiseAttention):
    """``A = relu(S) / N * keep``."""

    kind = 'relu'

    def _row_terms(self, q, k, mask):
        return (1.0 / k.shape[2] if mask is None else key_count(mask, q, k).reciprocal()), None

    def _activation(self, s, n):
        return torch.relu(s) / n

    def _derivative(self, s, n):
        return (s > 0).to(s.dtype) / n

    def _tiled(self, q, k, v, scale, bias, mask):
        return pointwise_attention(q, k, v, 'relu', 1, scale, key_count(mask, q, k).reciprocal(), bias=bias,
                                   mask=mask, tile=dispatch.tile_for(q, k))


@ATTENTION.register('sigmoid')
class SigmoidAttention(_PointwiseAttention):
    """``A = sigmoid(S - log N) * keep``."""

    kind = 'sigmoid'
    kept_per_score = 1

    def _row_terms(self, q, k, mask):
        return 1.0, (-math.log(k.shape[2]) if mask is None else -key_count(mask, q, k).log())

    def _activation(self, s, n):
        return torch.sigmoid(s - torch.log(n))

    def _derivative(self, s, n):
        sig = torch.sigmoid(s - torch.log(n))
        return sig * (1.0 - sig)

    def _tiled(self, q, k, v, scale, bias, mask):
        return pointwise_attention(q, k, v, 'sigmoid', 1, scale, 1.0, bias=bias, shift=-key_count(mask, q, k).log(),
                                   mask=mask, tile=dispatch.tile_for(q, k))
