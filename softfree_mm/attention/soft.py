"""SOFT: softmax-free attention with a Gaussian kernel and a Nystrom low-rank approximation (Lu et al. 2021).

As the official code computes it: q is scaled FIRST, ``q' = sqrt(s) q`` (= q / d^(1/4) at the default
s = d^-1/2); ``m`` landmark tokens ``L`` are made from q' on the (H, W) grid (strided conv + LayerNorm + GELU) and
are not rescaled; ``K(a, b) = exp(-|a - b|^2 / 2)`` on q' and L; keys tied to the queries, and

    A = K(Q', L) @ inv(K(L, L)) @ K(L, Q'),   out = K(Q', L) @ (inv(K(L, L)) @ (K(L, Q') @ v))   (O(N)),

the inverse by 20 Newton steps on the regularised ``K(L, L) + 0.01 I`` from ``V0 = alpha P``,
``alpha = 1.8 / (max row sum of K(L, L))^2``, computed without gradient; its backward is the inverse's analytic
gradient ``-V^T g V^T`` (the official ``newton_inverse_kernel``). SOFT-Norm (``normalized=True``, the released
"-Norm" models) symmetrically normalises the inverse by the landmark kernel's degrees,
``D^-1/2 inv D^-1/2``, with the official Norm iteration: unregularised, ``alpha = 2 / (max row sum)^2`` over all
matrices of the call, halved (at most 10 times) until ``max column sum |I - P V| <= 1.01``, differentiated through
the steps. ``conv_size`` adds, as the official blocks do (9 / 5 / 3 in stages 1 / 2 / 3), a depthwise conv on v
(one kernel per head, shared by the head's channels): a banded term of ``A``, so ``out == attention_matrix(...) @ v``
still holds. The default (0) is the bare formula; the SOFT set-up configs and ``SoftFreeSOFT`` turn the conv on.

Cost: with a landmark ratio r there are m = N / r^2 landmarks, so K(Q', L) costs N m d (quadratic in N) and the 20
Newton steps 40 m^3 (cubic in N: they dominate at high resolution); with a fixed ``num_landmarks`` everything is
linear in N. ``inverse='cholesky'`` (ours, plain SOFT) replaces the iteration by the exact inverse it converges to,
a Cholesky solve of ``K(L, L) + 0.01 I`` (m^3 / 6).
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import ATTENTION
from .base import AttentionKernel, cast_back, ceil_div, default_scale, grid_for, resolve_hw, upcast, no_autocast

LANDMARK_OPS = ('conv', 'avgpool')
LANDMARK_CELLS = ('floor', 'ceil')
INVERSES = ('newton', 'cholesky')
NEWTON_REG = 0.01  # the official ridge on K(L, L) (plain SOFT)


def gaussian_kernel(a, b, scale=1.0):
    """``exp(-scale/2 * |a_i - b_j|^2)`` as ``exp(s a.b - s|a|^2/2 - s|b|^2/2)``; call it in fp32 or fp64
    (the expansion cancels large terms)."""
    sq_a = (a * a).sum(-1, keepdim=True)
    sq_b = (b * b).sum(-1, keepdim=True).transpose(-2, -1)
    expo = scale * (a @ b.transpose(-2, -1)) - 0.5 * scale * (sq_a + sq_b)
    return torch.exp(expo.clamp_max(0.0))  # exponent is <= 0 in exact arithmetic; clip rounding


def _batched(k_ll, batched: Optional[bool]) -> bool:
    """None: the batched form on CUDA, where each launch of a small matrix costs more than its arithmetic."""
    return k_ll.is_cuda if batched is None else bool(batched)


def _newton_steps(p, v, iters, batched: bool = False):
    """``iters`` steps ``v <- 2 v - v (p v)``. ``batched``: the (.., m, m) matrices as one batch of bmm calls, two
    launches a step (``p v``, then ``2 v - v (p v)`` in one ``baddbmm``) instead of four; the same iterates on any
    device (rounded in another order)."""
    if not batched:
        for _ in range(iters):
            v = 2.0 * v - v @ (p @ v)
        return v
    shape = v.shape
    p3, v3 = p.reshape(-1, *shape[-2:]), v.reshape(-1, *shape[-2:])
    for _ in range(iters):
        v3 = torch.baddbmm(v3, v3, torch.bmm(p3, v3), beta=2.0, alpha=-1.0)
    return v3.reshape(shape)


class _NewtonInverse(torch.autograd.Function):
    """Forward: Newton steps from the official start, without gradient; backward: ``-V^T g V^T``."""

    @staticmethod
    def forward(ctx, k_ll, iters, reg, batched):
        with torch.no_grad():
            eye = torch.eye(k_ll.shape[-1], dtype=k_ll.dtype, device=k_ll.device)
            alpha = 1.8 / k_ll.sum(-1).amax(-1) ** 2  # 0.9 * 2 / (max row sum)^2, per matrix
            p = k_ll + reg * eye
            v = _newton_steps(p, alpha[..., None, None] * p, iters, batched=batched)
        ctx.save_for_backward(v)
        return v

    @staticmethod
    def backward(ctx, grad):
        (v,) = ctx.saved_tensors
        vt = v.transpose(-2, -1)
        return -(vt @ grad @ vt), None, None, None


def newton_inverse(k_ll, iters=20, reg=NEWTON_REG, batched: Optional[bool] = None):
    """The official SOFT inverse of the (.., m, m) landmark kernels ``k_ll``: ``inv(k_ll + reg I)`` by ``iters``
    Newton steps from ``V0 = 1.8 / (max row sum of k_ll)^2 * P``; analytic backward. Run it in fp32 / fp64.
    ``batched``: the steps' batched form (see :func:`_newton_steps`); None: on CUDA only."""
    return _NewtonInverse.apply(k_ll, iters, reg, _batched(k_ll, batched))


