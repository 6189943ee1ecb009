"""Where the tokens of one kernel call sit in image space: the layout of an attention layer, so that rows and columns
of A can be put back on the token grid. Read from what forward hooks see, the arguments and attributes of the module
that owns the layout (``SwinBlock``, ``StripeBranch``, ``SRAttention``, ``XCABlock``, SOFT's ``GlobalBlock``); other
kernels get a plain layout when one problem per image over a grid fits, else ``kind='unknown'``.

Conventions: grids (H, W) row-major; a call's batch dimension image-major (``b * groups + g``); ``query_pos[g, i]``
is query i's grid index (``PAD`` = -1: padding, left out of every measure; ``OFF_GRID`` = -2: a token with no grid
place, such as a class token, counted in norms but not drawn); key j spreads its mass over ``key_index[g, j, :]`` with
``key_weight`` (summing to 1; index -1 / weight 0 fill unused slots).
"""
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch

KINDS = ('global', 'window', 'stripe', 'reduction', 'channel', 'unknown')
PAD, OFF_GRID = -1, -2


@dataclass
class Layout:
    kind: str
    grid: Optional[Tuple[int, int]] = None  # the layer's token grid (H, W); None when it has none
    groups: int = 1  # attention problems per image in one kernel call
    query_pos: Optional[torch.Tensor] = None  # (groups, Nq) long, grid index or -1
    key_index: Optional[torch.Tensor] = None  # (groups, Nk, P) long, grid index or -1
    key_weight: Optional[torch.Tensor] = None  # (groups, Nk, P) float, mass share of each grid token
    key_grid: Optional[Tuple[int, int]] = None  # the keys' own grid when it differs from ``grid`` (reduction)
    note: str = ''
    extra: Dict[str, object] = field(default_factory=dict)

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

    def group(self, g: int) -> 'Layout':
        """The layout of attention problem ``g`` alone (groups = 1)."""
        sl = slice(g, g + 1)
        return Layout(self.kind, self.grid, 1, None if self.query_pos is None else self.query_pos[sl],
                      None if self.key_index is None else self.key_index[sl],
                      None if self.key_weight is None else self.key_weight[sl], self.key_grid, self.note, self.extra)

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


