"""Synthesizer attention (Tay et al. 2021): attention logits that do not come from query-key dot products.

* ``random``: a learned (h, L, L) logit table;
* ``factorized_random``: ``R1 @ R2^T`` with R1, R2 (h, L, rank);
* ``dense``: ``relu(q W1 + b1) W2 + b2`` maps each query (q stands in for x: both are linear maps of x) to L logits;
* ``factorized_dense``: the same with a low-rank ``W2 = U V`` (U (d, rank), V (rank, L)).

The table is sliced to the actual Nq x Nk (a length above ``max_len`` is an error); ``mix=True`` adds the
dot-product scores ``S = s q.k^T``. Then the bias is added and ``A = softmax(logits)`` with masked keys at -inf
(a row with no valid key gets zero weights). Fits fixed-size token sets: windows, XCiT's d_h x d_h matrix.

Masked keys are deleted keys here too: the synthetic logits are tied to key positions, so under a mask the valid
keys of each query row take the table's key positions 0, 1, 2, ... in order, exactly as if the masked keys had been
removed from the sequence (the bias and the mixed-in scores belong to the keys themselves and stay with them).
"""
import torch
from torch import nn

from . import ATTENTION
from .base import AttentionKernel, default_scale, scores, upcast, work_dtype, no_autocast
from .score_map import softmax_map

MODES = ('random', 'factorized_random', 'dense', 'factorized_dense')


def compact_key_positions(logits, mask):
    """Gather ``logits (.., Nq, Nk)`` so that the j-th valid key of a row reads the table's column j: the logits
    the row would get with the masked keys deleted. Masked entries get some valid column (masked out later)."""
    logits, mask = torch.broadcast_tensors(logits, mask)
    pos = (mask.to(torch.long).cumsum(-1) - 1).clamp_min(0)
    return torch.gather(logits, -1, pos)


