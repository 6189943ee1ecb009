"""``KernelAttention``: input projections -> the kernel call -> output projection, the one attention layer of every
backbone. A family's layout (windows, stripes, spatial reduction, channels) is a thin subclass that decides which
tokens meet and hands ``q, k, v`` (and ``hw``, a score bias, a mask, a context) to :meth:`KernelAttention.attend`;
the kernel decides how they mix. Parameter names are those of each family's released checkpoints."""
from typing import Optional, Tuple

import torch
from torch import nn

from ..attention import build_attention
from ..attention.base import mix

INPUTS = ('qkv', 'q_kv', 'q_v', None)
_SAME = object()


class KernelAttention(nn.Module):
    """Multi-head attention through a swappable kernel.

    Args:
        dim: channels in and out; ``num_heads`` must divide it.
        attn_cfg: the kernel config (a validated dict).
        owner, where: the backbone and the place, for errors ('SoftFreeSwin', 'stage 0').
        inputs: the input projections: 'qkv' (one fused Linear), 'q_kv' (``q`` apart from ``kv``, whose tokens
            may differ from the queries'), 'q_v' (keys tied to queries, SOFT), None (the caller projects: CSWin's
            branches share their block's).
        qkv_bias: bias of the input projections; out_proj: build the output projection ``proj``.
        build_kernel: False when the layout adds the kernel itself (:meth:`add_kernel`) after its own modules,
            keeping the parameter order of its released checkpoints and of saved optimiser states.
        scale: the factor on q.k handed to the kernel (None: head_dim ** -0.5).
    """

    def __init__(self, dim: int, num_heads: int, attn_cfg: dict, *, owner: str, where: str = '',
                 inputs: Optional[str] = 'qkv', qkv_bias: bool = True, out_proj: bool = True,
                 build_kernel: bool = True, scale: Optional[float] = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'{owner}: {where + ": " if where else ""}embed dims {dim} must be divisible by '
                             f'num_heads={num_heads}')
        if inputs not in INPUTS:
            raise ValueError(f'{owner}: inputs must be one of {INPUTS}, got {inputs!r}')
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.inputs = inputs
        self.scale = scale
        if inputs == 'qkv':
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        elif inputs is not None:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            if inputs == 'q_kv':
                self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
            else:
                self.v = nn.Linear(dim, dim, bias=qkv_bias)
        if build_kernel:
            self.add_kernel(attn_cfg)
        self.proj = nn.Linear(dim, dim) if out_proj else None

    def add_kernel(self, attn_cfg: dict, head_dim=_SAME) -> nn.Module:
        """Build the kernel for these heads (``head_dim``: the kernel's, when it is not the heads' own)."""
        self.kernel = build_attention(attn_cfg, num_heads=self.num_heads,
                                      head_dim=self.head_dim if head_dim is _SAME else head_dim)
        return self.kernel

    # ------------------------------------------------------------------ shapes
    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, h * d) projections -> (B, h, N, d)."""
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def split_qkv(self, qkv: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, N, 3 * h * d) fused projections -> q, k, v (B, h, N, d)."""
        b, n, _ = qkv.shape
        return qkv.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    @staticmethod
    def merge(out: torch.Tensor) -> torch.Tensor:
        """(B, h, N, d) kernel output -> (B, N, h * d)."""
        b, h, n, d = out.shape
        return out.transpose(1, 2).reshape(b, n, h * d)

    # ------------------------------------------------------------------ the three steps
    def project(self, x: torch.Tensor, kv: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
        """q, k, v (B, h, N, d) of the tokens ``x`` (B, N, C); keys and values from ``kv`` when given ('q_kv')."""
        if self.inputs == 'qkv':
            return self.split_qkv(self.qkv(x))
        q = self.heads(self.q(x))
        if self.inputs == 'q_v':
            return q, q, self.heads(self.v(x))
        y = x if kv is None else kv
        k, v = self.kv(y).view(y.shape[0], -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def context(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """What a context-taking kernel gets (InLine's official residual): the mean of the tokens ``x`` (B, N, C)."""
        return x.mean(1) if self.kernel.takes_context else None

    def attend(self, q, k, v, hw=None, bias=None, mask=None, context=None) -> torch.Tensor:
        """The kernel call with what this place declares: the token grid ``hw``, a score bias, a keep-mask, a
        context (only to kernels that take one)."""
        return mix(self.kernel, q, k, v, hw, self.scale, bias, mask, context=context)

    def forward(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        """Global attention over the tokens ``x`` (B, N, C); ``hw``: their grid (None: none)."""
        q, k, v = self.project(x)
        return self.proj(self.merge(self.attend(q, k, v, hw=hw, context=self.context(x))))
