"""What two or more backbones share: the backbone base class (``pretrained``, Pretrained loading), attention-config
expansion, kernel fit checks, token-grid helpers, checks of OpenMMLab argument names."""
import functools
import numbers
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import normalize_cfg
from ..attention.fit import require_kernel_fit  # noqa: F401  (the backbones import it from here)

AttnCfg = Union[str, dict, None]


def expand_attn_cfg(attn_cfg: Union[AttnCfg, Sequence[AttnCfg]], num: int, unit: str, owner: str) -> List[dict]:
    """One kernel config for every unit, or a list/tuple with exactly one per unit (stage or layer).

    Returns ``num`` validated config dicts (each a fresh copy). Errors name the bad value and what is valid.
    """
    if isinstance(attn_cfg, (list, tuple)):
        if len(attn_cfg) != num:
            raise ValueError(f'{owner}: attn_cfg is a list of {len(attn_cfg)} kernel configs but the model has '
                             f'{num} {unit}s; give one config for all, or exactly {num} (one per {unit})')
        cfgs = list(attn_cfg)
    else:
        cfgs = [attn_cfg] * num
    out = []
    for i, cfg in enumerate(cfgs):
        try:
            out.append(normalize_cfg(cfg))
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f'{owner}: attn_cfg for {unit} {i}: {e}') from None
    return out


def expand_per_block(value, depths: Sequence[int], name: str, owner: str, kind=None) -> List[list]:
    """One value for every block; or a list/tuple with one entry per stage, each entry one value for the stage's
    blocks or a list/tuple with exactly one per block. ``kind=None``: kernel configs (validated, fresh copies);
    else each value must be an instance of ``kind``. Returns one list per stage with one value per block."""
    num = len(depths)
    if isinstance(value, (list, tuple)):
        if len(value) != num:
            what = f'is a list of {len(value)} kernel configs' if kind is None else \
                f'={tuple(value)!r} has {len(value)} entries'
            raise ValueError(f'{owner}: {name}{" " if kind is None else ""}{what} but the model has {num} stages; '
                             f'give one for all, or exactly {num} (one per stage; a stage\'s entry may be a list '
                             'with one per block)')
        stages = list(value)
    else:
        stages = [value] * num
    out = []
    for i, (v, depth) in enumerate(zip(stages, depths)):
        if isinstance(v, (list, tuple)):
            if len(v) != depth:
                raise ValueError(f'{owner}: {name} for stage {i} is a list of {len(v)} but the stage has {depth} '
                                 f'blocks; give one value for the stage or exactly {depth}')
            blocks = list(v)
        else:
            blocks = [v] * depth
        vals = []
        for j, b in enumerate(blocks):
            if kind is None:
                try:
                    vals.append(normalize_cfg(b))
                except (KeyError, TypeError, ValueError) as e:
                    raise type(e)(f'{owner}: {name} for stage {i}: {e}') from None
            else:
                if not isinstance(b, kind):
                    raise TypeError(f'{owner}: {name} entries must be {kind.__name__}, got {b!r}')
                vals.append(b)
        out.append(vals)
    return out


def padded_key_mask(valid_hw, padded_hw, device) -> torch.Tensor:
    """(Hp*Wp,) bool: True for real tokens of a grid padded bottom/right from ``valid_hw`` to ``padded_hw``."""
    (h, w), (hp, wp) = valid_hw, padded_hw
    m = torch.zeros(hp, wp, dtype=torch.bool, device=device)
    m[:h, :w] = True
    return m.flatten()


def grid_view(x: torch.Tensor, hw) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) in channels-last memory: a view of contiguous tokens, no copy. Convolutions
    on it run channels-last (oneDNN's fastest CPU layout, and the GPU's), and :func:`token_view` turns their output
    back into tokens without a copy. (``x.transpose(1, 2).reshape(B, C, H, W)`` has the same strides, but
    convolutions answer it in NCHW, and the copies back and forth, forward and backward, cost more than the conv.)"""
    b, n, c = x.shape
    return x.reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2)


def token_view(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H * W, C) tokens; a view when ``x`` is channels-last (see :func:`grid_view`)."""
    b, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, h * w, c)


