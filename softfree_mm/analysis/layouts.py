"""Layouts of attention calls in image space: the hooks' :mod:`softfree_mm.engine.hooks.layouts` (re-exported here),
and the pixel stride of a token grid for drawing maps."""
from ..engine.hooks.layouts import (KINDS, OFF_GRID, PAD, Layout, _cells, _plain, _token_keys,  # noqa: F401
                                    _windows, adapters, cswin_layout, default_layout, pvt_layout, reduced_keys,
                                    soft_global_layout, swin_layout, xcit_layout)


def image_stride(image_side: int, grid_side: int) -> float:
    """Pixels per token along one axis: the power of two s with ceil(image / s) == grid (backbones pad the image
    bottom / right to a stride multiple), else image / grid."""
    for e in range(8):
        s = 2 ** e
        if -(-image_side // s) == grid_side:
            return float(s)
    return image_side / grid_side
