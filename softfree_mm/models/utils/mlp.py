"""The transformer MLPs: timm's ``Mlp`` and PVTv2's depthwise-conv MLP, with the GELU in place at inference and,
in training, only the hidden pre-activation kept for backward."""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .tokens import grid_view, token_view


def gelu_inference(x: torch.Tensor, act: nn.Module) -> torch.Tensor:
    """``act(x)``; for an ``nn.GELU`` when nothing will take a gradient through ``x`` (inference), in place: an
    out-of-place GELU on the CPU allocates (and page-faults) a fresh hidden-size buffer on every call, which costs
    about three times the activation itself. ``x`` must be a temporary nobody else reads."""
    if type(act) is nn.GELU and not (torch.is_grad_enabled() and x.requires_grad) and not act._forward_hooks \
            and not act._forward_pre_hooks and not torch.jit.is_tracing() and not torch.jit.is_scripting():
        return torch.ops.aten.gelu_(x, approximate=act.approximate)
    return act(x)


class _GeluLinear(torch.autograd.Function):
    """``linear(gelu(h), weight, bias)`` keeping only ``h`` for backward (autograd would keep ``h`` for the GELU and
    ``gelu(h)`` for the linear layer: two hidden-size tensors, the largest activations of a transformer block). The
    backward pass evaluates ``gelu(h)`` again for the weight gradient: one elementwise pass over the hidden
    activations. Under autocast the forward's casts are repeated (the product in the forward's dtype, gradients
    returned in the inputs' dtypes)."""

    @staticmethod
    def forward(ctx, h, weight, bias, approximate):
        y = F.linear(F.gelu(h, approximate=approximate), weight, bias)
        ctx.save_for_backward(h, weight)
        ctx.approximate = approximate
        ctx.dtype = y.dtype
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        h, weight = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        g = grad.to(ctx.dtype).reshape(-1, grad.shape[-1])
        gh = gw = gb = None
        # one hidden-size buffer serves as gelu(h), then dL/d gelu(h), then dL/dh (autograd's own backward would
        # allocate two, and a fresh large buffer costs page faults on the CPU); not when the backward builds a graph
        # (backward(create_graph=True): differentiable ops, no buffer written twice)
        lean = not torch.is_grad_enabled()
        a = F.gelu(h, approximate=ctx.approximate) if need_w else torch.empty_like(h) if lean else None
        if need_w:
            gw = (g.t() @ a.reshape(-1, a.shape[-1]).to(ctx.dtype)).to(weight.dtype)
        if need_b and ctx.has_bias:
            gb = g.sum(0).to(ctx.bias_dtype)
        if need_h:
            w = weight.to(ctx.dtype)
            if lean and a.dtype == ctx.dtype and a.is_contiguous():
                ga = torch.mm(g, w, out=a.view(-1, a.shape[-1])).view(h.shape)
                gh = torch.ops.aten.gelu_backward.grad_input(ga, h, approximate=ctx.approximate, grad_input=ga)
            else:
                ga = (g @ w).view(h.shape).to(h.dtype)
                gh = torch.ops.aten.gelu_backward(ga, h, approximate=ctx.approximate)
        return gh, gw, gb, None


def _global_module_hooks() -> bool:
    """True when forward hooks are registered for every module (``nn.modules.module.register_module_forward_hook``)."""
    m = nn.modules.module
    return bool(getattr(m, '_global_forward_hooks', None) or getattr(m, '_global_forward_pre_hooks', None))


def gelu_linear(h: torch.Tensor, act: nn.Module, fc: nn.Module) -> torch.Tensor:
    """``fc(act(h))`` for a hidden activation ``h`` nobody else reads. Training with a plain ``nn.GELU`` and
    ``nn.Linear`` (no forward hooks on either, nor on every module) keeps only ``h`` for backward
    (:class:`_GeluLinear`); inference runs the GELU in place (:func:`gelu_inference`)."""
    if (type(act) is nn.GELU and type(fc) is nn.Linear and torch.is_grad_enabled()
            and (h.requires_grad or fc.weight.requires_grad) and h.shape[-1] == fc.in_features
            and not (act._forward_hooks or act._forward_pre_hooks or fc._forward_hooks or fc._forward_pre_hooks
                     or _global_module_hooks())
            and not (torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling()
                     or torch.compiler.is_exporting())):
        return _GeluLinear.apply(h, fc.weight, fc.bias, act.approximate)
    return fc(gelu_inference(h, act))


class Mlp(nn.Module):
    """timm's ``Mlp`` (fc1 -> act -> drop -> fc2 -> drop, the same parameter names and arguments used here), with
    the activation in place at inference (:func:`gelu_inference`), and in training without dropout only the
    hidden pre-activation kept for backward (:func:`gelu_linear`)."""

    def __init__(self, in_features: int, hidden_features: Optional[int] = None, out_features: Optional[int] = None,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0):
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        h = self.fc1(x)
        if self.drop1.p == 0 or not self.training:
            return self.drop2(gelu_linear(h, self.act, self.fc2))
        return self.drop2(self.fc2(self.drop1(gelu_inference(h, self.act))))


class DWConvMlp(nn.Module):
    """PVTv2 MLP: fc1 -> (ReLU for linear SRA) -> depthwise 3x3 on the grid -> GELU -> fc2."""

    def __init__(self, dim, hidden, extra_relu):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.relu = nn.ReLU() if extra_relu else nn.Identity()
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x, hw):
        x = self.relu(self.fc1(x))
        b, n, c = x.shape
        x = token_view(self.dwconv(grid_view(x, hw)))
        return gelu_linear(x, self.act, self.fc2)  # x: a view of the conv's fresh output
