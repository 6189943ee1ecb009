"""Where the tokens of one kernel call sit in image space: the public description a backbone family gives of its
attention layers, so that rows and columns of A can be put back on the token grid (the hooks' maps, norms over real
queries, locality).

A module that owns a layout (a family's block or attention module) declares it with a method
``token_layout(nq, nk, *args, **kwargs) -> TokenLayout``, called with the numbers of queries and keys of its kernel's
call and with the arguments of its own ``forward``; the constructors below build the common kinds.

Conventions: grids (H, W) row-major; a call's batch dimension image-major (``b * groups + g``); ``query_pos[g, i]``
is query i's grid index (``PAD`` = -1: padding, left out of every measure; ``OFF_GRID`` = -2: a token with no grid
place, such as a class token, counted in norms but not drawn); key j spreads its mass over ``key_index[g, j, :]`` with
``key_weight`` (summing to 1; index -1 / weight 0 fill unused slots).
"""
import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch

KINDS = ('global', 'window', 'stripe', 'reduction', 'channel', 'unknown')
PAD, OFF_GRID = -1, -2


@dataclass
class TokenLayout:
    kind: str
    grid: Optional[Tuple[int, int]] = None  # the layer's token grid (H, W); None when it has none
    groups: int = 1  # attention problems per image in one kernel call
    query_pos: Optional[torch.Tensor] = None  # (groups, Nq) long, grid index or PAD / OFF_GRID
    key_index: Optional[torch.Tensor] = None  # (groups, Nk, P) long, grid index or -1
    key_weight: Optional[torch.Tensor] = None  # (groups, Nk, P) float, mass share of each grid token
    key_grid: Optional[Tuple[int, int]] = None  # the keys' own grid when it differs from ``grid`` (reduction)
    note: str = ''
    extra: Dict[str, object] = field(default_factory=dict)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def over_grid(cls, hw, nq: int, nk: int, note: str, prefix: int = 0) -> 'TokenLayout':
        """One problem per image: ``prefix`` tokens without a grid place (class tokens), then the (H, W) grid, as
        queries and as keys."""
        h, w = hw
        if nq != prefix + h * w or nk != nq:
            return cls('unknown', grid=tuple(hw), note=f'{note}: Nq={nq}, Nk={nk} do not match the grid {h}x{w}')
        pos = torch.cat([torch.full((prefix,), OFF_GRID), torch.arange(h * w)]).view(1, -1)
        idx, wt = _token_keys(pos)
        return cls('global', grid=(h, w), groups=1, query_pos=pos, key_index=idx, key_weight=wt, note=note)

    @classmethod
    def windows(cls, kind: str, hw, padded, window, note: str, shift=(0, 0), origin=(0, 0),
                extra: Optional[dict] = None) -> 'TokenLayout':
        """Windows (or stripes) of ``window`` tokens tiling a ``padded`` frame around the (H, W) grid: frame
        position p holds token ``(p + shift) mod padded - origin`` (a rolled frame for shifted windows, ``origin``
        the pad before the grid), padding where that falls outside the grid. Windows and their tokens row-major,
        as the backbones partition them; each query's keys are its window's tokens."""
        (h, w), (hp, wp), (wh, ww) = hw, padded, window
        oy = (torch.arange(hp) + shift[0]) % hp - origin[0]
        ox = (torch.arange(wp) + shift[1]) % wp - origin[1]
        valid = ((oy >= 0) & (oy < h)).view(hp, 1) & ((ox >= 0) & (ox < w)).view(1, wp)
        index = torch.where(valid, oy.view(hp, 1) * w + ox.view(1, wp), torch.full((hp, wp), PAD))
        pos = index.reshape(hp // wh, wh, wp // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
        idx, wt = _token_keys(pos)
        return cls(kind, grid=(h, w), groups=pos.shape[0], query_pos=pos, key_index=idx, key_weight=wt, note=note,
                   extra=dict(extra or {}))

    @classmethod
    def reduced(cls, hw, nq: int, nk: int, key_hw, note: str, adaptive: bool, ratio: int = 1) -> 'TokenLayout':
        """Queries on the (H, W) grid, keys pooled from cells of it onto a ``key_hw`` grid: strided cells of
        ``ratio`` tokens, or AdaptiveAvgPool2d's bins (``adaptive``)."""
        h, w = hw
        if nq != h * w or nk != key_hw[0] * key_hw[1]:
            return cls('unknown', grid=tuple(hw), note=f'{note}, but the call has Nq={nq}, Nk={nk}')
        idx, wt = reduced_keys(hw, key_hw, adaptive, ratio)
        return cls('reduction', grid=tuple(hw), groups=1, query_pos=torch.arange(h * w).view(1, h * w),
                   key_index=idx, key_weight=wt, key_grid=tuple(key_hw), note=note)

    @classmethod
    def channels(cls, hw, note: str) -> 'TokenLayout':
        """Attention over channels: its tokens are channels, the values are (H, W) token maps."""
        return cls('channel', grid=tuple(hw), groups=1, note=note)

    # ------------------------------------------------------------------ reading
    @property
    def spatial(self) -> bool:
        """True when rows and columns of A can be placed on the grid."""
        return self.query_pos is not None and self.key_index is not None and self.grid is not None

    def query_valid(self) -> Optional[torch.Tensor]:
        """(groups, Nq) bool: False for padding queries (None when the layout has no positions)."""
        return None if self.query_pos is None else self.query_pos != PAD

    def query_placed(self) -> Optional[torch.Tensor]:
        """(groups, Nq) bool: True for queries with a grid position."""
        return None if self.query_pos is None else self.query_pos >= 0

    def group(self, g: int) -> 'TokenLayout':
        """The layout of attention problem ``g`` alone (groups = 1)."""
        sl = slice(g, g + 1)
        return TokenLayout(self.kind, self.grid, 1, None if self.query_pos is None else self.query_pos[sl],
                           None if self.key_index is None else self.key_index[sl],
                           None if self.key_weight is None else self.key_weight[sl], self.key_grid, self.note,
                           self.extra)

    def find_query(self, token: int) -> Tuple[int, int]:
        """(problem g, row i) of the query at grid index ``token``."""
        hit = (self.query_pos == token).nonzero()
        if hit.numel() == 0:
            raise ValueError(f'grid token {token} is no query of this {self.kind} layout')
        return int(hit[0, 0]), int(hit[0, 1])

    def spread(self, a: torch.Tensor) -> torch.Tensor:
        """Attention rows over keys -> mass per grid token.

        ``a``: (groups, ..., Nk) rows of one image (any dims between). Returns (groups, ..., H * W): the mass of
        key j goes to its grid tokens in proportion to ``key_weight``.
        """
        if not self.spatial:
            raise ValueError(f'layout {self.kind!r} has no token positions: {self.note}')
        g, nk, p = self.key_index.shape
        h, w = self.grid
        lead = a.shape[1:-1]
        rows = a.reshape(g, -1, nk)  # (g, R, Nk)
        idx = self.key_index.clamp_min(0).to(a.device)  # (g, Nk, P)
        wt = (self.key_weight * (self.key_index >= 0)).to(device=a.device, dtype=a.dtype)
        contrib = rows.unsqueeze(-1) * wt.unsqueeze(1)  # (g, R, Nk, P)
        out = torch.zeros(g, rows.shape[1], h * w, dtype=a.dtype, device=a.device)
        out.scatter_add_(2, idx.reshape(g, 1, nk * p).expand(g, rows.shape[1], nk * p),
                         contrib.reshape(g, rows.shape[1], nk * p))
        return out.reshape(g, *lead, h * w)


def _token_keys(query_pos: torch.Tensor):
    """Keys that are the query tokens themselves: (groups, N, 1) indices and unit weights (none for tokens without
    a grid place)."""
    return query_pos.unsqueeze(-1).clone(), (query_pos >= 0).unsqueeze(-1).float()


def _cells(size: int, cells: int, adaptive: bool, ratio: int = 1):
    """[(start, end)] rows (or columns) of the grid each reduced key covers."""
    if adaptive:  # AdaptiveAvgPool2d bins
        return [(math.floor(i * size / cells), math.ceil((i + 1) * size / cells)) for i in range(cells)]
    return [(i * ratio, min(size, (i + 1) * ratio)) for i in range(cells)]


def reduced_keys(hw, key_hw, adaptive: bool, ratio: int = 1):
    """(1, Nk, P) key indices and weights for keys pooled / strided from cells of the (H, W) grid."""
    h, w = hw
    rows, cols = _cells(h, key_hw[0], adaptive, ratio), _cells(w, key_hw[1], adaptive, ratio)
    cells = [[y * w + x for y in range(y0, y1) for x in range(x0, x1)] for (y0, y1) in rows for (x0, x1) in cols]
    p = max(len(c) for c in cells)
    idx = torch.full((1, len(cells), p), -1, dtype=torch.long)
    wt = torch.zeros(1, len(cells), p)
    for j, c in enumerate(cells):
        idx[0, j, :len(c)] = torch.tensor(c, dtype=torch.long)
        wt[0, j, :len(c)] = 1.0 / len(c)
    return idx, wt
