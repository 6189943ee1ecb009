"""InLine's two measures (InLine, NeurIPS 2024): confusions (injectivity) and attention mass in the 3x3 neighbourhood.

Guards: the confusion count equals a brute-force count over query pairs; InLine and softmax confuse no distinct
queries where relu linear attention, on the same inputs, confuses many (its rows ignore the queries' scale); the
locality measure gives the known values on hand-built matrices: uniform rows -> |neighbourhood ∩ grid| / N, a pure
3x3 stencil -> 1, the identity -> 1, rows on far tokens only -> 0; in windows only the window's tokens count, and a
spatially reduced key counts with the part of its cell inside the neighbourhood.
"""
import itertools

import pytest
import torch

from softfree_mm.analysis.injectivity import confusions
from softfree_mm.analysis.locality import local_mass
from softfree_mm.attention import build_attention
from softfree_mm.models.utils.token_layout import TokenLayout


def _brute(a, q, thr, qthr, valid):
    bp, h, n, _ = a.shape
    out = torch.zeros(bp, h, dtype=torch.long)
    for b, hh in itertools.product(range(bp), range(h)):
        for i, j in itertools.combinations(range(n), 2):
            if valid is not None and not (valid[b, i] and valid[b, j]):
                continue
            if float((q[b, hh, i] - q[b, hh, j]).norm()) < qthr:
                continue
            out[b, hh] += float((a[b, hh, i] - a[b, hh, j]).norm()) < thr
    return out


def test_confusions_equal_a_brute_force_count():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 2, 9, 5, generator=g)
    q = torch.randn(2, 2, 9, 3, generator=g)
    a[0, 0, 3] = a[0, 0, 1] + 1e-5  # planted near-duplicate rows
    a[1, 1, 7] = a[1, 1, 2]
    q[1, 1, 7] = q[1, 1, 2]  # ... whose queries are the same: not a confusion
    a[1, 0, 4] = a[1, 0, 0]
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 0] = False  # padding query: left out
    for thr in (1e-3, 0.3):
        got, pairs = confusions(a, q, thr, 1e-3, valid)
        assert torch.equal(got, _brute(a, q, thr, 1e-3, valid))
    assert int(got[0, 0]) >= 1 and int(pairs[1, 0]) == 28  # 8 real queries: 28 pairs


def test_inline_has_no_confusions_where_relu_linear_attention_has_many():
    """Linear attention divides by the row sum, so queries with proportional relu parts share a row; InLine
    normalises by subtraction and softmax by exp: both injective."""
    g = torch.Generator().manual_seed(0)
    heads, n, d = 2, 64, 4
    q = torch.randn(1, heads, n, d, generator=g)
    k = torch.randn(1, heads, n, d, generator=g)
    counts = {}
    for cfg in (dict(type='linear', feature_map='relu'), dict(type='inline'), dict(type='inline', feature_map='relu'),
                dict(type='softmax')):
        kern = build_attention(cfg, num_heads=heads, head_dim=d)
        a = kern.attention_matrix(q, k, hw=(8, 8))
        counts[str(cfg)] = int(confusions(a, q)[0].sum())
    assert counts[str(dict(type='linear', feature_map='relu'))] > 50, counts
    assert counts[str(dict(type='inline'))] == 0 and counts[str(dict(type='softmax'))] == 0, counts
    # InLine with relu features keeps q -> A injective on the queries' positive parts only: report, don't assume
    assert counts[str(dict(type='inline', feature_map='relu'))] < counts[str(dict(type='linear', feature_map='relu'))]


def _nbhd(h, w):
    """(N, N) 0/1: token j in the 3x3 neighbourhood of token i (itself included)."""
    ys, xs = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    return (((ys[:, None] - ys[None]).abs() <= 1) & ((xs[:, None] - xs[None]).abs() <= 1)).double()


