"""Windows of a token grid: Swin's window geometry (padding, shift, keep-masks, relative positions) and the
gathers that pad, roll and partition a grid in one step."""
import functools
from collections import OrderedDict
from typing import Optional, Tuple

import torch

from ...attention.base import ceil_div


def identity_mask(n: int, device) -> torch.Tensor:
    """(n, n) bool identity, built by comparison (ONNX Runtime has no boolean EyeLike)."""
    i = torch.arange(n, device=device)
    return i[:, None] == i[None, :]


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

def relative_position_index(wh: int, ww: int) -> torch.Tensor:
    """(wh*ww, wh*ww) index into a (2wh-1)(2ww-1) table of relative offsets."""
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing='ij')
    coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    return (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)


PAD_KEYS = ('mask', 'zeros')


class WindowGeometry:
    """How one stage cuts its (H, W) token grid into windows for one forward pass (pure data + masks).

    The padding rules, declared per release (a released detector was trained with one of them):

    - ``pad_keys='mask'`` (ours, the default): pad slots are removed as keys. An unshifted padded window's mask
      only removes keys, a (nW, 1, 1, N) key mask that keeps a linear kernel's factorised order; a shifted one
      also separates the rolled regions, a general (nW, 1, N, N) mask (a pad query then sees itself only).
      ``'zeros'`` (mmdet's SwinTransformer and the official Swin / Agent-Swin detection and segmentation code):
      pad slots are zero tokens that every query of the window attends to; only the shifted regions are masked.
    - ``always_shift=False`` (ours, the default, as the classification code at 224, whose last stage is one
      window): no shift along an axis that holds a single window (it would only split that window);
      ``True`` (mmdet's and the official downstream code): shifted blocks roll by window // 2 along both axes,
      whatever the grid.
    """

    def __init__(self, hw: Tuple[int, int], window: Optional[int], device, pad_keys: str = 'mask',
                 always_shift: bool = False):
        h, w = hw
        self.hw = (h, w)
        if pad_keys not in PAD_KEYS:
            raise ValueError(f"pad_keys must be one of {', '.join(map(repr, PAD_KEYS))}, got {pad_keys!r}")
        self.pad_keys, self.always_shift = pad_keys, bool(always_shift)
        if window is None:  # global window: the whole grid, no padding, no shift, no mask
            self.window = (h, w)
            self.padded = (h, w)
            self.shift = (0, 0)
        else:
            self.window = (window, window)
            self.padded = (ceil_div(h, window) * window, ceil_div(w, window) * window)
            # always_shift=False: no shift along an axis that holds a single window (it would only split that window)
            self.shift = tuple(window // 2 if (n > window or always_shift) else 0 for n in (h, w))
        self.device = device
        self._masks = {}

    @property
    def needs_pad(self) -> bool:
        return self.padded != self.hw

    def layout(self, shifted: bool, batch: int) -> WindowLayout:
        """The token <-> window-slot indices of this geometry (shifted or not) for ``batch`` images."""
        key = ('layout', shifted and any(self.shift), batch)
        if key not in self._masks:
            self._masks[key] = WindowLayout(batch, self.hw, self.padded, self.window,
                                            self.shift if key[1] else (0, 0), self.device)
        return self._masks[key]

    def mask(self, shifted: bool) -> Optional[torch.Tensor]:
        """The keep-mask of this geometry (shifted or not), or None when every key may be seen: (nW, 1, 1, N) when it
        only removes pad keys (unshifted, ``pad_keys='mask'``), (nW, 1, N, N) with shifted regions."""
        shifted = shifted and any(self.shift)
        pads = self.needs_pad and self.pad_keys == 'mask'
        if not shifted and not pads:
            return None
        if shifted in self._masks:
            return self._masks[shifted]
        (hp, wp), (wh, ww), (sh, sw) = self.padded, self.window, self.shift
        valid = torch.zeros(hp, wp, dtype=torch.bool, device=self.device)
        valid[:self.hw[0], :self.hw[1]] = True
        if not pads:
            valid[:] = True  # pad_keys='zeros': the pads are keys like any other
        if shifted:
            valid = torch.roll(valid, shifts=(-sh, -sw), dims=(0, 1))
        valid_w = _to_windows(valid[None, :, :, None], wh, ww)[..., 0]  # (nW, N)
        if not shifted:  # only pad keys are removed: a key mask (every window holds a real token)
            self._masks[shifted] = valid_w[:, None, None, :]
            return self._masks[shifted]
        # label the regions in the shifted frame: tokens from different regions never meet
        region = torch.zeros(hp, wp, dtype=torch.long, device=self.device)
        hs = [slice(0, hp - wh), slice(hp - wh, hp - sh), slice(hp - sh, hp)] if sh else [slice(0, hp)]
        ws = [slice(0, wp - ww), slice(wp - ww, wp - sw), slice(wp - sw, wp)] if sw else [slice(0, wp)]
        label = 0
        for a in hs:
            for b in ws:
                region[a, b] = label
                label += 1
        region_w = _to_windows(region[None, :, :, None], wh, ww)[..., 0]
        keep = (region_w[:, :, None] == region_w[:, None, :]) & valid_w[:, None, :]
        keep = keep | identity_mask(wh * ww, self.device)  # a pad query sees itself only
        self._masks[shifted] = keep.unsqueeze(1)
        return self._masks[shifted]


_GEOMETRIES: 'OrderedDict[tuple, WindowGeometry]' = OrderedDict()


def geometry(hw, window, device, pad_keys: str = 'mask', always_shift: bool = False) -> WindowGeometry:
    """The stage's WindowGeometry, kept across forward passes (its masks and gather indices are built once per
    grid size: on a GPU at batch 1 their dozens of small kernel launches per pass cost more than the attention).
    Tracers (torch.export, torch.compile, the ONNX exporter) get a fresh one, so that nothing is baked in, and so
    does inference mode (its tensors could not be saved for a later backward)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting() or \
            torch.is_inference_mode_enabled():
        return WindowGeometry(hw, window, device, pad_keys, always_shift)
    key = (hw, window, str(device), pad_keys, bool(always_shift))
    geo = _GEOMETRIES.pop(key, None) or WindowGeometry(hw, window, device, pad_keys, always_shift)
    _GEOMETRIES[key] = geo  # most recent last
    while len(_GEOMETRIES) > 64:  # multi-scale training sees many sizes; keep the recent ones
        _GEOMETRIES.popitem(last=False)
    return geo