def newton_inverse_norm(k_ll, iters=20, batched: Optional[bool] = None):
    """The official SOFT-Norm inverse: unregularised, ``V0 = alpha P`` with ``alpha = 2 / (max row sum)^2`` taken
    over ALL matrices of the call (as the official code: the start couples the images and heads of one call),
    halved at most 10 times until ``max column sum |I - P V0| <= 1.01``; differentiated through the steps.
    ``batched``: as :func:`newton_inverse`."""
    eye = torch.eye(k_ll.shape[-1], dtype=k_ll.dtype, device=k_ll.device)
    alpha = 2.0 / k_ll.sum(-1).max() ** 2
    # the official while-loop, without data-dependent control flow: the first of alpha / 2^j, j = 0..10, whose
    # start passes the test, else alpha / 2^10
    halves = 0.5 ** torch.arange(11, dtype=k_ll.dtype, device=k_ll.device)
    with torch.no_grad():
        pp = k_ll @ k_ll
        norms = (eye - (alpha * halves).view(-1, *([1] * k_ll.dim())) * pp).abs().sum(-2)
        ok = norms.reshape(11, -1).amax(-1) <= 1.01  # (11,)
        ok = torch.cat([ok[:-1], ok.new_ones(1)])
        first = ok & (torch.cumsum(ok.to(torch.int32), 0) == 1)  # one-hot: the first start that passes
        factor = (halves * first.to(halves.dtype)).sum()
    return _newton_steps(k_ll, alpha * factor * k_ll, iters, batched=_batched(k_ll, batched))


