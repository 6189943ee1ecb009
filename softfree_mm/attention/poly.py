"""Polynomial attention (Rethinking Softmax, arXiv 2410.18613): ``A = c * S^p * keep``.

``S = s * q @ k^T (+ bias)``; ``c = 1/sqrt(N)`` by default (N = keys the row may look at), or a fixed positive
constant. Softmax bounds ``||A||_F`` by ``sqrt(N)``; ``c = 1/sqrt(N)`` keeps the polynomial map on the same
footing (for q, k ~ N(0, 1) the Frobenius norm of ``A`` then grows like ``sqrt(N)``).

Without a bias and a general mask the power factorises through symmetric tensor powers,
``(a . b)^p = sum_{|m| = p} multinomial(p; m) a^m b^m``, one feature per monomial of degree p in d variables
(``M = C(d + p - 1, p)`` features instead of ``d^p``), so ``A @ v`` costs ``O(N M dv)`` instead of
``O(N^2 (d + dv))``. ``forward`` takes that path whenever its flop count, computed from the static shapes, is
the smaller one, with or without a key-only mask (``dispatch.key_only``, shape (..., 1, Nk): padded keys): the masked
keys' rows of v are zeroed before ``phi(k)^T v`` and c = 1/sqrt(N) counts the valid keys, so a masked key gives exactly
the output of deleting it (a key-masked call stays on the torch path: the fused linear kernel takes no mask).
``p = 1`` is plain linear attention ``c * s * q @ (k^T @ v)``. Otherwise, where one (batch, head) matrix is larger
than a tile, forward and backward run in tiles (``blocked.py``) and never hold ``A``; on CUDA the explicit matrix
within a memory budget and the fused Triton kernel beyond it (``dispatch.py``, ``impl``).

``qk_norm=True`` (an option of ours, not the paper's; off by default): each head's q and k rows are standardised
(zero mean, unit variance over the head dim, no learned parameters) before the scores, so that the paper's premise
for ``c = 1/sqrt(N)`` (q, k ~ N(0, 1)) holds however training scales them and ``|S| <= s * d = sqrt(d)``. Why: in the
task study's segmentors the deep stages' score RMS grows from about 1 to 10-35 and ``S^3`` turns that into output gains
of 1e5-1e6 (docs/study.md, "Why x^3 / sqrt(N) collapses in segmentation").
"""
import math
from typing import Tuple

import torch
from torch.utils.checkpoint import checkpoint

from . import ATTENTION, dispatch
from .base import AttentionKernel, cast_back, default_scale, key_count, key_keep, scores, work_dtype, no_autocast

QK_NORM_EPS = 1e-6
from .blocked import memory as blocked_memory, pointwise_attention
from .fused_linear import allowed as fused_linear_allowed
from .score_map import pointwise_map

SCALE_OPTIONS = "'sqrt_n' (1/sqrt(number of keys a row may look at)) or a float > 0"

# rows of one factorised chunk: keeps the (B, h, rows, M) monomial features to about 2^24 numbers
_CHUNK_ELEMENTS = 1 << 24
_MAX_CHUNKS = 64
# one monomial-feature element in matmul multiply-adds, per device type: a CPU's matmul is slow next to its memory,
# a GPU's tensor cores are fast (an H200: the factorised path 60x the fused quadratic one at N = 65536, d = 64)
FEATURE_WEIGHT = {'cpu': 8, 'cuda': 2048}


def monomial_features(x: torch.Tensor, degree: int, weighted: bool) -> torch.Tensor:
    """All monomials of degree ``degree`` in the last dim of ``x``: (..., d) -> (..., C(d + p - 1, p)).

    With ``weighted`` each monomial is multiplied by its multinomial coefficient, so that
    ``monomial_features(a, p, True) . monomial_features(b, p, False) == (a . b)^p``.
    """
    d = x.shape[-1]
    if degree == 1:
        return x
    idx = torch.combinations(torch.arange(d, device=x.device), r=degree, with_replacement=True)  # (M, p)
    feat = x[..., idx[:, 0]]
    for r in range(1, degree):
        feat = feat * x[..., idx[:, r]]
    if weighted:
        # multinomial(p; m) = p! / prod_i m_i!, m_i = how often variable i appears in the monomial
        counts = torch.nn.functional.one_hot(idx, d).sum(1).to(x.dtype)  # (M, d)
        coef = torch.exp(math.lgamma(degree + 1) - torch.lgamma(counts + 1).sum(-1))
        feat = feat * coef.round()
    return feat


