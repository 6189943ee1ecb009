"""Agent attention (Han et al., ECCV 2024, LeapLabTHU/Agent-Attention): softmax attention through n agent tokens.

The agents are the queries average-pooled on the (H, W) token grid to a small grid (``agent_num`` = p x p agents in
the classification models; ``downstream_agent_shape`` in the detection / segmentation set-ups). Two softmaxes:

* agent aggregation: ``agent_attn = softmax(s * a @ k^T + B_an)`` (n x Nk), ``agent_v = agent_attn @ v``;
* agent broadcast: ``q_attn = softmax(s * q @ a^T + B_na)`` (Nq x n), ``out = q_attn @ agent_v``;

plus a depthwise convolution of v on the grid (``dwc``, ``kernel_size`` x ``kernel_size``, one kernel per channel),
added to the output. Time and memory are linear in N for a fixed agent count; ``A = q_attn @ agent_attn`` is the
explicit weight matrix (``attention_matrix``), which the forward never builds.

The agent biases (the official names): ``an_bias`` / ``na_bias`` (heads, agent_num, 7, 7) resized bilinearly to the
token grid, ``ah_bias`` + ``aw_bias`` (agents x grid rows + agents x grid columns) and ``ha_bias`` + ``wa_bias`` at
the grid ``window_size`` they were trained at. On another grid they are resized bilinearly to it, and when the agent
grid is not the p x p one they were trained with (``downstream_agent_shape``), their agent axis is resized bilinearly
to it: the official detection / segmentation backbones' rule (downstream/*/backbones/agent_swin.py, agent_pvt.py).
At the training grid and agent count every resize is the identity and this is the classification models' attention.

Official facts kept: the score scale multiplies q and the agents (head_dim^-1/2), the biases are added before each
softmax, the dwc is a ``Conv2d(C, C, k, padding=k // 2, groups=C)`` with a bias over all heads' channels of v.
The official classification code takes no mask (Swin's agent blocks run on a global window): neither does this
kernel. Keys on another grid than the queries (PVT's spatial reduction) are refused: the released models use none.
"""
import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import ATTENTION
from .base import AttentionKernel, default_scale, no_autocast, resolve_hw, work_dtype

BIAS_GRID = 7  # an_bias / na_bias are (heads, agents, 7, 7) in every official model


def _pair(name, value, what):
    given = value
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value)):
        raise ValueError(f'agent: {name} must be a positive int or a pair of them ({what}), got {given!r}')
    return tuple(value)


def _resize(x: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of (h, agents, H, W) to ``size`` (align_corners=False, as the official code); the identity at
    the same size (skipped)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=tuple(size), mode='bilinear')