@pytest.mark.parametrize('hw', [(4, 5), (1, 6), (7, 7)])
def test_locality_of_uniform_rows_is_the_neighbour_count_over_n(hw):
    h, w = hw
    n = h * w
    layout = TokenLayout.over_grid(hw, n, n, 'test')
    a = torch.full((1, 1, n, n), 1.0 / n, dtype=torch.float64)
    mass, uniform = local_mass(a, layout)
    want = _nbhd(h, w).sum(-1) / n  # 9/N inside, 6/N on an edge, 4/N in a corner
    torch.testing.assert_close(mass[0, 0], want)
    torch.testing.assert_close(uniform[0, 0], want)
    if h >= 3 and w >= 3:
        assert float(mass[0, 0, w + 1]) == pytest.approx(9 / n)
        assert float(mass[0, 0, 0]) == pytest.approx(4 / n)


def test_locality_of_a_pure_3x3_stencil_and_of_the_identity_is_one_and_of_far_rows_zero():
    h, w = 5, 6
    n = h * w
    layout = TokenLayout.over_grid((h, w), n, n, 'test')
    nb = _nbhd(h, w)
    stencil = (nb / nb.sum(-1, keepdim=True)).view(1, 1, n, n)
    eye = torch.eye(n, dtype=torch.float64).view(1, 1, n, n)
    far = (1 - nb) / (1 - nb).sum(-1, keepdim=True)
    mass, _ = local_mass(torch.cat([stencil, eye, far.view(1, 1, n, n)], 1), layout)
    torch.testing.assert_close(mass[0], torch.stack([torch.ones(n), torch.ones(n), torch.zeros(n)]).double())


def test_locality_in_windows_counts_only_the_window_and_skips_padding():
    # a 5 x 4 grid in 3 x 3 windows, padded to 6 x 6: 4 windows, padding tokens -1
    h, w, win = 5, 4, 3
    index = torch.full((6, 6), -1)
    index[:h, :w] = torch.arange(h * w).view(h, w)
    layout = TokenLayout.windows('window', (h, w), (6, 6), (win, win), 'test')
    pos = layout.query_pos
    want_pos = index.view(2, win, 2, win).permute(0, 2, 1, 3).reshape(4, win * win)  # windows row-major
    assert torch.equal(pos, want_pos) and torch.equal(layout.key_index[..., 0], pos)
    keep = (pos >= 0).view(4, 1, 1, 9).expand(4, 1, 9, 9)  # pad keys masked
    a = keep.double() / keep.double().sum(-1, keepdim=True)
    mass, uniform = local_mass(a, layout, keep)
    nb = _nbhd(h, w)
    for g in range(4):
        real = [int(t) for t in pos[g] if t >= 0]
        for i, t in enumerate(pos[g].tolist()):
            if t < 0:
                assert float(mass[g, 0, i]) == 0.0
                continue
            want = sum(float(nb[t, u]) for u in real) / len(real)  # neighbours inside the window, uniform mass
            assert float(mass[g, 0, i]) == pytest.approx(want)
            assert float(uniform[g, 0, i]) == pytest.approx(want)


def test_locality_counts_the_part_of_a_reduced_keys_cell_inside_the_neighbourhood():
    h, w, r = 4, 6, 2
    layout = TokenLayout.reduced((h, w), h * w, 6, (2, 3), 'test', adaptive=False, ratio=r)
    a = torch.zeros(1, 1, h * w, 6, dtype=torch.float64)
    a[..., 0] = 1.0  # every query looks at the key pooled from the top-left 2 x 2 cell
    mass, uniform = local_mass(a, layout)
    cell = {0, 1, w, w + 1}
    nb = _nbhd(h, w)
    want = torch.tensor([sum(float(nb[t, u]) for u in cell) / 4 for t in range(h * w)], dtype=torch.float64)
    torch.testing.assert_close(mass[0, 0], want)
    torch.testing.assert_close(uniform[0, 0], nb.sum(-1) / (h * w))  # uniform over keys = uniform over tokens
