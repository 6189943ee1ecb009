"""A query's attention drawn in image space for any layout (what tools/vis_attention.py draws).

Its row of A goes back on the layer's grid (:meth:`TokenLayout.spread`), NaN where the query sees nothing. For channel
attention (XCiT) query channel c's map is ``sum_c' A[c, c'] v[c', :]`` over the image tokens; for a kernel whose A is
not its whole output (InLine's per-channel residual) the map is A, and the note says so.
"""
import math
from typing import Tuple, Union

import torch


def image_stride(image_side: int, grid_side: int) -> float:
    """Pixels per token along one axis: the power of two s with ceil(image / s) == grid (backbones pad the image
    bottom / right to a stride multiple), else image / grid."""
    for e in range(8):
        s = 2 ** e
        if -(-image_side // s) == grid_side:
            return float(s)
    return image_side / grid_side


def token_under(call, xy: Tuple[float, float]) -> Tuple[int, int, Tuple[float, float]]:
    """(row y, column x) of the layer's grid token under pixel ``xy`` = (X, Y) of the network input, and the
    stride (sy, sx) in pixels per token."""
    h, w = call.layout.grid
    ih, iw = call.image_size or (h, w)
    sy, sx = image_stride(ih, h), image_stride(iw, w)
    x, y = xy
    return min(h - 1, max(0, int(y // sy))), min(w - 1, max(0, int(x // sx))), (sy, sx)


def query_map(call, xy: Tuple[float, float], head: Union[int, str] = 0, channel: int = 0, image: int = 0) -> dict:
    """The map for one query of image ``image``: dict(values (H, W) float tensor, NaN where the query sees nothing;
    token (y, x) of the query (None for channel layouts); stride (sy, sx); kind; note)."""
    layout = call.layout
    note = layout.note if layout is not None else ''
    if not call.complete:
        note += f'; A without the part of {call.kernel.name} that is no shared matrix (per-channel residual)'
    if layout is None or layout.kind == 'unknown' or layout.grid is None:
        raise ValueError(f'{call.name}: the layout is unknown ({layout.note if layout else "no layout"})')
    nh = call.num_heads
    if head != 'mean' and not (isinstance(head, int) and 0 <= head < nh):
        raise ValueError(f'{call.name}: head must be mean or 0..{nh - 1}, got {head!r}')
    rows = call.image_rows(image)
    h, w = layout.grid
    if layout.kind == 'channel':
        d = call.q.shape[2]
        if not 0 <= channel < d:
            raise ValueError(f'{call.name}: channel must be 0..{d - 1} (channels per head), got {channel}')
        a = call.matrix(rows)[0, :, channel, :]  # (h, d)
        v = call.v[rows][0].float()  # (h, d, N)
        maps = torch.einsum('hc,hcn->hn', a, v)
        vals = maps.mean(0) if head == 'mean' else maps[head]
        ih, iw = call.image_size or (h, w)
        return dict(values=vals.reshape(h, w), token=None, stride=(image_stride(ih, h), image_stride(iw, w)),
                    kind=layout.kind, note=note)
    ty, tx, stride = token_under(call, xy)
    g, i = layout.find_query(ty * w + tx)
    sub = layout.group(g)
    a = call.matrix(slice(rows.start + g, rows.start + g + 1))[0, :, i, :]  # (h, Nk)
    row = a.mean(0) if head == 'mean' else a[head]
    values = sub.spread(row.view(1, -1))[0]
    if call.mask is not None:
        m = call.mask if call.mask.shape[0] == 1 else call.mask[rows.start + g:rows.start + g + 1]
        # a key mask (query axis of 1: padding) is every query's row
        keep = m[0, 0 if m.shape[1] == 1 or head == 'mean' else head, i if m.shape[2] > 1 else 0, :].float()
    else:
        keep = torch.ones(call.k.shape[2], device=row.device)
    seen = sub.spread(keep.view(1, -1))[0] > 0
    values = torch.where(seen, values, torch.full_like(values, math.nan))
    return dict(values=values.reshape(h, w), token=(ty, tx), stride=stride, kind=layout.kind, note=note)
