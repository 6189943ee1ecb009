"""Locality (InLine, NeurIPS 2024): the attention mass each query puts on its 3x3 neighbourhood in image space.

``sum_j A_ij * share_j``, ``share_j`` the part of key j inside the neighbourhood (a spatially reduced PVT key: the
fraction of its cell), against the same measure for uniform rows over the keys the query may see (InLine's ``9 / N``
for an interior query of a global layer). Channel attention (XCiT) has no token neighbourhood.
"""
import torch

from ..models.utils.token_layout import TokenLayout


def neighbour_share(layout: TokenLayout) -> torch.Tensor:
    """(groups, Nq, Nk): the share of key j inside the 3x3 neighbourhood of query i (0 for padding queries)."""
    if not layout.spatial:
        raise ValueError(f'{layout.kind} layout has no token positions ({layout.note}): no 3x3 neighbourhood')
    h, w = layout.grid
    qp, ki, kw = layout.query_pos, layout.key_index, layout.key_weight
    qy, qx = (qp // w).view(*qp.shape, 1, 1), (qp % w).view(*qp.shape, 1, 1)  # (G, Nq, 1, 1)
    ky, kx = (ki // w).unsqueeze(1), (ki % w).unsqueeze(1)  # (G, 1, Nk, P)
    near = ((qy - ky).abs() <= 1) & ((qx - kx).abs() <= 1) & (ki >= 0).unsqueeze(1) & (qp >= 0).view(*qp.shape, 1, 1)
    return (near.to(kw.dtype) * kw.unsqueeze(1)).sum(-1)


def local_mass(a: torch.Tensor, layout: TokenLayout, keep: torch.Tensor = None):
    """Per attention problem, head and query: (mass (G, h, Nq), uniform (G, h|1, Nq)).

    ``a``: (G, h, Nq, Nk) rows of ONE image (``layout.groups`` problems); ``keep``: (G, h|1, Nq, Nk) bool, the keys
    each query may see (None: all).
    """
    share = neighbour_share(layout).to(device=a.device, dtype=a.dtype).unsqueeze(1)  # (G, 1, Nq, Nk)
    mass = (a * share).sum(-1)
    k = torch.ones_like(share) if keep is None else keep.to(a.dtype)
    uniform = (share * k).sum(-1) / k.sum(-1).clamp_min(1.0)
    return mass, uniform


def call_locality(call, image: int):
    """Per head, the mean over the image's queries that have a grid position: (mass (h,), uniform (h,), queries).
    Raises ValueError for layouts without token positions."""
    layout = call.layout
    if layout is None or not layout.spatial:
        raise ValueError(f'{call.name}: {layout.kind if layout else "no"} layout ({layout.note if layout else ""}): '
                         'no 3x3 neighbourhood')
    rows = call.image_rows(image)
    a = call.matrix(rows)
    keep = None
    if call.mask is not None:
        keep = call.mask if call.mask.shape[0] == 1 else call.mask[rows]
    mass, uniform = local_mass(a, layout, keep)
    valid = layout.query_placed().to(a.device).unsqueeze(1).to(a.dtype)  # (G, 1, Nq): queries on the grid
    n = valid.sum()
    return (mass * valid).sum((0, 2)) / n, (uniform * valid).sum((0, 2)).expand(a.shape[1]) / n, int(n)