@ATTENTION.register('poly')
class PolyAttention(AttentionKernel):
    """``A = c * S^p * keep`` with ``c = 1/sqrt(N)`` ('sqrt_n') or a fixed float.

    Args:
        num_heads, head_dim: optional, checked against the inputs when given.
        degree (int >= 1): the power p (3 and 1 are the paper's).
        scale ('sqrt_n' | float > 0): the constant c multiplying ``S^p``. Not the score scale ``s``, which is
            the ``scale`` argument of ``forward`` (default head_dim^-1/2).
        impl ('auto' | 'explicit' | 'tiled' | 'fused' | 'factorised'): the path (``dispatch.py``): 'auto' takes the
            factorised order where it is cheaper (the association rule) and else chooses the quadratic path;
            'factorised' forces that order wherever there is no bias and no general mask (a key-only mask keeps it);
            the others force that quadratic
            path. SOFTFREE_ATTN_IMPL overrides it.
        explicit_mib (None | float > 0): on CUDA with 'auto', the memory the explicit matrix may take (MiB);
            None: the smaller of 512 MiB and an eighth of the free GPU memory.
        qk_norm (bool): standardise each q and k row over the head dim before the scores (``(x - mean) /
            sqrt(var + 1e-6)``, no parameters: a checkpoint loads unchanged); the module's docstring says why.
    """

    supports_bias = True
    supports_mask = True
    complexity = 'quadratic'  # the instance says 'linear' for degree 1

    def __init__(self, num_heads=None, head_dim=None, degree=3, scale='sqrt_n', impl='auto', explicit_mib=None,
                 qk_norm=False):
        super().__init__(num_heads, head_dim)
        if not isinstance(qk_norm, bool):
            raise ValueError(f'poly: qk_norm must be True or False, got {qk_norm!r}')
        self.qk_norm = qk_norm
        self.impl = dispatch.check_impl('poly', impl, factorised=True)
        self.explicit_mib = dispatch.check_explicit_mib('poly', explicit_mib)
        dispatch.forced()  # a bad SOFTFREE_ATTN_IMPL is refused at build time
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f'poly: degree must be an int >= 1, got {degree!r}')
        if isinstance(scale, str):
            if scale != 'sqrt_n':
                raise ValueError(f'poly: scale must be {SCALE_OPTIONS}; got {scale!r}')
        elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
            raise ValueError(f'poly: scale must be {SCALE_OPTIONS}; got {scale!r}')
        self.degree = degree
        self.scale = scale if isinstance(scale, str) else float(scale)
        self.complexity = 'linear' if degree == 1 else 'quadratic'

    def extra_repr(self) -> str:
        extra = '' if self.impl == 'auto' else f', impl={self.impl!r}'
        extra += ', qk_norm=True' if self.qk_norm else ''
        return f'{super().extra_repr()}, degree={self.degree}, scale={self.scale!r}{extra}'

    # ------------------------------------------------------------------ cost model (static shapes only)
    def num_features(self, d: int) -> int:
        return math.comb(d + self.degree - 1, self.degree)

    def path_costs(self, nq: int, nk: int, d: int, dv: int, device: str = 'cpu') -> Tuple[int, int]:
        """(explicit, factorised) weighted multiply-adds per (batch, head) on a device type ('cpu', 'cuda', ...):
        ``order_costs``."""
        return self.order_costs(nq, nk, d, dv, device)

    def order_products(self, nq, nk, d, dv):
        # explicit: S = q k^T, A @ v; factorised: phi(k)^T v, phi(q) @ kv
        return nq * nk * (d + dv), (nk + nq) * self.num_features(d) * dv

    def order_extra(self, nq, nk, d, dv, device='cpu'):
        p, m = self.degree, self.num_features(d)
        # building the features gathers and multiplies elementwise: memory bound, so each feature element counts
        # as that many of a matmul's multiply-adds (where the weights come from: docs/benchmarks.md, the cost models)
        weight = FEATURE_WEIGHT.get(device, FEATURE_WEIGHT['cpu'])
        return nq * nk * p, weight * (nq + nk) * m * (p - 1)  # the explicit power; the factorised features

    def order(self, nq, nk, d, dv, masked=False, device='cpu'):
        if dispatch.resolve(self.impl) in ('tiled', 'fused'):  # forced quadratic paths: the explicit order
            return 'explicit'
        return super().order(nq, nk, d, dv, masked, device)

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return self.order_flops(nq, nk, d, dv, masked)  # the explicit order's products also in tiles or fused

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        normed = (nq + nk) * d if self.qk_norm else 0  # the standardised q and k, kept for backward
        if self.order(nq, nk, d, dv, masked) == 'factorised':
            # chunks recomputed in backward: kept are the key-value sum and the scaled q the query chunks' checkpoints
            # read (a key-only mask: v with its masked rows zeroed, and the keep column); one chunk's features held
            m = self.num_features(d)
            rows = max(1, _CHUNK_ELEMENTS // m, -(-max(nq, nk) // _MAX_CHUNKS))
            keys = nk * dv + nk if key_mask else 0
            return m * dv + nq * d + keys + normed, max(min(max(nq, nk), rows) * m, nq * dv)
        saved, largest = blocked_memory(nq, nk, d, dv, 2, masked, key_mask)  # the scores and the weights, or tiles
        return saved + normed, largest

    def uses_factorised(self, q, k, v, bias=None, mask=None) -> bool:
        """Whether a call takes the factorised order: no bias, no mask or a key-only one, and the rule's choice."""
        return self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], dispatch.general(mask, bias),
                          q.device.type) == 'factorised'

    # ------------------------------------------------------------------ paths
    def _coef(self, mask, q, k):
        if self.scale == 'sqrt_n':
            if mask is None:
                return k.shape[2] ** -0.5
            return key_count(mask, q, k).rsqrt()
        return self.scale

    def _standardised(self, q, k):
        """(q, k) as the scores see them: unchanged, or with ``qk_norm`` each row standardised over the head dim
        (in the working dtype, returned in the inputs' dtype)."""
        if not self.qk_norm:
            return q, k
        with no_autocast(q):
            def std(x):
                xw = x.to(work_dtype(x))
                return cast_back(torch.nn.functional.layer_norm(xw, xw.shape[-1:], eps=QK_NORM_EPS), x.dtype)
            return std(q), std(k)

    def _score_map(self, q, k, hw, scale, bias, mask):
        return self._power_map(*self._standardised(q, k), scale, bias, mask)

    def _power_map(self, q, k, scale, bias, mask):
        wd, p = work_dtype(q), self.degree
        with no_autocast(q):
            q, k = q.to(wd), k.to(wd)
            s = scores(q, k, default_scale(scale, q.shape[-1], q), bias)
            c = self._coef(mask, q, k)
            # the power runs in fp32 (fp64 for fp64 inputs): |S| > 40 overflows S^3 in fp16; masks act after the
            # power, multiplicatively
            return pointwise_map(s, mask, lambda x: x.pow(p) * c, lambda x: x.pow(p - 1) * (c * p))

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def path(self, q, k, v, bias=None, mask=None) -> str:
        """'factorised' | 'explicit' | 'tiled' | 'fused': the path of a call (``dispatch.py``)."""
        if self.uses_factorised(q, k, v, bias, mask):
            return 'factorised'
        return dispatch.choose(dispatch.resolve(self.impl), q, k, self.explicit_mib)

    def describe_path(self, q, k, v, bias=None, mask=None) -> str:
        path = self.path(q, k, v, bias, mask)
        return 'factorised order' if path == 'factorised' else f'explicit order ({path})'

    def _forward(self, q, k, v, hw, scale, bias, mask):
        out_dtype = v.dtype
        wd = work_dtype(v)
        path = self.path(q, k, v, bias, mask)
        q, k = self._standardised(q, k)
        with no_autocast(v):
            if path == 'fused':  # in the inputs' dtype; scores and powers in fp32 inside the kernel
                from .fused_pointwise import attend
                out = attend(q, k, v, 'pow', self.degree, default_scale(scale, q.shape[-1], q),
                             self._coef(mask, q, k), bias=bias, mask=mask)
                if out is not None:
                    return cast_back(out, out_dtype)
                path = 'tiled'
            if path == 'factorised' and mask is None and self.degree == 1 and fused_linear_allowed(q):
                # x/sqrt(N): coef * (s q) (k^T v), the fused bidirectional kernel (fused_linear.py)
                s, c = default_scale(scale, q.shape[-1], q), self._coef(None, q, k)
                if not isinstance(s, torch.Tensor) and not isinstance(c, torch.Tensor):
                    from .fused_linear import fused_linear
                    out = fused_linear(q, k, v, 'plain', 'identity', alpha=s * c)
                    if out is not None:
                        return cast_back(out, out_dtype)
            q, k, v = q.to(wd), k.to(wd), v.to(wd)
            if path == 'factorised':  # no mask, or a key-only one
                out = self.factorised(q, k, v, scale, mask)
            elif path == 'tiled':  # forward and backward in tiles: A is never held
                out = pointwise_attention(q, k, v, 'pow', self.degree, default_scale(scale, q.shape[-1], q),
                                          self._coef(mask, q, k), bias=bias, mask=mask, tile=dispatch.tile_for(q, k))
            else:
                out = self._power_map(q, k, scale, bias, mask).matrix() @ v
            return cast_back(out, out_dtype)  # overflow shows as inf (fp16 loss scaling)

    def factorised(self, q, k, v, scale=None, mask=None):
        """``A @ v`` through degree-p monomial features, without bias, and without a mask or with a key-only one
        (``dispatch.key_only``: the masked keys' rows of v are zeroed, so they add nothing to phi(k)^T v, and c counts
        the valid keys); O(N M dv) with M = C(d + p - 1, p). Inputs are expected in the working dtype, q and k as the
        scores see them (with ``qk_norm``: standardised already, as ``forward`` passes them)."""
        if mask is not None and not dispatch.key_only(mask):
            raise ValueError(f'poly: the factorised order takes no mask or a key-only one (shape (..., 1, Nk)), got a '
                             f'mask of shape {tuple(mask.shape)}')
        p = self.degree
        if mask is not None:
            v = v * key_keep(mask, v.dtype)
        qs = q * default_scale(scale, q.shape[-1], q)  # (s q . k)^p: the score scale goes into q
        b, h, nk, d = k.shape
        m = self.num_features(d)
        # chunks of about _CHUNK_ELEMENTS features, and at most _MAX_CHUNKS of them (a static Python loop)
        rows = max(1, _CHUNK_ELEMENTS // max(1, b * h * m), -(-max(nk, q.shape[2]) // _MAX_CHUNKS))
        # with autograd, each chunk's features are recomputed in backward, not saved: saved, they would hold all
        # N x M of them, several times (4 heads at N = 65536, d = 64: about 45 GiB for each fp32 copy)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))

        def chunk(fn, *args):
            return checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args)

        def key_part(kc, vc):  # phi(k_j)^T v_j over a chunk of keys
            return monomial_features(kc, p, False).transpose(-2, -1) @ vc

        def query_part(qc, kv):
            return monomial_features(qc, p, True) @ kv

        kv = None
        for start in range(0, nk, rows):  # sum_j phi(k_j) v_j^T, chunked over keys to bound memory
            part = chunk(key_part, k[:, :, start:start + rows], v[:, :, start:start + rows])
            kv = part if kv is None else kv + part
        coef = self._coef(mask, q, k)
        outs = [chunk(query_part, qs[:, :, start:start + rows], kv) for start in range(0, q.shape[2], rows)]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        return out * coef
