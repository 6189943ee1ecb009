"""Efficient-attention kernels the seed papers compare against: Nystromformer, Performer (FAVOR+), cosFormer and
FLatten (focused linear attention). Each has an explicit weight matrix ``A`` with ``out == A @ v``.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import ATTENTION, dispatch
from .base import AttentionKernel, default_scale, no_autocast, resolve_hw, upcast
from .neighbourhood import local_conv, neighbour_onehot
from .score_map import row_normalised_map


def _to_common(*ts):
    dt = ts[0].dtype
    for t in ts[1:]:
        dt = torch.promote_types(dt, t.dtype)
    return tuple(t.to(dt) for t in ts)


def _positive_int(name, arg, val, minimum=1):
    if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
        raise ValueError(f'{name}: {arg} must be an int >= {minimum}, got {val!r}')


# ---------------------------------------------------------------------------------------------- Nystromformer
def segment_means(x, m):
    """(B, h, N, d) -> (B, h, m, d): means of m contiguous segments of near-equal length, segment i holding tokens
    floor(iN/m) .. ceil((i+1)N/m) - 1 (adaptive average pooling). Written as an (m, N) averaging matrix so that it
    traces and exports (ONNX) when N is not a constant."""
    n = x.shape[2]
    i = torch.arange(m, device=x.device)
    start, end = (i * n) // m, ((i + 1) * n + m - 1) // m
    j = torch.arange(n, device=x.device)
    w = ((j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])).to(x.dtype)
    return (w / (end - start)[:, None].to(x.dtype)) @ x


def iterative_pinv(p, iters):
    """Pseudo-inverse by the third-order iteration Nystromformer uses (Razavi et al. 2014):
    ``V <- V (13 I - PV (15 I - PV (7 I - PV))) / 4`` from ``V0 = P^T / (||P||_1 ||P||_inf)``. fp32 / fp64."""
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
    norm_1 = p.abs().sum(-2).amax(-1)
    norm_inf = p.abs().sum(-1).amax(-1)
    v = (1.0 / (norm_1 * norm_inf)).unsqueeze(-1).unsqueeze(-1) * p.transpose(-2, -1)
    for _ in range(iters):
        pv = p @ v
        v = 0.25 * v @ (13 * eye - pv @ (15 * eye - pv @ (7 * eye - pv)))
    return v


@ATTENTION.register('nystrom')
class NystromAttention(AttentionKernel):
    """Nystromformer (Xiong et al. 2021): ``A = softmax(s Q Lk^T) pinv(softmax(s Lq Lk^T)) softmax(s Lq K^T)`` with
    landmarks ``Lq``, ``Lk`` the segment means of q and k (m = min(num_landmarks, Nq, Nk)); O(N).
    With m = N the landmarks are the tokens and A is softmax attention. No bias, no mask."""

    complexity = 'linear'
    no_score_map = 'A is a product of three landmark softmaxes: no per-pair score map'

    def __init__(self, num_heads=None, head_dim=None, num_landmarks=64, pinv_iters=6):
        super().__init__(num_heads, head_dim)
        _positive_int('nystrom', 'num_landmarks', num_landmarks)
        _positive_int('nystrom', 'pinv_iters', pinv_iters, 0)
        self.num_landmarks, self.pinv_iters = num_landmarks, pinv_iters

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, num_landmarks={self.num_landmarks}, pinv_iters={self.pinv_iters}'

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        m = min(self.num_landmarks, nq, nk)
        means = m * nq * d + m * nk * d  # the landmarks: segment means as (m, N) averaging products
        kernels = nq * m * d + m * m * d + m * nk * d  # the three softmax blocks' scores
        pinv = self.pinv_iters * 4 * m ** 3  # four m x m products per step
        return means + kernels + pinv + m * nk * dv + m * m * dv + nq * m * dv

    def memory(self, nq, nk, d, dv, masked=False, hw=None):
        m = min(self.num_landmarks, nq, nk)
        # the landmarks (segment means of q and k), the three softmax blocks (scores and weights), the two products
        # with v that end in m rows, and the inverse's steps (autograd runs through them: about six m x m a step)
        blocks = 2 * m * d + 2 * (nq * m + m * m + m * nk) + 2 * m * dv
        return blocks + 6 * self.pinv_iters * m * m, max(nq * m, nk * m, m * m, nq * dv)

    def _factors(self, q, k, scale):
        q, k = upcast(q, k)
        s = default_scale(scale, q.shape[-1], q)
        m = min(self.num_landmarks, q.shape[2], k.shape[2])
        lq, lk = segment_means(q, m), segment_means(k, m)
        k1 = torch.softmax(s * (q @ lk.transpose(-2, -1)), -1)
        k2 = torch.softmax(s * (lq @ lk.transpose(-2, -1)), -1)
        k3 = torch.softmax(s * (lq @ k.transpose(-2, -1)), -1)
        return k1, iterative_pinv(k2, self.pinv_iters), k3

    def _matrix(self, q, k, hw, scale, bias, mask):
        with no_autocast(q):  # softmax blocks and the iterative inverse in fp32
            k1, inv, k3 = self._factors(q, k, scale)
            return k1 @ inv @ k3

    def _forward(self, q, k, v, hw, scale, bias, mask):
        with no_autocast(q):  # softmax blocks and the iterative inverse in fp32
            k1, inv, k3 = self._factors(q, k, scale)
            k1, inv, k3, vv = _to_common(k1, inv, k3, *upcast(v))
            out = k1 @ (inv @ (k3 @ vv))
        return out.to(v.dtype)


# ---------------------------------------------------------------------------------------------- Performer
def orthogonal_gaussian(m, d, generator):
    """(m, d) random features: blocks of orthogonal rows with chi(d)-distributed norms (FAVOR+)."""
    blocks, left = [], m
    while left > 0:
        g = torch.randn(d, d, generator=generator, dtype=torch.float64)
        qmat, _ = torch.linalg.qr(g)
        blocks.append(qmat.T[:min(left, d)])
        left -= d
    w = torch.cat(blocks, 0)
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (w * norms).float()


@ATTENTION.register('performer')
class PerformerAttention(AttentionKernel):
    """Performer FAVOR+ (Choromanski et al. 2021): positive random features
    ``phi(x) = exp(w.x' - |x'|^2/2) / sqrt(m)`` with ``x' = sqrt(s) x``, so ``phi(q).phi(k)`` estimates
    ``exp(s q.k)``; ``A_ij = phi(q_i).phi(k_j) / (sum_j phi(q_i).phi(k_j) + eps)``. The projection (m, d) is a
    fixed, seeded, orthogonal buffer (no redrawing). Needs head_dim. No bias, no mask."""

    complexity = 'linear'

    def __init__(self, num_heads=None, head_dim=None, num_features=None, seed=0, eps=1e-6, impl='auto'):
        super().__init__(num_heads, head_dim)
        self.impl = dispatch.check_order_impl('performer', impl)
        dispatch.forced()
        if head_dim is None:
            raise ValueError('performer: the random projection needs head_dim (got head_dim=None); pass it')
        if num_features is None:
            num_features = max(1, int(round(head_dim * math.log(head_dim)))) if head_dim > 1 else 1
        _positive_int('performer', 'num_features', num_features)
        _positive_int('performer', 'seed', seed, 0)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps < 0:
            raise ValueError(f'performer: eps must be a float >= 0, got {eps!r}')
        self.num_features, self.seed, self.eps = num_features, seed, float(eps)
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer('projection', orthogonal_gaussian(num_features, head_dim, gen))

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, num_features={self.num_features}, seed={self.seed}'

    def order_products(self, nq, nk, d, dv):
        m = self.num_features
        shared = (nq + nk) * d * m  # the projections onto the m random features, in both orders
        # explicit: phi(q) phi(k)^T, A @ v; factorised: the normaliser phi(q) @ sum_j phi(k_j), k^T v and its use
        return shared + nq * nk * (m + dv), shared + nq * m + (nk + nq) * m * dv

    def order_extra(self, nq, nk, d, dv, device='cpu'):
        return nq * nk, 0  # the explicit A's row sums

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return self.order_flops(nq, nk, d, dv, masked)

    def memory(self, nq, nk, d, dv, masked=False, hw=None):
        m = self.num_features
        # per token: the scaled x (d), the projection, the stabilised exponent and the feature (3 m)
        feats = (nq + nk) * (d + 3 * m)
        if self.order(nq, nk, d, dv, masked) == 'explicit':
            # the scores, the row sums and the weights
            return feats + 2 * nq * nk + nq, max(nq * nk, max(nq, nk) * max(m, dv))
        # k^T v, the normaliser and the stabiliser of each query row, the numerator the division keeps
        return feats + m * dv + nq * dv + 2 * nq, max(nq, nk) * max(m, dv)

    def features(self, x, scale, is_query):
        """phi(x) (B, h, N, m) up to a factor that cancels in A: the stabiliser (row max for queries, the
        max over all keys for keys) is detached."""
        x = x * scale ** 0.5
        proj = x @ self.projection.to(x.dtype).transpose(-2, -1)
        expo = proj - 0.5 * (x * x).sum(-1, keepdim=True)
        stab = expo.amax(-1, keepdim=True) if is_query else expo.amax((-2, -1), keepdim=True)
        return torch.exp(expo - stab.detach()) / math.sqrt(self.num_features)

    def _feats(self, q, k, scale):
        q, k = upcast(q, k)
        s = default_scale(scale, q.shape[-1], q)
        return self.features(q, s, True), self.features(k, s, False)

    def _score_map(self, q, k, hw, scale, bias, mask):
        """S = phi(q) phi(k)^T (the stabilisers are constants of a row or of the call, and cancel), normalised per
        row."""
        with no_autocast(q):  # exponentials and sums in fp32
            fq, fk = self._feats(q, k, scale)
            return row_normalised_map(fq @ fk.transpose(-2, -1), None, eps=self.eps)

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def _forward(self, q, k, v, hw, scale, bias, mask):
        with no_autocast(q):  # exponentials and sums in fp32
            fq, fk = self._feats(q, k, scale)
            fq, fk, vv = _to_common(fq, fk, *upcast(v))
            if self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], False, q.device.type) == 'explicit':
                out = row_normalised_map(fq @ fk.transpose(-2, -1), None, eps=self.eps).matrix() @ vv
            else:
                den = fq @ fk.sum(2, keepdim=True).transpose(-2, -1) + self.eps
                out = (fq @ (fk.transpose(-2, -1) @ vv)) / den
        return out.to(v.dtype)


# ---------------------------------------------------------------------------------------------- cosFormer
@ATTENTION.register('cosformer')
class CosFormerAttention(AttentionKernel):
    """cosFormer (Qin et al. 2022): ReLU features re-weighted by position,
    ``A_ij = relu(q_i).relu(k_j) cos(pi/2 (i - j) / M) / (sum_j ... + eps)``, M = max(Nq, Nk), positions 1-based
    in the flattened token order. Computed in O(N) through cos(a - b) = cos a cos b + sin a sin b. The score scale
    is not used (it cancels in the ratio). No bias, no mask."""

    complexity = 'linear'

    def __init__(self, num_heads=None, head_dim=None, eps=1e-6, impl='auto'):
        super().__init__(num_heads, head_dim)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps < 0:
            raise ValueError(f'cosformer: eps must be a float >= 0, got {eps!r}')
        self.eps = float(eps)
        self.impl = dispatch.check_order_impl('cosformer', impl)
        dispatch.forced()

    def order_products(self, nq, nk, d, dv):
        # explicit: the cos and the sin scores, A @ v; factorised: the cos and the sin halves' k^T v and their use
        return nq * nk * (2 * d + dv), 2 * (nk + nq) * d * dv

    def order_extra(self, nq, nk, d, dv, device='cpu'):
        return nq * nk, 2 * nq * d  # the explicit A's row sums; the factorised normaliser, elementwise

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return self.order_flops(nq, nk, d, dv, masked)

    def memory(self, nq, nk, d, dv, masked=False, hw=None):
        feats = 3 * (nq + nk) * d  # relu(q), relu(k) and their cos and sin halves
        if self.order(nq, nk, d, dv, masked) == 'explicit':
            # the summed scores, the row sums and the weights
            return feats + 2 * nq * nk + nq, max(nq * nk, max(nq, nk) * max(d, dv))
        # the cos and sin halves' k^T v, the numerator and the normaliser the division keeps
        return feats + 2 * d * dv + nq * dv + nq, max(nq, nk) * max(d, dv)

    def _feats(self, q, k):
        q, k = upcast(q, k)
        q, k = _to_common(q, k)
        big_m = max(q.shape[2], k.shape[2])

        def angles(n):
            return (math.pi / 2 / big_m) * torch.arange(1, n + 1, dtype=q.dtype, device=q.device).view(n, 1)

        aq, ak = angles(q.shape[2]), angles(k.shape[2])
        fq, fk = F.relu(q), F.relu(k)
        return (fq * torch.cos(aq), fq * torch.sin(aq)), (fk * torch.cos(ak), fk * torch.sin(ak))

    def _score_map(self, q, k, hw, scale, bias, mask):
        """S = relu(q) relu(k)^T cos(pi/2 (i - j) / M), normalised per row."""
        with no_autocast(q):  # sums in fp32
            (qc, qs), (kc, ks) = self._feats(q, k)
            return row_normalised_map(qc @ kc.transpose(-2, -1) + qs @ ks.transpose(-2, -1), None, eps=self.eps)

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def _forward(self, q, k, v, hw, scale, bias, mask):
        with no_autocast(q):  # sums in fp32
            (qc, qs), (kc, ks) = self._feats(q, k)
            qc, qs, kc, ks, vv = _to_common(qc, qs, kc, ks, *upcast(v))
            if self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], False, q.device.type) == 'explicit':
                s = qc @ kc.transpose(-2, -1) + qs @ ks.transpose(-2, -1)
                return (row_normalised_map(s, None, eps=self.eps).matrix() @ vv).to(v.dtype)
            num = qc @ (kc.transpose(-2, -1) @ vv) + qs @ (ks.transpose(-2, -1) @ vv)
            den = (qc * kc.sum(2, keepdim=True)).sum(-1, keepdim=True) + \
                (qs * ks.sum(2, keepdim=True)).sum(-1, keepdim=True) + self.eps
            out = num / den
        return out.to(v.dtype)


# ---------------------------------------------------------------------------------------------- FLatten
@ATTENTION.register('flatten')
class FocusedLinearAttention(AttentionKernel):
    """Focused linear attention (FLatten Transformer, Han et al. 2023). Feature map with focusing power p:
    ``x+ = relu(x) + 1e-6`` divided by a learned per-channel ``softplus`` scale, then
    ``phi(x) = |x+| * x+^p / |x+^p|`` (direction sharpened, norm kept); ``A_ij = phi(q_i).phi(k_j) /
    (phi(q_i).sum_j phi(k_j) + eps)``. ``local_conv=True`` adds a 3x3 depthwise conv of v on the (H, W) grid with
    ONE learned kernel per head (official: one per channel, 5x5), so that it is a term of ``A`` and
    ``out == A @ v`` holds. Needs num_heads and head_dim. No bias, no mask."""

    complexity = 'linear'
    needs_hw = True

    def __init__(self, num_heads=None, head_dim=None, focusing_power=3, local_conv=True, eps=1e-6, impl='auto'):
        super().__init__(num_heads, head_dim)
        self.impl = dispatch.check_order_impl('flatten', impl)
        dispatch.forced()
        if num_heads is None or head_dim is None:
            raise ValueError('flatten: the learned feature scale needs num_heads and head_dim '
                             f'(got num_heads={num_heads}, head_dim={head_dim}); pass both')
        if not isinstance(focusing_power, (int, float)) or isinstance(focusing_power, bool) or focusing_power <= 0:
            raise ValueError(f'flatten: focusing_power must be a number > 0, got {focusing_power!r}')
        if not isinstance(local_conv, bool):
            raise TypeError(f'flatten: local_conv must be True or False, got {local_conv!r}')
        self.focusing_power, self.local_conv, self.eps = focusing_power, local_conv, float(eps)
        self.needs_hw = local_conv
        self.scale = nn.Parameter(torch.zeros(num_heads, 1, head_dim))
        if local_conv:
            self.conv_weight = nn.Parameter(torch.empty(num_heads, 9))
            nn.init.trunc_normal_(self.conv_weight, std=0.1)

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, focusing_power={self.focusing_power}, local_conv={self.local_conv}'

    def order_products(self, nq, nk, d, dv):
        conv = 9 * nq * dv if self.local_conv else 0  # the 3x3 depthwise conv on v, in both orders
        return nq * nk * (d + dv) + conv, (nk + nq) * d * dv + conv  # phi(q) phi(k)^T, A @ v; k^T v, its use

    def order_extra(self, nq, nk, d, dv, device='cpu'):
        return nq * nk, nq * d  # the explicit A's row sums; the factorised normaliser, elementwise

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        return self.order_flops(nq, nk, d, dv, masked)

    def memory(self, nq, nk, d, dv, masked=False, hw=None):
        # the focusing map's steps on q and k: relu + 1e-6, over the learned scale, its power, the feature (and the
        # steps' input, 5 N x d a side), the two norms and their ratio (3 N); the local conv takes v on the grid as a
        # view and keeps nothing of its own
        feats = 5 * (nq + nk) * d + 3 * (nq + nk)
        if self.order(nq, nk, d, dv, masked) == 'explicit':
            # the scores, the row sums and the weights
            return feats + 2 * nq * nk + nq, max(nq * nk, max(nq, nk) * max(d, dv))
        # k^T v, the normaliser, the numerator the division keeps
        return feats + d * dv + nq + nq * dv, max(nq, nk) * max(d, dv)

    def features(self, x):
        x = (F.relu(x) + 1e-6) / F.softplus(self.scale.to(x.dtype))
        powered = x ** self.focusing_power
        return powered * (x.norm(dim=-1, keepdim=True) / powered.norm(dim=-1, keepdim=True))

    def _grid(self, q, k, hw):
        if q.shape[2] != k.shape[2]:
            raise ValueError(f'flatten: the local conv needs as many queries as keys on one (H, W) grid, got '
                             f'Nq={q.shape[2]} and Nk={k.shape[2]}; set local_conv=False for this layout')
        return resolve_hw(self.name, hw, k.shape[2])

    def _score_map(self, q, k, hw, scale, bias, mask):
        """S = phi(q) phi(k)^T normalised per row, plus the local conv's weights (no function of S)."""
        grid = self._grid(q, k, hw) if self.local_conv else None
        q, k = upcast(q, k)
        with no_autocast(q):  # powers, norms and sums in fp32
            fq, fk = self.features(q), self.features(k)
            s = fq @ fk.transpose(-2, -1)
            conv = None
            if self.local_conv:
                w = self.conv_weight.to(s.dtype).view(1, -1, 1, 9)
                conv = torch.einsum('bhio,ioj->bhij', w.expand(1, -1, q.shape[2], 9),
                                    neighbour_onehot(grid, q.device, s.dtype))
            return row_normalised_map(s, None, eps=self.eps, offset=conv)

    def _matrix(self, q, k, hw, scale, bias, mask):
        return self._score_map(q, k, hw, scale, bias, mask).matrix()

    def _forward(self, q, k, v, hw, scale, bias, mask):
        grid = self._grid(q, k, hw) if self.local_conv else None
        q, k, vv = upcast(q, k, v)
        with no_autocast(q):  # powers, norms and sums in fp32
            fq, fk = self.features(q), self.features(k)
            fq, fk, vv = _to_common(fq, fk, vv)
            if self.order(q.shape[2], k.shape[2], q.shape[3], v.shape[3], False, q.device.type) == 'explicit':
                out = row_normalised_map(fq @ fk.transpose(-2, -1), None, eps=self.eps).matrix() @ vv
            else:
                den = (fq * fk.sum(2, keepdim=True)).sum(-1, keepdim=True) + self.eps
                out = (fq @ (fk.transpose(-2, -1) @ vv)) / den
            if self.local_conv:
                out = out + local_conv(vv, self.conv_weight.to(vv.dtype).view(1, -1, 1, 9), grid)
        return out.to(v.dtype)