def identity_mask(n: int, device) -> torch.Tensor:
    """(n, n) bool identity, built by comparison (ONNX Runtime has no boolean EyeLike)."""
    i = torch.arange(n, device=device)
    return i[:, None] == i[None, :]


# ---------------------------------------------------------------------- window / stage helpers (Swin, CSwin)
def _to_windows(x: torch.Tensor, wh: int, ww: int) -> torch.Tensor:
    """(B, H, W, C) with H % wh == W % ww == 0 -> (B * nW, wh * ww, C), windows in row-major order."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, c)


def _from_windows(x: torch.Tensor, wh: int, ww: int, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`_to_windows`: (B * nW, wh * ww, C) -> (B, H, W, C)."""
    c = x.shape[-1]
    x = x.view(-1, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


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
    ``nn.Linear`` (no forward hooks on either, nor on every module) keeps only ``h`` for backward (:class:`_GeluLinear`); inference runs the GELU
    in place (:func:`gelu_inference`)."""
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


class _RowGather(torch.autograd.Function):
    """``out = x[index]`` with the rows ``fill_rows`` of ``out`` set to ``fill`` (zeros when None), for an ``index``
    that reads every row of ``x`` outside ``zero_rows`` exactly once into a row of ``out`` outside ``fill_rows``.
    Backward reads the gradient back the same way (``grad_x = grad_out[back_index]``, the rows ``zero_rows`` zero)
    instead of scatter-adding it; ``fill`` gets the sum of the filled rows' gradients."""

    @staticmethod
    def forward(ctx, x, fill, index, fill_rows, back_index, zero_rows):
        out = x.index_select(0, index)
        if fill_rows is not None and fill_rows.numel():
            rows = (fill_rows.shape[0], out.shape[1])  # (explicitly expanded: the ONNX exporter needs the shape)
            out[fill_rows] = out.new_zeros(rows) if fill is None else fill.to(out.dtype).expand(rows)
        ctx.save_for_backward(fill_rows, back_index, zero_rows)
        ctx.fill_dtype = None if fill is None else fill.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        fill_rows, back_index, zero_rows = ctx.saved_tensors
        gx = grad.index_select(0, back_index)
        if zero_rows is not None and zero_rows.numel():
            gx[zero_rows] = 0
        gfill = None
        if ctx.fill_dtype is not None and ctx.needs_input_grad[1]:
            gfill = (grad[fill_rows].sum(0) if fill_rows is not None else grad.new_zeros(grad.shape[1:]))
            gfill = gfill.to(ctx.fill_dtype)
        return gx, gfill, None, None, None, None


class WindowLayout:
    """Where each token of a (B, H, W) grid goes when the grid is zero padded bottom/right to (Hp, Wp), rolled by
    (-sh, -sw) and cut into (wh, ww) windows (row-major), as flat row indices: the pad + roll + partition (and the
    inverse roll + crop) as one gather of rows each way instead of three copies. Pad positions get a fill row."""

    def __init__(self, batch: int, hw, padded, window, shift, device):
        # built from the sizes alone, with no data-dependent shapes (no nonzero / boolean indexing), so that
        # torch.export and the ONNX exporter trace it
        (h, w), (hp, wp), (wh, ww), (sh, sw) = hw, padded, window, shift
        slots, tokens, n = hp * wp, h * w, wh * ww
        ar = functools.partial(torch.arange, device=device)
        pos = ar(slots).view(1, hp, wp, 1)
        if sh or sw:
            pos = torch.roll(pos, shifts=(-sh, -sw), dims=(1, 2))
        pos = _to_windows(pos, wh, ww).reshape(-1)  # padded-grid position held by each window slot
        slot_of = torch.empty_like(pos).index_copy_(0, pos, ar(slots))  # window slot of each padded position
        r, c = pos // wp, pos % wp
        real = (r < h) & (c < w)
        src = torch.where(real, r * w + c, torch.zeros_like(r))  # token read by each slot (pad slots: any)
        inv = slot_of[(ar(h)[:, None] * wp + ar(w)[None, :]).flatten()]  # slot of each token
        pad_pos = torch.cat([(ar(h)[:, None] * wp + ar(w, wp)[None, :]).flatten(), ar(h * wp, slots)])
        pad = slot_of[pad_pos]  # the slots of the padding, (slots - tokens,)
        off_t, off_s = ar(batch)[:, None] * tokens, ar(batch)[:, None] * slots
        self.index = (src[None] + off_t).flatten()
        self.inverse = (inv[None] + off_s).flatten()
        self.pad = (pad[None] + off_s).flatten() if slots > tokens else None
        self.window_of_token = self.inverse // n  # (B*H*W,) window (B*nW order) of each token
        self.tokens_per_window = real.view(-1, n).sum(1).repeat(batch)
        self.shape = (batch * slots // n, n)
        self.grid = (batch, h, w)
        self.identity = (hp, wp) == (h, w) == (wh, ww)  # one window, nothing padded: windows are a view

    def to_windows(self, x: torch.Tensor, fill: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, H, W, C) -> (B*nW, wh*ww, C); pad slots hold ``fill`` (C,) or zeros."""
        c = x.shape[-1]
        if self.identity:
            return x.reshape(*self.shape, c)
        out = _RowGather.apply(x.reshape(-1, c), fill, self.index, self.pad, self.inverse, None)
        return out.view(*self.shape, c)

    def from_windows(self, y: torch.Tensor) -> torch.Tensor:
        """(B*nW, wh*ww, C) -> (B, H, W, C): the real tokens back in grid order (pad slots dropped)."""
        c = y.shape[-1]
        if self.identity:
            return y.reshape(*self.grid, c)
        out = _RowGather.apply(y.reshape(-1, c), None, self.inverse, None, self.index, self.pad)
        return out.view(*self.grid, c)

    def window_means(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) -> (B*nW, C): the mean of each window's real tokens (0 for a window of pads only)."""
        c = x.shape[-1]
        if self.identity:
            return x.reshape(*self.shape, c).mean(1)
        sums = x.new_zeros(self.shape[0], c).index_add(0, self.window_of_token, x.reshape(-1, c))
        return sums / self.tokens_per_window.clamp_min(1).to(x.dtype)[:, None]


def per_stage(value, num: int, name: str, kind, owner: str) -> list:
    """One value for every stage, or a list/tuple with exactly one per stage, each of type ``kind``."""
    if isinstance(value, (list, tuple)):
        if len(value) != num:
            raise ValueError(f'{owner}: {name}={value!r} has {len(value)} entries but the model has {num} '
                             f'stages; give one value for all or exactly {num}')
        vals = list(value)
    else:
        vals = [value] * num
    for v in vals:
        if not isinstance(v, kind):
            raise TypeError(f'{owner}: {name} entries must be {kind.__name__}, got {v!r}')
    return vals


PRETRAINED_KEYS = ('type', 'checkpoint', 'prefix', 'map_location')


class ScratchInit:
    """``init_cfg=dict(type='Scratch')``: train this module from its own initialisation, on purpose. The det / seg
    configs start their backbones from pretrained checkpoints; this is how a config says it does not. Registered
    in mmengine's weight initializers (softfree_mm/registry.py); it changes nothing (the constructors initialise).
    Keys a merged Pretrained base leaves behind (checkpoint, prefix, map_location) are ignored."""

    def __init__(self, checkpoint=None, prefix=None, map_location=None):
        pass

    def __call__(self, module):
        return module


def init_from_cfg(module, convert_fn, prefer_ema: bool = False):
    """Handle a backbone's ``Pretrained`` init_cfg: load the checkpoint through the family's converter (unwrap,
    prefix, exact key report; a missing local file is a one-line error saying how to make it or opt out).
    Returns 'loaded' when it did, else None (mmengine's init applies, e.g. ``Scratch``)."""
    cfg = module.init_cfg
    if not (isinstance(cfg, dict) and cfg.get('type') == 'Pretrained'):
        return None
    name = type(module).__name__
    unknown = set(cfg) - set(PRETRAINED_KEYS)
    if unknown or not cfg.get('checkpoint'):
        raise ValueError(f"{name}: a Pretrained init_cfg takes 'checkpoint' (required), 'prefix', 'map_location'; "
                         f'got {sorted(cfg)}')
    from .converters import load_pretrained
    load_pretrained(module, cfg['checkpoint'], convert_fn=convert_fn, prefix=cfg.get('prefix'),
                    map_location=cfg.get('map_location', 'cpu'), prefer_ema=prefer_ema)
    module._is_init = True
    return 'loaded'


# ---------------------------------------------------------------------- the backbone base class
def resolve_pretrained(owner: str, pretrained: Optional[str], init_cfg):
    """``init_cfg`` with mmdet's / mmseg's deprecated ``pretrained=PATH`` folded in (``dict(type='Pretrained',
    checkpoint=PATH)``); a FutureWarning once per class. Both at once is an error, as in mmdet and mmseg."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'{owner}: pretrained must be a checkpoint path (str) or None, got {pretrained!r}')
    if init_cfg is not None:
        raise ValueError(f'{owner}: pretrained={pretrained!r} and init_cfg={init_cfg!r} cannot both be given; use '
                         "init_cfg=dict(type='Pretrained', checkpoint=...) alone")
    if owner not in _WARNED_PRETRAINED:
        _WARNED_PRETRAINED.add(owner)
        warnings.warn(f"{owner}: 'pretrained' is deprecated (as in mmdet and mmseg), use "
                      f"init_cfg=dict(type='Pretrained', checkpoint={pretrained!r})", FutureWarning, stacklevel=3)
    return dict(type='Pretrained', checkpoint=pretrained)


_WARNED_PRETRAINED = set()


def check_foreign_args(owner: str, checks: Dict[str, Tuple[object, bool, str]]) -> None:
    """One ValueError naming every argument taken over from another library (mmdet, mmseg) whose value has no
    meaning here. ``checks``: name -> (value, fits, what would fit)."""
    bad = [f'{name}={value!r} ({what})' for name, (value, fits, what) in checks.items() if not fits]
    if bad:
        raise ValueError(f'{owner}: these arguments have no meaning here: {"; ".join(bad)}')


def pretrain_hw(owner: str, value) -> Tuple[int, int]:
    """mmdet's ``pretrain_img_size`` as (H, W): an int, or a tuple / list of one or two ints, as mmdet's Swin and PVT
    take it (mmdet asserts on any other length); anything else is one error naming the value."""
    size = (value,) if isinstance(value, numbers.Integral) else value
    if isinstance(size, (tuple, list)) and len(size) in (1, 2) and all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) and s > 0 for s in size):
        return int(size[0]), int(size[-1])
    raise ValueError(f'{owner}: pretrain_img_size must be a positive int or a tuple of 1 or 2 positive ints (H, W): '
                     f'the image size the position embedding was learned at, as in mmdet; got {value!r}')


def is_cfg(cfg, kind: str, **fixed) -> bool:
    """``cfg`` is ``dict(type=kind)``, optionally with exactly the given extra values (e.g. LN with eps=1e-6)."""
    if not isinstance(cfg, dict) or cfg.get('type') != kind:
        return False
    return all(cfg.get(k, v) == v for k, v in fixed.items()) and set(cfg) <= {'type', 'requires_grad', *fixed}


def __getattr__(name):
    # the backbone base classes moved to the kit (models/backbones/base.py); imported on first use, since the kit
    # itself imports this module
    if name in ('SoftFreeBackbone', 'StagedBackbone'):
        from .backbones import base
        return getattr(base, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
