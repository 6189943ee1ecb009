"""Windows of a token grid: Swin's window geometry (padding, shift, keep-masks, relative positions) and the
gathers that pad, roll and partition a grid in one step."""
from collections import OrderedDict
from typing import Optional, Tuple

import torch

from ...attention.base import ceil_div
from ..layers import WindowLayout, _to_windows, identity_mask

def relative_position_index(wh: int, ww: int) -> torch.Tensor:
    """(wh*ww, wh*ww) index into a (2wh-1)(2ww-1) table of relative offsets."""
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing='ij')
    coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    return (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)


class WindowGeometry:
    """How one stage cuts its (H, W) token grid into windows for one forward pass (pure data + masks)."""

    def __init__(self, hw: Tuple[int, int], window: Optional[int], device):
        h, w = hw
        self.hw = (h, w)
        if window is None:  # global window: the whole grid, no padding, no shift, no mask
            self.window = (h, w)
            self.padded = (h, w)
            self.shift = (0, 0)
        else:
            self.window = (window, window)
            self.padded = (ceil_div(h, window) * window, ceil_div(w, window) * window)
            # no shift along an axis that holds a single window (it would only split that window)
            self.shift = tuple(window // 2 if n > window else 0 for n in (h, w))
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
        """(nW, 1, N, N) bool keep-mask for this geometry, or None when every key may be seen."""
        shifted = shifted and any(self.shift)
        if not shifted and not self.needs_pad:
            return None
        if shifted in self._masks:
            return self._masks[shifted]
        (hp, wp), (wh, ww), (sh, sw) = self.padded, self.window, self.shift
        valid = torch.zeros(hp, wp, dtype=torch.bool, device=self.device)
        valid[:self.hw[0], :self.hw[1]] = True
        region = torch.zeros(hp, wp, dtype=torch.long, device=self.device)
        if shifted:
            valid = torch.roll(valid, shifts=(-sh, -sw), dims=(0, 1))
            # label the regions in the shifted frame: tokens from different regions never meet
            hs = [slice(0, hp - wh), slice(hp - wh, hp - sh), slice(hp - sh, hp)] if sh else [slice(0, hp)]
            ws = [slice(0, wp - ww), slice(wp - ww, wp - sw), slice(wp - sw, wp)] if sw else [slice(0, wp)]
            label = 0
            for a in hs:
                for b in ws:
                    region[a, b] = label
                    label += 1
        valid_w = _to_windows(valid[None, :, :, None], wh, ww)[..., 0]  # (nW, N)
        region_w = _to_windows(region[None, :, :, None], wh, ww)[..., 0]
        keep = (region_w[:, :, None] == region_w[:, None, :]) & valid_w[:, None, :]
        keep = keep | identity_mask(wh * ww, self.device)  # a pad query sees itself only
        self._masks[shifted] = keep.unsqueeze(1)
        return self._masks[shifted]


_GEOMETRIES: 'OrderedDict[tuple, WindowGeometry]' = OrderedDict()


def geometry(hw, window, device) -> WindowGeometry:
    """The stage's WindowGeometry, kept across forward passes (its masks and gather indices are built once per
    grid size: on a GPU at batch 1 their dozens of small kernel launches per pass cost more than the attention).
    Tracers (torch.export, torch.compile, the ONNX exporter) get a fresh one, so that nothing is baked in, and so
    does inference mode (its tensors could not be saved for a later backward)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting() or \
            torch.is_inference_mode_enabled():
        return WindowGeometry(hw, window, device)
    key = (hw, window, str(device))
    geo = _GEOMETRIES.pop(key, None) or WindowGeometry(hw, window, device)
    _GEOMETRIES[key] = geo  # most recent last
    while len(_GEOMETRIES) > 64:  # multi-scale training sees many sizes; keep the recent ones
        _GEOMETRIES.popitem(last=False)
    return geo
