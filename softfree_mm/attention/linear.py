"""Factorised (linear-complexity) kernels: ``linear`` (phi(q) phi(k)^T), ``efficient`` (Shen et al.) and
``taylor`` (first-order Taylor expansion of exp, 1 + q^.k^).

Each has two association orders (``dispatch.order``): the factorised one computes ``A @ v`` in O(N d dv) through
``k^T @ v`` and never builds ``A`` (``linear``'s, on CUDA, by the fused bidirectional kernel of fused_linear.py); the
explicit one builds ``A``, O(Nq Nk (d + dv)). Without a mask, and with a key-only mask (``dispatch.key_only``: shape
(..., 1, Nk), padded keys), the call takes the cheaper for its shapes: the factorised order in token attention
(N >> d), the explicit one in XCiT's channel attention (a d_h x d_h matrix, where ``k^T v`` would be N x N). A key-only
mask zeroes the masked keys' rows of phi(k) (and of v where v is summed) in the working dtype, so they add nothing to
``phi(k)^T v`` or the normaliser; a key-masked call stays on the torch path (the fused kernel takes no mask). With a
general mask (one row per query: Swin's shifted windows) it is the explicit order. Either way sums and normalisers run
over the valid keys of each row only, so a masked key gives exactly the output of deleting that key. None of them can
take an additive score bias (a clear error).

The score scale: these kernels have none. The ``scale`` argument of ``forward`` / ``attention_matrix`` is
accepted, so that backbones can hand every kernel the same arguments, and ignored (linear and efficient use
their feature maps, taylor L2-normalises q and k).
"""
import torch
import torch.nn.functional as F

from . import ATTENTION, dispatch
from .base import AttentionKernel, key_keep, upcast, work_dtype, no_autocast
from .fused_linear import allowed as fused_linear_allowed
from .score_map import row_normalised_map