@ATTENTION.register('agent')
class AgentAttention(AttentionKernel):
    """Agent attention.

    Args:
        agent_num: agents of the trained model, a square p x p (9, 16, 49 in the releases); the shape of the biases.
        window_size: the token grid the biases ``ah/aw/ha/wa_bias`` were trained at (int or (H, W)): the stage's
            grid at 224 input in the releases (Swin 56 / 28 / 14 / 7 with window 56; PVT the same).
        downstream_agent_shape: the agent grid pooled at run time, (a_h, a_w); None: (p, p). The official
            detection / segmentation set-ups raise it per stage (Swin 9x9 / 12x12 / 14x14 / 7x7, PVT 12x12 / 16x16 /
            28x28 / 28x28) and resize the biases' agent axis to it.
        kernel_size: the depthwise convolution of v (``dwc``); 0: none (the CSWin releases use their LePE conv
            instead, which the backbone holds).
        agent_bias: False leaves the six agent biases out (the paper's ablation); the releases have them.

    Needs ``num_heads`` and ``head_dim`` (the biases are per head, the dwc over all heads' channels) and the token
    grid (``hw``, or a square grid when N is a perfect square), with as many keys as queries on it.
    """

    supports_bias = False
    supports_mask = False
    complexity = 'linear'
    needs_hw = True
    no_score_map = ('A = softmax(q a^T + B_na) softmax(a k^T + B_an) through agent tokens a pooled from q: a product '
                    'of two softmaxes, no per-pair score map')

    def __init__(self, num_heads=None, head_dim=None, agent_num: int = 49,
                 window_size: Union[int, Sequence[int]] = 7,
                 downstream_agent_shape: Optional[Sequence[int]] = None, kernel_size: int = 3,
                 agent_bias: bool = True):
        super().__init__(num_heads, head_dim)
        if num_heads is None or head_dim is None:
            raise ValueError('agent: the agent biases and the depthwise conv are learned per head and channel and need '
                             f'num_heads and head_dim (got num_heads={num_heads}, head_dim={head_dim})')
        p = math.isqrt(agent_num) if isinstance(agent_num, int) and not isinstance(agent_num, bool) else 0
        if p < 1 or p * p != agent_num:
            raise ValueError(f'agent: agent_num must be a square number of agents (p x p: 9, 16, 49, ...), got '
                             f'{agent_num!r}')
        self.agent_num, self.pool_size = agent_num, (p, p)
        self.window_size = _pair('window_size', window_size, 'the token grid the biases were trained at')
        self.downstream_agent_shape = (self.pool_size if downstream_agent_shape is None else
                                       _pair('downstream_agent_shape', downstream_agent_shape,
                                             'the agent grid pooled at run time'))
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 0 or (
                kernel_size and kernel_size % 2 == 0):
            raise ValueError(f'agent: kernel_size must be an odd positive int (the depthwise conv on v) or 0 (none), '
                             f'got {kernel_size!r}')
        if not isinstance(agent_bias, bool):
            raise ValueError(f'agent: agent_bias must be True or False, got {agent_bias!r}')
        self.kernel_size, self.agent_bias = kernel_size, agent_bias
        self.matrix_is_complete = not kernel_size
        h, (wh, ww) = num_heads, self.window_size
        if agent_bias:  # the official shapes; trunc_normal(std=.02) as the official init
            self.an_bias = nn.Parameter(torch.zeros(h, agent_num, BIAS_GRID, BIAS_GRID))
            self.na_bias = nn.Parameter(torch.zeros(h, agent_num, BIAS_GRID, BIAS_GRID))
            self.ah_bias = nn.Parameter(torch.zeros(1, h, agent_num, wh, 1))
            self.aw_bias = nn.Parameter(torch.zeros(1, h, agent_num, 1, ww))
            self.ha_bias = nn.Parameter(torch.zeros(1, h, wh, 1, agent_num))
            self.wa_bias = nn.Parameter(torch.zeros(1, h, 1, ww, agent_num))
            for p_ in (self.an_bias, self.na_bias, self.ah_bias, self.aw_bias, self.ha_bias, self.wa_bias):
                nn.init.trunc_normal_(p_, std=.02)
        if kernel_size:
            c = num_heads * head_dim
            self.dwc = nn.Conv2d(c, c, kernel_size, padding=kernel_size // 2, groups=c)

    def extra_repr(self) -> str:
        return (f'{super().extra_repr()}, agent_num={self.agent_num}, window_size={self.window_size}, '
                f'downstream_agent_shape={self.downstream_agent_shape}, kernel_size={self.kernel_size}, '
                f'agent_bias={self.agent_bias}')

    # ------------------------------------------------------------------ declarations
    @property
    def agents(self) -> int:
        """Agents pooled at run time."""
        return self.downstream_agent_shape[0] * self.downstream_agent_shape[1]

    def describe_path(self, q, k, v, bias=None, mask=None) -> str:
        return f'{self.agents} agent tokens'

    def flops(self, nq, nk, d, dv, masked=False, hw=None):
        """a k^T and agent_attn @ v (n agents x Nk), q a^T and q_attn @ agent_v (Nq x n), and the depthwise conv on
        v (k^2 per token and channel). Pooling, bias resizes and softmaxes are not counted."""
        n = self.agents
        return n * nk * (d + dv) + nq * n * (d + dv) + self.kernel_size ** 2 * nk * dv

    def memory(self, nq, nk, d, dv, masked=False, hw=None):
        """Kept for backward: the two softmaxes (n x Nk, Nq x n), the scaled q, the pooled agents, their scaled copy
        and their values (n x dv); the bias resizes are added, not kept, and the dwc takes v on the grid as a view.
        The largest tensor is one of the maps, the output, or a head's agent_num x 7 x 7 bias tables summed (shared
        by the batch; they dominate on grids smaller than 7 x 7)."""
        n = self.agents
        table = self.agent_num * BIAS_GRID ** 2 if self.agent_bias else 0
        return (n * nk + nq * n + nq * d + 2 * n * d + n * dv,
                max(n * nk, nq * n, nq * max(d, dv), table))

    # ------------------------------------------------------------------ pieces
    def _grid(self, q, k, hw):
        if q.shape[2] != k.shape[2]:
            raise ValueError(f'agent: needs the keys on the queries\' (H, W) grid, got Nq={q.shape[2]} and '
                             f'Nk={k.shape[2]}; run it without spatial reduction (PVT: sr_ratios=1, as the releases)')
        return resolve_hw(self.name, hw, k.shape[2])

    def _agent_axis(self, x, n_tokens):
        """(h, agent_num, N) -> (h, n, N): the bias's agent axis (p x p) resized to the agent grid."""
        h = x.shape[0]
        if self.downstream_agent_shape == self.pool_size:
            return x
        grid = x.reshape(h, *self.pool_size, n_tokens).permute(0, 3, 1, 2)  # (h, N, p, p)
        grid = F.interpolate(grid, size=self.downstream_agent_shape, mode='bilinear')
        return grid.reshape(h, n_tokens, self.agents).transpose(1, 2)

    def biases(self, hw, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(B_an (h, n, N), B_na (h, N, n))`` on the grid ``hw`` for the run-time agents, in ``dtype``."""
        hh, ww = int(hw[0]), int(hw[1])
        n_tok = hh * ww
        ah, aw, ha, wa = (t[0].to(dtype) for t in (self.ah_bias, self.aw_bias, self.ha_bias, self.wa_bias))
        an = _resize(self.an_bias.to(dtype), (hh, ww)) + _resize(ah + aw, (hh, ww))
        na = _resize(self.na_bias.to(dtype), (hh, ww)) + _resize((ha + wa).permute(0, 3, 1, 2), (hh, ww))
        h = an.shape[0]
        an = self._agent_axis(an.reshape(h, self.agent_num, n_tok), n_tok)
        na = self._agent_axis(na.reshape(h, self.agent_num, n_tok), n_tok)
        return an, na.transpose(1, 2)

    def agent_tokens(self, q, grid):
        """q (B, h, N, d) average-pooled on the grid to the agent grid: (B, h, n, d), agents in row-major order."""
        b, nh, n, d = q.shape
        x = q.transpose(2, 3).reshape(b * nh, d, *grid)
        a = F.adaptive_avg_pool2d(x, self.downstream_agent_shape)
        return a.reshape(b, nh, d, self.agents).transpose(2, 3)

    def _conv(self, v, grid):
        """The depthwise conv of v (B, h, N, d) on the grid, over all heads' channels as the official Conv2d."""
        b, nh, n, d = v.shape
        if nh * d != self.dwc.in_channels:
            raise ValueError(f'agent: the depthwise conv is built for {self.dwc.in_channels} channels of v '
                             f'(num_heads x head_dim), got {nh} heads of {d}')
        x = v.permute(0, 1, 3, 2).reshape(b, nh * d, *grid)
        y = F.conv2d(x, self.dwc.weight.to(v.dtype), self.dwc.bias.to(v.dtype), padding=self.kernel_size // 2,
                     groups=nh * d)
        return y.reshape(b, nh, d, n).transpose(2, 3)

    def _softmaxes(self, q, k, grid, scale):
        """The two attention maps, (B, h, n, Nk) and (B, h, Nq, n), in q's (working) dtype."""
        s = default_scale(scale, q.shape[-1], q)
        a = self.agent_tokens(q, grid)
        agent_scores = (a * s) @ k.transpose(-2, -1)
        query_scores = (q * s) @ a.transpose(-2, -1)
        if self.agent_bias:
            an, na = self.biases(grid, q.dtype)
            agent_scores = agent_scores + an
            query_scores = query_scores + na
        return query_scores.softmax(-1), agent_scores.softmax(-1)

    # ------------------------------------------------------------------ API
    def _matrix(self, q, k, hw, scale, bias, mask):
        grid = self._grid(q, k, hw)
        q, k = q.to(work_dtype(q)), k.to(work_dtype(k))
        with no_autocast(q):  # softmaxes in fp32
            q_attn, agent_attn = self._softmaxes(q, k.to(q.dtype), grid, scale)
            return q_attn @ agent_attn

    def residual_output(self, q, k, v, hw=None, scale=None, bias=None, mask=None, context=None):
        """``out - attention_matrix(...) @ v``: the depthwise conv of v (zero with kernel_size=0)."""
        self._check(q, k, v, hw, scale, bias, mask)
        if not self.kernel_size:
            return super().residual_output(q, k, v, hw, scale, bias, mask, context)
        grid = self._grid(q, k, hw)
        with no_autocast(v):
            return self._conv(v.to(work_dtype(v)), grid).to(v.dtype)

    def _forward(self, q, k, v, hw, scale, bias, mask):
        grid = self._grid(q, k, hw)
        dtype = v.dtype
        dt = torch.promote_types(work_dtype(q), work_dtype(v))
        with no_autocast(q):  # softmaxes and sums in fp32
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            q_attn, agent_attn = self._softmaxes(q, k, grid, scale)
            out = q_attn @ (agent_attn @ v)
            if self.kernel_size:
                out = out + self._conv(v, grid)
        return out.to(dtype)