@ATTENTION.register('synthesizer')
class SynthesizerAttention(AttentionKernel):
    """Synthetic attention weights (see the module docstring). Needs num_heads (and head_dim in the dense modes).

    Args:
        mode: ``'random'``, ``'factorized_random'``, ``'dense'`` or ``'factorized_dense'``.
        max_len: L, the longest token sequence (queries and keys) the learned logits cover.
        rank: the factor rank of the factorized modes.
        mix: add the dot-product scores ``s q.k^T`` to the synthetic logits.
    """

    supports_bias = True
    supports_mask = True
    complexity = 'quadratic'
    fixed_length = True  # logits are tied to token positions 0..max_len-1

    def __init__(self, num_heads=None, head_dim=None, mode='random', max_len=256, rank=8, mix=False):
        super().__init__(num_heads, head_dim)
        if mode not in MODES:
            raise ValueError(f"synthesizer: unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        for arg, val in (('max_len', max_len), ('rank', rank)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f'synthesizer: {arg} must be a positive int, got {val!r}')
        if not isinstance(mix, bool):
            raise TypeError(f'synthesizer: mix must be True or False, got {mix!r}')
        if num_heads is None or (head_dim is None and mode in ('dense', 'factorized_dense')):
            need = 'num_heads' if mode in ('random', 'factorized_random') else 'num_heads and head_dim'
            raise ValueError(f'synthesizer: the synthetic logits are learned; mode {mode!r} needs {need} '
                             f'(got num_heads={num_heads}, head_dim={head_dim})')
        self.mode, self.max_len, self.rank, self.mix = mode, max_len, rank, mix
        h, d, n = num_heads, head_dim, max_len
        if mode == 'random':
            self.table = nn.Parameter(torch.empty(h, n, n))
        elif mode == 'factorized_random':
            self.r1 = nn.Parameter(torch.empty(h, n, rank))
            self.r2 = nn.Parameter(torch.empty(h, n, rank))
        else:
            self.w1 = nn.Parameter(torch.empty(h, d, d))
            self.b1 = nn.Parameter(torch.zeros(h, 1, d))
            if mode == 'dense':
                self.w2 = nn.Parameter(torch.empty(h, d, n))
            else:
                self.u = nn.Parameter(torch.empty(h, d, rank))
                self.w2 = nn.Parameter(torch.empty(h, rank, n))
            self.b2 = nn.Parameter(torch.zeros(h, 1, n))
        self.reset_parameters()

    def reset_parameters(self):
        if self.mode == 'random':
            nn.init.trunc_normal_(self.table, std=0.02)
        elif self.mode == 'factorized_random':
            # the product R1 R2^T then has entries of std about 0.02
            std = (0.02 / self.rank ** 0.5) ** 0.5
            nn.init.trunc_normal_(self.r1, std=std)
            nn.init.trunc_normal_(self.r2, std=std)
        else:
            nn.init.trunc_normal_(self.w1, std=self.head_dim ** -0.5)
            inner = self.head_dim if self.mode == 'dense' else self.rank
            if self.mode == 'factorized_dense':
                nn.init.trunc_normal_(self.u, std=self.head_dim ** -0.5)
            nn.init.trunc_normal_(self.w2, std=0.02 * inner ** -0.5)
            nn.init.zeros_(self.b1)
            nn.init.zeros_(self.b2)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, mode={self.mode!r}, max_len={self.max_len}, rank={self.rank}, '
                f'mix={self.mix}')

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        """Per (batch, head) pair; the random modes' logits do not depend on the sample (counted once per
        pair all the same)."""
        logits = {'random': 0, 'factorized_random': nq * nk * self.rank, 'dense': nq * d * (d + nk),
                  'factorized_dense': nq * (d * d + d * self.rank + self.rank * nk)}[self.mode]
        return logits + (nq * nk * d if self.mix else 0) + nq * nk * dv

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        hidden = nq * d if self.mode in ('dense', 'factorized_dense') else 0  # relu(q W1)
        # the weights kept (the logits, a table or the mixed scores, are not: softmax keeps its output); a mask
        # (Swin's come with its bias) adds the keys' positions it gathers the logits by and the masked weights
        kept = 3 if masked or key_mask else 1
        return kept * nq * nk + hidden, max(nq * nk, nq * dv, hidden)

    def synthetic_logits(self, q, nk):
        """(B or 1, h, Nq, Nk) logits in q's dtype."""
        nq, dt = q.shape[2], q.dtype
        if nq > self.max_len or nk > self.max_len:
            raise ValueError(f'synthesizer: Nq={nq} and Nk={nk} tokens, but the learned logits cover at most '
                             f'max_len={self.max_len}; raise max_len to at least {max(nq, nk)}')
        if self.mode == 'random':
            return self.table[:, :nq, :nk].to(dt).unsqueeze(0)
        if self.mode == 'factorized_random':
            return (self.r1[:, :nq].to(dt) @ self.r2[:, :nk].to(dt).transpose(-2, -1)).unsqueeze(0)
        hidden = torch.relu(q @ self.w1.to(dt) + self.b1.to(dt))  # (B, h, Nq, d)
        if self.mode == 'factorized_dense':
            hidden = hidden @ self.u.to(dt)
        return hidden @ self.w2[..., :nk].to(dt) + self.b2[..., :nk].to(dt)

    def _score_map(self, q, k, hw, scale, bias, mask):
        """The scores are the logits (synthetic, plus the dot products with ``mix``, plus the bias): A is their
        softmax."""
        q, k = upcast(q, k)
        with no_autocast(q):  # logits and softmax in fp32
            logits = self.synthetic_logits(q, k.shape[2])
            if mask is not None:
                logits = compact_key_positions(logits, mask)
            if self.mix:
                logits = logits + scores(q, k, default_scale(scale, q.shape[-1], q))
            if bias is not None:
                logits = logits + bias.to(logits.dtype)
            return softmax_map(logits.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]), mask)

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def _forward(self, q, k, v, hw, scale, bias, mask):
        a = self._matrix(q, k, hw, scale, bias, mask)
        with no_autocast(v):
            dt = torch.promote_types(a.dtype, work_dtype(v))
            out = a.to(dt) @ v.to(dt)
        return out.to(v.dtype)