def landmark_grid(hw, ratio, num_landmarks, cells='floor'):
    """The (mh, mw) landmark grid: ``H // ratio`` x ``W // ratio`` ('floor', the official strided conv: a last
    partial cell makes no landmark; at least one cell per axis) or ``ceil(H / ratio)`` x ``ceil(W / ratio)``
    ('ceil': partial cells zero-padded); or about ``num_landmarks`` tokens with the grid's aspect ratio."""
    h, w = hw
    if num_landmarks is None:
        if cells == 'floor':
            return max(1, h // ratio), max(1, w // ratio)
        return ceil_div(h, ratio), ceil_div(w, ratio)
    mh = min(h, max(1, int(round(math.sqrt(num_landmarks * h / w)))))
    mw = min(w, max(1, int(round(num_landmarks / mh))))
    return mh, mw


@ATTENTION.register('soft')
class SoftAttention(AttentionKernel):
    """SOFT / SOFT-Norm Gaussian-kernel attention, as the official code.

    Args:
        landmark_ratio: landmarks from ``ratio x ratio`` cells of the (H, W) grid (8 / 4 / 2 by stage officially).
            Ignored when ``num_landmarks`` is set.
        landmark_cells: ``'floor'`` (default, the official strided conv: ``H // ratio`` cells, a last partial cell
            makes no landmark; a grid smaller than the ratio still gives one zero-padded cell, where the official
            code fails) or ``'ceil'`` (ours: partial cells zero-padded (conv) or averaged over their tokens
            (avgpool), so every token feeds a landmark).
        num_landmarks: instead of a ratio, about this many landmarks on an adaptive pooled grid.
        landmark_op: ``'conv'``: strided Conv2d over each head's d channels (kernel = stride = ratio, no bias,
            weights shared by the heads) + LayerNorm (over head_dim) + GELU, as the official code; with
            ``num_landmarks``: adaptive average pooling, then a learned 1x1 conv (d -> d) + LayerNorm + GELU.
            ``'avgpool'``: average pooling only, no parameters.
        newton_iters: Newton steps of the inverse (official 20).
        inverse: ``'newton'`` (default, the official iteration) or ``'cholesky'`` (ours, plain SOFT only): the
            exact ``inv(K(L, L) + 0.01 I)``, the limit the Newton steps converge to, by a Cholesky factorisation
            and solves (``m^3 / 6 + m^2 dv`` multiply-adds instead of ``2 * iters * m^3``; K(L, L) + 0.01 I is
            symmetric positive definite, its eigenvalues at least 0.01), differentiated by torch's own rules.
            SOFT-Norm's inverse is unregularised (K(L, L) can be singular to working precision): Newton only.
        normalized: SOFT-Norm: ``D^-1/2 inv(K(L, L)) D^-1/2`` with the official Norm iteration (see the module).
        tie_qk: keys tied to queries (the paper: the Gaussian attention matrix is then symmetric); k is ignored.
            With False, the right factor is ``K(L, K')`` from the given k, scaled as q.
        conv_size: the depthwise conv on v added to the output (official blocks: 9 / 5 / 3 in stages 1 / 2 / 3);
            odd, or 0 (default) for none. Its weights (num_heads, 1, size, size) are zero-padded at the grid
            border; it needs Nq == Nk == H * W.

    ``scale`` s (default head_dim^-1/2) enters as ``q' = sqrt(s) q``. No bias, no mask. The landmark conv's weights
    need head_dim, the v conv's num_heads.
    """

    supports_bias = False
    supports_mask = False
    # with a landmark ratio m = N / ratio^2 landmarks: K(Q, L) costs N m d (quadratic) and the Newton inverse
    # 2 * iters * m^3 (cubic in N); with a fixed num_landmarks everything is linear (the instance says so)
    complexity = 'cubic'
    needs_hw = True
    no_score_map = 'A = K(Q, L) pinv(K(L, L)) K(L, K), a Nystrom product of Gaussian kernels: no per-pair score map'

    def __init__(self, num_heads=None, head_dim=None, landmark_ratio=8, num_landmarks=None, landmark_op='conv',
                 landmark_cells='floor', newton_iters=20, normalized=False, tie_qk=True, conv_size=0,
                 inverse='newton'):
        super().__init__(num_heads, head_dim)
        if landmark_op not in LANDMARK_OPS:
            raise ValueError(f"soft: unknown landmark_op {landmark_op!r}; valid landmark ops: "
                             f"{', '.join(LANDMARK_OPS)}")
        if landmark_cells not in LANDMARK_CELLS:
            raise ValueError(f"soft: unknown landmark_cells {landmark_cells!r}; valid: {', '.join(LANDMARK_CELLS)}")
        if isinstance(landmark_ratio, bool) or not isinstance(landmark_ratio, int) or landmark_ratio < 1:
            raise ValueError(f'soft: landmark_ratio must be a positive int, got {landmark_ratio!r}')
        if num_landmarks is not None and (isinstance(num_landmarks, bool) or not isinstance(num_landmarks, int)
                                          or num_landmarks < 1):
            raise ValueError(f'soft: num_landmarks must be None or a positive int, got {num_landmarks!r}')
        if isinstance(newton_iters, bool) or not isinstance(newton_iters, int) or newton_iters < 0:
            raise ValueError(f'soft: newton_iters must be an int >= 0, got {newton_iters!r}')
        if isinstance(conv_size, bool) or not isinstance(conv_size, int) or conv_size < 0 or \
                (conv_size and conv_size % 2 == 0):
            raise ValueError(f'soft: conv_size must be an odd positive int or 0 (no conv on v), got {conv_size!r}')
        for arg, val in (('normalized', normalized), ('tie_qk', tie_qk)):
            if not isinstance(val, bool):
                raise TypeError(f'soft: {arg} must be True or False, got {val!r}')
        if inverse not in INVERSES:
            raise ValueError(f"soft: unknown inverse {inverse!r}; valid: {', '.join(INVERSES)}")
        if inverse == 'cholesky' and normalized:
            raise ValueError("soft: inverse='cholesky' solves the regularised K(L, L) + 0.01 I of plain SOFT; "
                             "SOFT-Norm (normalized=True) inverts the unregularised K(L, L): use inverse='newton'")
        self.landmark_ratio = landmark_ratio
        self.num_landmarks = num_landmarks
        self.landmark_op = landmark_op
        self.landmark_cells = landmark_cells
        self.newton_iters = newton_iters
        self.normalized = normalized
        self.tie_qk = tie_qk
        self.conv_size = conv_size
        self.inverse = inverse
        self.complexity = 'linear' if num_landmarks is not None else 'cubic'
        if landmark_op == 'conv':
            if head_dim is None:
                raise ValueError("soft: landmark_op='conv' has learned weights and needs head_dim "
                                 f"(got head_dim={head_dim}); pass it, or use landmark_op='avgpool'")
            size = 1 if num_landmarks is not None else landmark_ratio
            self.landmark_conv = nn.Conv2d(head_dim, head_dim, size, stride=size, bias=False)
            self.landmark_norm = nn.LayerNorm(head_dim)
        if conv_size:
            if num_heads is None:
                raise ValueError(f'soft: conv_size={conv_size} adds a learned depthwise conv on v and needs '
                                 'num_heads; pass it, or set conv_size=0')
            self.v_conv = nn.Conv2d(num_heads, num_heads, conv_size, padding=conv_size // 2, groups=num_heads,
                                    bias=False)

    def extra_repr(self) -> str:
        m = f'num_landmarks={self.num_landmarks}' if self.num_landmarks is not None else \
            f'landmark_ratio={self.landmark_ratio}, landmark_cells={self.landmark_cells!r}'
        return (f'{super().extra_repr()}, {m}, landmark_op={self.landmark_op!r}, newton_iters={self.newton_iters}, '
                f'normalized={self.normalized}, tie_qk={self.tie_qk}, conv_size={self.conv_size}, '
                f'inverse={self.inverse!r}')

    def num_landmark_tokens(self, hw) -> int:
        mh, mw = landmark_grid(hw, self.landmark_ratio, self.num_landmarks, self.landmark_cells)
        return mh * mw

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        """The landmark conv, the Gaussian kernels K(Q, L), K(L, L) (and K(L, K) untied), the inverse (2 m^3 a
        Newton step; SOFT-Norm one more for its start test; Cholesky: m^3 / 6), the three products with v (with
        Cholesky the middle one is its two triangular solves, m^2 / 2 each per column of v), the conv on v. With a
        landmark ratio m ~ N / ratio^2, so the inverse is cubic in N; with a fixed ``num_landmarks`` all is
        linear in N."""
        grid = grid_for(nq, hw)
        m = self.num_landmark_tokens(grid)
        lm = 0
        if self.landmark_op == 'conv':
            lm = m * d * d * (1 if self.num_landmarks is not None else self.landmark_ratio ** 2)
        kern = nq * m * d + m * m * d + (0 if self.tie_qk else m * nk * d)
        if self.inverse == 'cholesky':
            inv = m ** 3 // 6
        else:
            inv = 2 * self.newton_iters * m ** 3 + (m ** 3 if self.normalized else 0)
        conv = self.conv_size ** 2 * nq * dv if self.conv_size else 0
        return lm + kern + inv + (nk + nq) * m * dv + m * m * dv + conv

    def memory(self, nq, nk, d, dv, masked=False, hw=None):
        """The scaled q (its grid for the landmark conv is a view), the landmarks (the conv's output, its layer norm
        with the row statistics, the GELU), the Gaussian kernels K(Q, L) and K(L, L) (each with its exponent), the
        inverse, the products with v; the conv on v keeps v on the grid (a copy where heads > 1). All linear in N with
        a fixed ``num_landmarks``; with a landmark ratio m grows with N, and K(Q, L) with it."""
        grid = grid_for(nq, hw)
        m = self.num_landmark_tokens(grid)
        kern = 2 * nq * m + 2 * m * m + (0 if self.tie_qk else 2 * m * nk + nk * d)  # untied: the scaled k too
        inv = m * m * (2 * self.newton_iters + 1 if self.normalized else 1)
        conv = nq * dv if self.conv_size else 0
        saved = nq * d + 3 * m * d + 2 * m + kern + inv + 2 * m * dv + conv
        padded = 0  # the ratio form zero-pads the grid to whole ratio x ratio cells for its conv, which keeps it
        if self.num_landmarks is None:
            mh, mw = landmark_grid(grid, self.landmark_ratio, None, self.landmark_cells)
            padded = d * mh * mw * self.landmark_ratio ** 2
        return saved + padded, max(nq * m, nq * d, m * m, nq * dv, padded)

    # ------------------------------------------------------------------ pieces
    def landmarks(self, q, hw):
        """(B, h, m, d) landmark tokens from the (already scaled) q (B, h, N, d) on the (H, W) grid."""
        b, nh, n, d = q.shape
        h, w = hw
        grid = q.permute(0, 1, 3, 2).reshape(b * nh, d, h, w)  # every head a batch entry: conv weights shared
        mh, mw = landmark_grid(hw, self.landmark_ratio, self.num_landmarks, self.landmark_cells)
        r = self.landmark_ratio
        if self.num_landmarks is not None:
            pooled = F.adaptive_avg_pool2d(grid, (mh, mw))
        else:
            grid = grid[..., :mh * r, :mw * r]  # 'floor': the last partial cell makes no landmark
            if self.landmark_op == 'avgpool':  # partial cells ('ceil', or a grid below the ratio) average their tokens
                pooled = F.avg_pool2d(grid, r, r, ceil_mode=True)
            else:
                pooled = F.pad(grid, (0, mw * r - grid.shape[-1], 0, mh * r - grid.shape[-2]))  # zero-pad cells
        if self.landmark_op == 'conv':
            pooled = F.conv2d(pooled, self.landmark_conv.weight.to(q.dtype), stride=self.landmark_conv.stride)
        lm = pooled.reshape(b, nh, d, mh * mw).permute(0, 1, 3, 2)
        if self.landmark_op == 'conv':
            lm = F.gelu(F.layer_norm(lm, self.landmark_norm.normalized_shape, self.landmark_norm.weight.to(q.dtype),
                                     self.landmark_norm.bias.to(q.dtype), self.landmark_norm.eps))
        return lm

    def conv_v(self, v, hw):
        """The depthwise conv on v (B, h, N, dv) laid out on the (H, W) grid, one kernel per head."""
        b, nh, n, dv = v.shape
        h, w = resolve_hw(self.name, hw, n)
        grid = v.permute(0, 3, 1, 2).reshape(b * dv, nh, h, w)  # heads as conv channels, dv into the batch
        out = F.conv2d(grid, self.v_conv.weight.to(v.dtype), padding=self.conv_size // 2, groups=nh)
        return out.reshape(b, dv, nh, n).permute(0, 2, 3, 1)

    def _check_conv(self, q, k):
        if self.conv_size and q.shape[2] != k.shape[2]:
            raise ValueError(f'soft: the conv on v (conv_size={self.conv_size}) needs as many queries as keys on one '
                             f'(H, W) grid, got Nq={q.shape[2]} and Nk={k.shape[2]}; set conv_size=0')

    def _factors(self, q, k, hw, scale):
        """K(Q', L), ``solve`` (x -> inverse @ x, the (normalised) inverse of K(L, L)) and K(L, K'), in fp32 /
        fp64."""
        if self.tie_qk and q.shape[2] != k.shape[2]:
            raise ValueError(f'soft: tie_qk=True replaces the keys by the queries, so Nq must equal Nk; got '
                             f'Nq={q.shape[2]}, Nk={k.shape[2]} (set tie_qk=False)')
        grid = resolve_hw(self.name, hw, q.shape[2])
        q, k = upcast(q, k)
        s = default_scale(scale, q.shape[-1], q)
        root = math.sqrt(s) if isinstance(s, float) else s.sqrt()
        q = q * root  # the official order: scale first, landmarks from the scaled q, not rescaled
        lm = self.landmarks(q, grid)
        k_ql = gaussian_kernel(q, lm)  # (B, h, N, m)
        k_ll = gaussian_kernel(lm, lm)  # (B, h, m, m)
        k_lk = k_ql.transpose(-2, -1) if self.tie_qk else gaussian_kernel(lm, k * root)
        if self.inverse == 'cholesky':
            # the limit of the Newton steps, exactly: K(L, L) + 0.01 I = C C^T, x -> C^-T C^-1 x
            eye = torch.eye(k_ll.shape[-1], dtype=k_ll.dtype, device=k_ll.device)
            chol = torch.linalg.cholesky(k_ll + NEWTON_REG * eye)
            return k_ql, (lambda x: torch.cholesky_solve(x.to(chol.dtype), chol).to(x.dtype)), k_lk
        if self.normalized:
            # SOFT-Norm: D = diag of the row sums of K(L, L) (the landmark kernel's degrees), as the official code
            d_inv_sqrt = k_ll.sum(-1, keepdim=True).rsqrt()  # (B, h, m, 1), row sums >= 1 (diagonal is 1)
            inv = d_inv_sqrt * newton_inverse_norm(k_ll, self.newton_iters) * d_inv_sqrt.transpose(-2, -1)
        else:
            inv = newton_inverse(k_ll, self.newton_iters)
        return k_ql, (lambda x: inv.to(x.dtype) @ x), k_lk

    # ------------------------------------------------------------------ API
    def _matrix(self, q, k, hw, scale, bias, mask):
        self._check_conv(q, k)
        with no_autocast(q):  # Gaussian kernel and Newton iteration in fp32
            k_ql, solve, k_lk = self._factors(q, k, hw, scale)
            a = k_ql @ solve(k_lk)
            if self.conv_size:  # the conv's banded matrix: the conv applied to the identity's columns
                n = k.shape[2]
                eye = torch.eye(n, dtype=a.dtype, device=a.device).expand(1, self.num_heads, n, n)
                a = a + self.conv_v(eye, hw)
            return a

    def _forward(self, q, k, v, hw, scale, bias, mask):
        self._check_conv(q, k)
        dtype = v.dtype
        with no_autocast(q):  # Gaussian kernel and Newton iteration in fp32
            k_ql, solve, k_lk = self._factors(q, k, hw, scale)
            (v,) = upcast(v)
            dt = torch.promote_types(k_ql.dtype, v.dtype)
            k_ql, k_lk, v = k_ql.to(dt), k_lk.to(dt), v.to(dt)
            out = k_ql @ solve(k_lk @ v)
            if self.conv_size:
                out = out + self.conv_v(v, hw)
        return cast_back(out, dtype)  # overflow shows as inf (fp16 loss scaling)