# ---------------------------------------------------------------------------------------------- helpers
def _windows(index_grid: torch.Tensor, wh: int, ww: int) -> torch.Tensor:
    """(Hp, Wp) grid of token indices -> (nW, wh * ww), windows and their tokens row-major (as the backbones'
    window partition)."""
    hp, wp = index_grid.shape
    return index_grid.reshape(hp // wh, wh, wp // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)


def _token_keys(query_pos: torch.Tensor):
    """Keys that are the query tokens themselves: (groups, N, 1) indices and unit weights."""
    return query_pos.unsqueeze(-1).clone(), (query_pos >= 0).unsqueeze(-1).float()


def _plain(hw, nq, nk, note) -> Layout:
    h, w = hw
    pos = torch.arange(h * w).view(1, h * w)
    idx, wt = _token_keys(pos)
    if nq != h * w or nk != h * w:
        return Layout('unknown', grid=tuple(hw), note=f'{note}: Nq={nq}, Nk={nk} do not match the grid {h}x{w}')
    return Layout('global', grid=(h, w), groups=1, query_pos=pos, key_index=idx, key_weight=wt, note=note)


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


# ---------------------------------------------------------------------------------------------- adapters
def swin_layout(block, args, kwargs, call) -> Layout:
    """SwinBlock(x (B, H, W, C), geo): windows of the padded grid, rolled by the shift in shifted blocks."""
    geo = args[1] if len(args) > 1 else kwargs['geo']
    (h, w), (hp, wp), (wh, ww) = geo.hw, geo.padded, geo.window
    sh, sw = geo.shift if block.shifted else (0, 0)
    # the block rolls by (-sh, -sw): position p of the rolled frame holds token (p + shift) mod padded size
    oy = (torch.arange(hp) + sh) % hp
    ox = (torch.arange(wp) + sw) % wp
    valid = (oy < h).view(hp, 1) & (ox < w).view(1, wp)
    index = torch.where(valid, oy.view(hp, 1) * w + ox.view(1, wp), torch.full((hp, wp), -1))
    pos = _windows(index, wh, ww)
    idx, wt = _token_keys(pos)
    if (wh, ww) == (h, w) and (hp, wp) == (h, w):
        kind, note = 'global', f'global window over the {h}x{w} grid'
    else:
        kind = 'window'
        note = f'{wh}x{ww} windows on the {h}x{w} grid'
        if (sh, sw) != (0, 0):
            note += f', shifted by ({sh}, {sw})'
        if (hp, wp) != (h, w):
            note += f', padded to {hp}x{wp}'
    return Layout(kind, grid=(h, w), groups=pos.shape[0], query_pos=pos, key_index=idx, key_weight=wt, note=note,
                  extra=dict(window=(wh, ww), shift=(sh, sw), padded=(hp, wp)))


def cswin_layout(branch, args, kwargs, call) -> Layout:
    """StripeBranch(q (B, H, W, c), k, v): stripes of the symmetrically padded grid (or the whole grid)."""
    from ...models.backbones.cswin import stripe_geometry
    q = args[0] if args else kwargs['q']
    h, w = q.shape[1:3]
    (sh, sw), (top, bottom, left, right) = stripe_geometry((h, w), branch.stripe((h, w)))
    hp, wp = h + top + bottom, w + left + right
    oy, ox = torch.arange(hp) - top, torch.arange(wp) - left
    valid = ((oy >= 0) & (oy < h)).view(hp, 1) & ((ox >= 0) & (ox < w)).view(1, wp)
    index = torch.where(valid, oy.view(hp, 1) * w + ox.view(1, wp), torch.full((hp, wp), -1))
    pos = _windows(index, sh, sw)
    idx, wt = _token_keys(pos)
    if branch.direction is None or (sh, sw) == (h, w):
        kind, note = 'global', f'global over the {h}x{w} grid'
    else:
        kind = 'stripe'
        note = f'{branch.direction} stripes of {sh}x{sw} on the {h}x{w} grid'
        if (hp, wp) != (h, w):
            note += f', padded symmetrically to {hp}x{wp}'
    return Layout(kind, grid=(h, w), groups=pos.shape[0], query_pos=pos, key_index=idx, key_weight=wt, note=note,
                  extra=dict(stripe=(sh, sw), direction=branch.direction, pad=(top, bottom, left, right)))


def pvt_layout(attn, args, kwargs, call) -> Layout:
    """SRAttention(x (B, N, C), hw): queries on the grid, keys on the grid or on a spatially reduced grid."""
    hw = tuple(int(s) for s in (args[1] if len(args) > 1 else kwargs['hw']))
    nq, nk = call.q.shape[2], call.k.shape[2]
    if not attn.reduces:
        return _plain(hw, nq, nk, f'global over the {hw[0]}x{hw[1]} grid')
    h, w = hw
    pos = torch.arange(h * w).view(1, h * w)
    if attn.linear_sra:
        out = attn.pool.output_size
        key_hw = (out, out) if isinstance(out, int) else tuple(out)
        idx, wt = reduced_keys(hw, key_hw, adaptive=True)
        note = f'keys average-pooled to {key_hw[0]}x{key_hw[1]} (linear SRA) from the {h}x{w} grid'
    else:
        r = attn.sr.stride[0]
        key_hw = ((h - attn.sr.kernel_size[0]) // r + 1, (w - attn.sr.kernel_size[1]) // r + 1)
        idx, wt = reduced_keys(hw, key_hw, adaptive=False, ratio=r)
        note = f'keys from a stride-{r} reduction of the {h}x{w} grid ({key_hw[0]}x{key_hw[1]} keys)'
    if nq != h * w or nk != key_hw[0] * key_hw[1]:
        return Layout('unknown', grid=hw, note=f'{note}, but the call has Nq={nq}, Nk={nk}')
    return Layout('reduction', grid=hw, groups=1, query_pos=pos, key_index=idx, key_weight=wt, key_grid=key_hw,
                  note=note)


def soft_global_layout(block, args, kwargs, call) -> Layout:
    """SOFT's stage-4 GlobalBlock(x (B, 1 + H * W, C), hw): a class token, then the grid, all attending globally."""
    hw = tuple(int(s) for s in (args[1] if len(args) > 1 else kwargs['hw']))
    n, nq, nk = hw[0] * hw[1], call.q.shape[2], call.k.shape[2]
    extra = nq - n
    if extra < 0 or nk != nq:
        return Layout('unknown', grid=hw, note=f'Nq={nq}, Nk={nk} do not fit the {hw[0]}x{hw[1]} grid')
    pos = torch.cat([torch.full((extra, ), OFF_GRID), torch.arange(n)]).view(1, -1)
    idx, wt = _token_keys(pos)
    wt = (pos >= 0).unsqueeze(-1).float()
    return Layout('global', grid=hw, groups=1, query_pos=pos, key_index=idx, key_weight=wt,
                  note=f'global over a class token and the {hw[0]}x{hw[1]} grid (the class token is not drawn)')


def xcit_layout(block, args, kwargs, call) -> Layout:
    """XCABlock(x (B, N, C), hw): attention over the d_h channels of each head; tokens are channels."""
    hw = tuple(int(s) for s in (args[1] if len(args) > 1 else kwargs['hw']))
    return Layout('channel', grid=hw, groups=1,
                  note=f'cross-covariance attention over {call.q.shape[2]} channels per head; the values are '
                       f'{hw[0]}x{hw[1]} token maps')


def default_layout(call, batch: Optional[int]) -> Layout:
    """No adapter: one problem per image over the call's grid (``hw``, else a square grid) when that fits."""
    nq, nk = call.q.shape[2], call.k.shape[2]
    if batch is not None and call.q.shape[0] != batch:
        return Layout('unknown', note=f'{call.q.shape[0]} attention problems for {batch} images, and no layout '
                                      'adapter for the module that owns this kernel')
    hw = call.hw
    if hw is None:
        r = math.isqrt(nq)
        if r * r != nq or nq != nk:
            return Layout('unknown', note=f'no token grid (Nq={nq}, Nk={nk}, no hw) and no layout adapter')
        hw = (r, r)
    return _plain(tuple(hw), nq, nk, f'global over the {hw[0]}x{hw[1]} grid (no adapter: assumed)')


def adapters() -> Dict[type, Callable]:
    """Owner module type -> layout function. Each owner is hooked before its kernel runs."""
    from ...models.backbones.cswin import StripeBranch
    from ...models.backbones.pvt import SRAttention
    from ...models.backbones.soft import GlobalBlock
    from ...models.backbones.swin import SwinBlock
    from ...models.backbones.xcit import XCABlock
    return {SwinBlock: swin_layout, StripeBranch: cswin_layout, SRAttention: pvt_layout, XCABlock: xcit_layout,
            GlobalBlock: soft_global_layout}