FEATURE_MAPS = ('elu+1', 'relu')


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1`` as ``exp(min(x, 0)) + max(x, 0)``: torch's CPU elu goes through expm1, about ten times slower
    than exp (XCiT-S12 + linear at 800x1344 spent a tenth of its forward there). With autograd it keeps only its
    output, whose derivative it is: ``min(y, 1)`` (1 where x > 0, exp(x) = y elsewhere)."""
    if torch.is_grad_enabled() and x.requires_grad and not torch.jit.is_tracing():
        return _EluPlusOne.apply(x)
    return x.clamp(max=0.0).exp_().add_(x.clamp(min=0.0))


class _EluPlusOne(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clamp(max=0.0).exp_().add_(x.clamp(min=0.0))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y.clamp(max=1.0)


class _FactorisedAttention(AttentionKernel):
    supports_bias = False
    supports_mask = True  # a key-only mask in either order, a general one through the explicit O(Nq Nk) path
    complexity = 'linear'

    def __init__(self, num_heads=None, head_dim=None, impl='auto'):
        super().__init__(num_heads, head_dim)
        self.impl = dispatch.check_order_impl(self.name, impl)
        dispatch.forced()  # a bad SOFTFREE_ATTN_IMPL is refused at build time

    normaliser_products = 1  # the row normaliser q @ sum_j k_j: a (N, d) x (d, 1) product (efficient: none)

    def extra_repr(self) -> str:
        return super().extra_repr() + ('' if self.impl == 'auto' else f', impl={self.impl!r}')

    def order_products(self, nq, nk, d, dv):
        # explicit: phi(q) phi(k)^T, A @ v; factorised: k^T v, q @ (k^T v), the normaliser q @ sum_j phi(k_j)
        return nq * nk * (d + dv), (nk + nq) * d * dv + self.normaliser_products * nq * d

    def order_extra(self, nq, nk, d, dv, device='cpu'):
        return nq * nk, 0  # the explicit A's row sums

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return self.order_flops(nq, nk, d, dv, masked)

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        tokens = max(nq, nk) * max(d, dv)  # phi(q), phi(k), the output: no other temporary on the factorised path
        if self.order(nq, nk, d, dv, masked) == 'explicit':
            # phi(q), phi(k), the scores, the weights and the row sums (a mask: the masked scores instead of the
            # scores; its negation, one per window shared by the heads, left out)
            return (nq + nk) * d + 2 * nq * nk + nq, max(nq * nk, tokens)
        # phi(q), phi(k), k^T v, sum_j phi(k_j), the normaliser and the output the in-place division keeps
        saved = (nq + nk) * d + d * dv + d + nq + nq * dv
        if key_mask:
            saved += nk * d + nk  # phi(k) with its masked rows zeroed, the keep column
        return saved, tokens

    def _fast(self, q, k, v, keep=None):
        """``A @ v`` in O(N d dv), over the keys ``keep`` (``base.key_keep``: a (B', h', Nk, 1) column of 1s and 0s)
        keeps, all without it; inputs in the working dtype."""
        raise NotImplementedError

    def _explicit(self, q, k, mask):
        """``A`` (B, h, Nq, Nk), honouring ``mask`` (None = every key); inputs in the working dtype."""
        sm = self._row_map(q, k, mask)
        return sm.weights(sm.scores)

    def _row_map(self, q, k, mask):
        """The score map of a row-normalised kernel; inputs in the working dtype (efficient has none)."""
        raise NotImplementedError

    def _score_map(self, q, k, hw, scale, bias, mask):
        if self.no_score_map:
            return None
        q, k = upcast(q, k)
        with no_autocast(q):  # sums and normalisers in fp32 (fp64 for fp64 inputs)
            return self._row_map(q, k, mask)

    def _matrix(self, q, k, hw, scale, bias, mask):
        q, k = upcast(q, k)
        with no_autocast(q):  # sums and normalisers in fp32 (fp64 for fp64 inputs)
            return self._explicit(q, k, mask)

    def _fused(self, q, k, v):
        """``A @ v`` by the fused bidirectional kernel (fused_linear.py) in the inputs' dtype, or None (no form of
        its own, or the fused kernel cannot take the call). Only calls without a mask come here: a key-masked call
        stays on the torch path."""
        return None

    def _forward(self, q, k, v, hw, scale, bias, mask):
        dtype, wd = v.dtype, work_dtype(v)
        factorised = self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], dispatch.general(mask),
                                q.device.type) == 'factorised'
        if factorised and mask is None and fused_linear_allowed(q):  # CUDA (or CPU tensors under TRITON_INTERPRET=1)
            out = self._fused(q, k, v)
            if out is not None:
                return out.to(dtype)
        with no_autocast(v):  # sums and normalisers in fp32 (fp64 for fp64 inputs)
            q, k, v = q.to(wd), k.to(wd), v.to(wd)
            if factorised:  # no mask, or a key-only one
                out = self._fast(q, k, v, key_keep(mask, wd))
            else:
                out = self._explicit(q, k, mask) @ v
        return out.to(dtype)


@ATTENTION.register('linear')
class LinearAttention(_FactorisedAttention):
    """``out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)`` (Katharopoulos et al.).

    Args:
        feature_map ('elu+1' | 'relu'): phi.
        impl ('auto' | 'explicit' | 'factorised'): the association order (``dispatch.order``); 'auto' takes the
            cheaper one for the call's shapes. SOFTFREE_ATTN_IMPL overrides it.
    """

    eps = 1e-6

    def __init__(self, num_heads=None, head_dim=None, feature_map='elu+1', impl='auto'):
        super().__init__(num_heads, head_dim, impl)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f'linear: feature_map must be one of {FEATURE_MAPS}, got {feature_map!r}')
        self.feature_map = feature_map

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, feature_map={self.feature_map!r}'

    def phi(self, x):
        return elu_plus_one(x) if self.feature_map == 'elu+1' else torch.relu(x)

    def _fused(self, q, k, v):
        from .fused_linear import fused_linear
        with no_autocast(v):
            return fused_linear(q, k, v, 'normalised', self.feature_map, eps=self.eps)

    def _fast(self, q, k, v, keep=None):
        qf, kf = self.phi(q), self.phi(k)
        if keep is not None:  # a masked key's phi(k) row is 0: nothing in k^T v nor in the normaliser
            kf = kf * keep
        kv = kf.transpose(-2, -1) @ v  # (B, h, d, dv)
        z = kf.sum(dim=2, keepdim=True)  # (B, h, 1, d)
        # the normaliser as a product (no (N, d) temporary), the division in place on the product's own output
        den = (qf @ z.transpose(-2, -1)).add_(self.eps)  # (B, h, N, 1)
        return (qf @ kv).div_(den)

    def _row_map(self, q, k, mask):
        return row_normalised_map(self.phi(q) @ self.phi(k).transpose(-2, -1), mask, eps=self.eps)


@ATTENTION.register('efficient')
class EfficientAttention(_FactorisedAttention):
    """``out = softmax_over_d(q) @ (softmax_over_N(k)^T @ v)`` (Shen et al. 2021); every row of ``A`` sums to 1.

    With a mask the softmax over keys runs, for each row, over that row's valid keys only.
    """

    # its normaliser runs over the keys of each channel before any pair product, so no row map of scores gives A
    no_score_map = 'A = softmax over channels of q times softmax over tokens of k: no per-pair score map'

    normaliser_products = 0

    def order_extra(self, nq, nk, d, dv, device='cpu'):
        return 0, 0  # its explicit A needs no row sums (each key's softmax over the keys normalises it)

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        tokens = max(nq, nk) * max(d, dv)
        # a key-only mask: its softmax over the valid keys keeps k with the masked keys zeroed, their exponentials,
        # the masked exponentials and their quotient (four Nk x d tensors where softmax keeps one), and the keep column
        keys = 3 * nk * d + 3 * nk if key_mask else 0
        if masked:  # a general mask, per row: softmax(q), the masked k and its exponentials, each row's normaliser
            # and softmax(q) over it, the float keep mask, the product and the masked weights
            return 2 * (nq + nk) * d + 3 * nq * nk, max(nq * nk, tokens)
        if self.order(nq, nk, d, dv, masked) == 'explicit':
            return (nq + nk) * d + nq * nk + keys, max(nq * nk, tokens)  # softmax(q), softmax(k), A
        return (nq + nk) * d + d * dv + keys, tokens  # softmax(q), softmax(k), k^T v

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        if masked:  # the per-row normaliser keep @ e, the weights, A @ v
            return nq * nk * (2 * d + dv)
        return super().flops(nq, nk, d, dv, masked, hw)

    @staticmethod
    def _key_softmax(k, keep):
        """softmax over the keys of each channel, over the keys ``keep`` keeps (all without it): a masked key weighs
        exactly 0 (its k is replaced by 0 first, so a huge padded value gives no inf / NaN, nor a gradient)."""
        if keep is None:
            return torch.softmax(k, dim=2)
        valid = keep > 0
        k = torch.where(valid, k, torch.zeros((), dtype=k.dtype, device=k.device))
        kmax = k.masked_fill(~valid, float('-inf')).amax(dim=2, keepdim=True).detach()
        kmax = torch.where(torch.isfinite(kmax), kmax, torch.zeros_like(kmax))  # no valid key at all
        e = torch.exp(k - kmax) * keep
        den = e.sum(dim=2, keepdim=True)
        return e / torch.where(den > 0, den, torch.ones_like(den))  # no valid key: a zero softmax

    def _fast(self, q, k, v, keep=None):
        return torch.softmax(q, dim=-1) @ (self._key_softmax(k, keep).transpose(-2, -1) @ v)

    def _explicit(self, q, k, mask):
        qs = torch.softmax(q, dim=-1)
        if mask is None or dispatch.key_only(mask):  # every row the same keys: one softmax over them
            return qs @ self._key_softmax(k, key_keep(mask, k.dtype)).transpose(-2, -1)
        # A_ij = keep_ij sum_c qs_ic e_jc / sum_j' keep_ij' e_j'c, e = exp(k - max_j k_jc) per channel, the max
        # over keys some row may look at (a padded key with a huge value cannot underflow the valid ones)
        full = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        seen = full.any(dim=2).unsqueeze(-1)  # (B, h, Nk, 1)
        k = k.masked_fill(~seen, 0.0)  # keys no row looks at: zero weight below, finite gradient
        kmax = k.masked_fill(~seen, float('-inf')).amax(dim=2, keepdim=True).detach()
        kmax = torch.where(torch.isfinite(kmax), kmax, torch.zeros_like(kmax))  # no valid key at all
        e = torch.exp(k - kmax).masked_fill(~seen, 0.0)  # (B, h, Nk, d)
        keep = full.to(e.dtype)
        den = keep @ e  # (B, h, Nq, d): the softmax normaliser of each row over its valid keys
        # a row without any valid key has den = 0: divide by 1 instead, its weights are zeroed by keep
        den = torch.where(den > 0, den, torch.ones_like(den))
        return ((qs / den) @ e.transpose(-2, -1)) * keep


@ATTENTION.register('taylor')
class TaylorAttention(_FactorisedAttention):
    """With L2-normalised ``q^``, ``k^``: ``A_ij = (1 + q^_i.k^_j) / sum_j (1 + q^_i.k^_j)``.

    ``|q^.k^| <= 1`` so no weight is negative (rounding below zero is clamped on the explicit path).
    """

    def memory(self, nq, nk, d, dv, masked=False, hw=None, *, key_mask=False):
        tokens = max(nq, nk) * max(d, dv)
        normed = (nq + nk) * (d + 2)  # q^ and k^, with their norms and clamped norms
        if self.order(nq, nk, d, dv, masked) == 'explicit':
            # 1 + q^.k^, its clamp and the weights, the row sums and their floor (a mask: the masked scores too;
            # its negation, one per window shared by the heads, left out)
            return normed + 3 * nq * nk + 2 * nq, max(nq * nk, tokens)
        # k^T v, sum_j k^_j, the normaliser and its floor, the numerator the in-place division keeps
        saved = normed + d * dv + d + 2 * nq + nq * dv
        if key_mask:
            saved += nk * d + nk  # k^ with its masked rows zeroed, the keep column
        return saved, tokens

    def _fast(self, q, k, v, keep=None):
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        count = k.shape[2]
        if keep is not None:  # a masked key adds nothing: its k^ and v rows are 0, the count is of the valid keys
            kn, v, count = kn * keep, v * keep, keep.sum(dim=2, keepdim=True)
        num = (qn @ (kn.transpose(-2, -1) @ v)).add_(v.sum(dim=2, keepdim=True))
        den = (qn @ kn.sum(dim=2, keepdim=True).transpose(-2, -1)).add_(count)  # no (N, d) temporary
        # den >= 0; it is 0 only when every key points exactly away from the query: keep that row finite
        return num.div_(den.clamp_min(torch.finfo(den.dtype).tiny))

    def _row_map(self, q, k, mask):
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        s = (1.0 + qn @ kn.transpose(-2, -1)).clamp_min(0.0)
        return row_normalised_map(s, mask, floor=torch.finfo(s.dtype).tiny)  # zero row when no valid key
