"""Pointwise activations in place of softmax, normalised by the number of keys a row may look at.

``relu``: ``A = relu(S) / N * keep`` (Wortsman et al. 2023, ReLU divided by the sequence length).
``sigmoid``: ``A = sigmoid(S - log N) * keep`` (Apple 2024, sigmoid attention with bias -log N).

``S = s * q @ k^T (+ bias)``; N counts the True entries of the row's mask (all keys without a mask), so a
masked key gives exactly the result of deleting it. A row with no valid key is a zero row.
"""
import torch

from . import ATTENTION
from .base import AttentionKernel, default_scale, key_count, scores, upcast, no_autocast




class _PointwiseAttention(AttentionKernel):
    supports_bias = True
    supports_mask = True
    complexity = 'quadratic'

    def __init__(self, num_heads=None, head_dim=None):
        super().__init__(num_heads, head_dim)

    def _activation(self, s, n):
        raise NotImplementedError

    def _matrix(self, q, k, hw, scale, bias, mask):
        q, k = upcast(q, k)
        with no_autocast(q):  # activation and normaliser in fp32 (fp64 for fp64 inputs)
            s = scores(q, k, default_scale(scale, q.shape[-1], q), bias)
            a = self._activation(s, key_count(mask, q, k))
            if mask is not None:
                a = a.masked_fill(~mask, 0.0)
            return a

    def _forward(self, q, k, v, hw, scale, bias, mask):
        a = self._matrix(q, k, hw, scale, bias, mask)
        with no_autocast(v):  # A @ v in the working dtype
            return (a @ v.to(a.dtype)).to(v.dtype)


@ATTENTION.register('relu')
class ReluAttention(_PointwiseAttention):
    """``A = relu(S) / N * keep``."""

    def _activation(self, s, n):
        return torch.relu(s) / n


@ATTENTION.register('sigmoid')
class SigmoidAttention(_PointwiseAttention):
    """``A = sigmoid(S - log N) * keep``."""

    def _activation(self, s, n):
        return torch.sigmoid(s - torch.log(n))
