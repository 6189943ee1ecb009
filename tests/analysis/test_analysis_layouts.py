"""Attention capture by forward hooks, and each layer's layout in image space, for every backbone.

Guards: one record per kernel, whatever the backbone (XCiT, PVT v1 / v2, Swin, CSwin) and kernel; the recorded
explicit A reproduces the kernel's output (out == A @ v); the layout puts every token back where it came from: the q
(and k) the kernel received for query i of problem g equal the projection of the owner block's input at grid
position ``query_pos[g, i]`` (Swin's shifted / padded windows, CSwin's symmetric stripe padding), PVT's reduced key j
is the one pooled from the cell its footprint names, XCiT's values are token maps on the grid; query_map draws a
softmax row where its keys lie, with the mass preserved; hand-checkable maps per layout: a padded stripe lights its
own real columns only, a reduced key spreads over exactly the tokens torch's pooling averages into it.
"""
import pytest
import torch

from softfree_mm import models
from softfree_mm.analysis.attention_maps import query_map
from softfree_mm.attention import list_attentions
from softfree_mm.engine.hooks import AttentionCapture, attention_layers

from tests.helpers.presets import TINY

SIZE = (61, 90)  # odd sizes: padding in Swin / CSwin / PVT v1 patch embedding, partial windows
TINY = {**TINY, 'SoftFreeSOFT': dict(arch=dict(embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1),
                                               num_heads=(1, 2, 2, 4)))}


def _build(name, attn='softmax', **kw):
    torch.manual_seed(0)
    if name == 'SoftFreeSOFT' and attn == 'softmax':
        attn = None  # its official kernels: SOFT in stages 1-3, softmax in stage 4
    return getattr(models, name)(**{**TINY[name], **kw}, attn_cfg=attn).eval()


def _run(model, b=2):
    torch.manual_seed(1)
    x = torch.randn(b, 3, *SIZE)
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    return cap


@pytest.mark.parametrize('name', list(TINY))
def test_capture_records_each_kernel_once_with_its_layout_and_a_matching_matrix(name):
    model = _build(name, 'linear' if name == 'SoftFreeXCiT' else 'softmax')
    outputs = {}
    hooks = [k.register_forward_hook(lambda mod, a, kw, out, n=n: outputs.setdefault(n, out), with_kwargs=True)
             for n, k in attention_layers(model)]
    cap = _run(model)
    for h in hooks:
        h.remove()
    assert list(cap.calls) == [n for n, _ in attention_layers(model)]
    assert cap.image_size == SIZE and cap.batch == 2
    kinds = {c.layout.kind for c in cap.calls.values()}
    expected = {'SoftFreeXCiT': {'channel'}, 'SoftFreePVT': {'reduction', 'global'},
                'SoftFreePVTv2': {'reduction', 'global'}, 'SoftFreeSwin': {'window'},
                'SoftFreeCSWin': {'stripe', 'global'}, 'SoftFreeSOFT': {'global'}}[name]
    assert kinds == expected, kinds
    for n, call in cap.calls.items():
        assert call.q.shape[0] == 2 * call.layout.groups
        torch.testing.assert_close(call.matrix() @ call.v.float(), outputs[n].float(), rtol=1e-4, atol=1e-5)
    # no hook is left behind
    assert all(not k._forward_pre_hooks for _, k in attention_layers(model))
    assert not model._forward_pre_hooks


def _swin_expected_q(model, x):
    """Per block: the q each grid token projects to, from the block's own norm1 output (B, H, W, heads, d)."""
    got = {}
    hooks = []
    for si, stage in enumerate(model.stages):
        for bi, blk in enumerate(stage.blocks):
            def hook(mod, args, out, key=f'stages.{si}.blocks.{bi}.attn', blk=blk):
                c = out.shape[-1]
                q = blk.attn.qkv(out)[..., :c]
                got[key] = q.view(*q.shape[:3], blk.attn.num_heads, -1)
            hooks.append(blk.norm1.register_forward_hook(hook))
    return got, hooks


def _check_positions(call, expected, b):
    """call.q[b * G + g, :, i] == expected[b, y, x] for every real query; every grid token is exactly one query."""
    layout = call.layout
    hh, w = layout.grid
    pos = layout.query_pos
    valid = pos >= 0
    got = call.q[b * layout.groups:(b + 1) * layout.groups].transpose(1, 2)  # (G, Nq, heads, d)
    want = expected[b].reshape(hh * w, *expected.shape[-2:])
    torch.testing.assert_close(got[valid], want[pos[valid]], rtol=1e-5, atol=1e-6)
    assert (torch.bincount(pos[valid], minlength=hh * w) == 1).all()


def test_swin_window_layout_maps_every_query_to_its_token_shifted_and_padded():
    model = _build('SoftFreeSwin')
    x = torch.randn(2, 3, *SIZE)
    expected, hooks = _swin_expected_q(model, x)
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    shifted = [n for n, c in cap.calls.items() if c.layout.extra['shift'] != (0, 0)]
    padded = [n for n, c in cap.calls.items() if c.layout.extra['padded'] != c.layout.grid]
    assert shifted and padded
    for name, call in cap.calls.items():
        for b in range(2):
            _check_positions(call, expected[name], b)


def test_cswin_stripe_layout_maps_every_query_to_its_token():
    model = _build('SoftFreeCSWin')
    got, hooks = {}, []
    for name, m in model.named_modules():
        if type(m).__name__ == 'StripeBranch':
            def hook(mod, args, key=name):
                q = args[0]
                got[key] = q.reshape(*q.shape[:3], mod.num_heads, mod.head_dim)
            hooks.append(m.register_forward_pre_hook(hook))
    x = torch.randn(2, 3, *SIZE)
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    assert any(c.layout.extra.get('pad', (0,) * 4) != (0, 0, 0, 0) for c in cap.calls.values())
    for name, call in cap.calls.items():
        for b in range(2):
            _check_positions(call, got[name], b)


@pytest.mark.parametrize('name', ['SoftFreePVT', 'SoftFreePVTv2'])
def test_pvt_reduced_keys_come_from_the_cells_their_footprints_name(name):
    model = _build(name)
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, key=n: inputs.setdefault(key, args))
             for n, m in model.named_modules() if type(m).__name__ == 'SRAttention']
    x = torch.randn(1, 3, *SIZE)
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    reduced = [n for n, c in cap.calls.items() if c.layout.kind == 'reduction']
    assert reduced
    for n in reduced:
        call, (xin, hw) = cap.calls[n], inputs[n]
        attn = dict(model.named_modules())[n]
        layout = call.layout
        hh, ww = hw
        # queries: the token order of the grid
        q = attn.q(xin).view(1, hh * ww, attn.num_heads, attn.head_dim).transpose(1, 2)
        torch.testing.assert_close(call.q, q)
        assert torch.equal(layout.query_pos[0], torch.arange(hh * ww))
        # keys: key j is the sr conv (kernel = stride = r, no padding) of the cell its footprint lists
        grid = xin.transpose(1, 2).reshape(1, -1, hh, ww)
        r = attn.sr.stride[0]
        for j in range(call.k.shape[2]):
            cell = layout.key_index[0, j]
            cell = cell[cell >= 0]
            ys, xs = cell // ww, cell % ww
            y0, x0 = int(ys.min()), int(xs.min())
            assert len(cell) == r * r and int(ys.max()) == y0 + r - 1 and int(xs.max()) == x0 + r - 1
            pooled = attn.sr(grid[:, :, y0:y0 + r, x0:x0 + r]).flatten(1)
            kv = attn.kv(attn.norm(pooled))
            k = kv[:, :kv.shape[1] // 2].view(attn.num_heads, attn.head_dim)
            torch.testing.assert_close(call.k[0, :, j], k, rtol=1e-4, atol=1e-5)
        assert torch.allclose(layout.key_weight.sum(-1), torch.ones(1, call.k.shape[2]))


def test_soft_class_token_counts_in_norms_but_has_no_place_on_the_grid():
    from softfree_mm.engine.hooks.matrix_norms import call_stats
    model = _build('SoftFreeSOFT')
    x = torch.randn(1, 3, *SIZE)
    got = {}
    blk = model.stages[3].blocks[0]
    hook = blk.norm1.register_forward_hook(lambda mod, a, out: got.setdefault('x', out))
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    hook.remove()
    call = cap.calls['stages.3.blocks.0.attn']
    layout = call.layout
    n = layout.grid[0] * layout.grid[1]
    assert layout.query_pos[0, 0] == -2 and torch.equal(layout.query_pos[0, 1:], torch.arange(n))
    q = blk.attn.q(got['x']).view(1, n + 1, blk.attn.num_heads, -1).transpose(1, 2)
    torch.testing.assert_close(call.q, q)  # token 0 the class token, then the grid row-major
    assert call_stats(call)['rows'] == n + 1  # the class token's row counts in the norms
    res = query_map(call, (0, 0), head=0)
    a = call.matrix()[0, 0, 1]
    assert float(res['values'][0, 0]) == pytest.approx(float(a[1]))  # grid token 0 is key 1; the class token: no pixel
    assert abs(float(res['values'].sum()) - (1 - float(a[0]))) < 1e-5


def test_query_map_draws_softmax_rows_where_their_keys_lie_and_keeps_the_mass():
    model = _build('SoftFreePVT')
    cap = _run(model, b=1)
    for name, call in cap.calls.items():
        h, w = call.layout.grid
        ih, iw = SIZE
        res = query_map(call, (iw - 1, ih - 1), head=0)
        vals = res['values']
        assert res['token'] == (h - 1, w - 1)
        finite = torch.isfinite(vals)
        assert abs(float(vals[finite].sum()) - 1.0) < 1e-5  # a softmax row spread over the grid keeps its mass
        if call.num_heads > 1:
            each = [query_map(call, (iw - 1, ih - 1), head=i)['values'] for i in range(call.num_heads)]
            torch.testing.assert_close(query_map(call, (iw - 1, ih - 1), head='mean')['values'],
                                       torch.stack(each).mean(0), equal_nan=True)
        g, i = call.layout.find_query((h - 1) * w + (w - 1))
        a = call.matrix(slice(0, 1))[0, 0, i]
        # every token shows its key's weight divided by the key's cell size
        for t in range(h * w):
            y, x = divmod(t, w)
            hits = (call.layout.key_index[0] == t).nonzero()
            want = sum(float(a[j]) * float(call.layout.key_weight[0, j, p]) for j, p in hits.tolist())
            if hits.numel():
                assert abs(float(vals[y, x]) - want) < 1e-6
            else:
                assert not finite[y, x]  # a token no key covers (PVT v1 drops the last rows of a stride) is blank


def test_query_map_of_channel_attention_is_the_rows_mix_of_value_maps():
    model = _build('SoftFreeXCiT')
    cap = _run(model, b=1)
    call = next(iter(cap.calls.values()))
    res = query_map(call, (0, 0), head=1, channel=3)
    h, w = call.layout.grid
    q, k, v = call.q[0, 1], call.k[0, 1], call.v[0, 1]  # (d, N): channels are the kernel's tokens
    a = torch.softmax(q @ k.T, -1)  # scale 1: XCA folds its temperature into q
    torch.testing.assert_close(res['values'], (a[3] @ v).view(h, w), rtol=1e-5, atol=1e-6)
    assert res['token'] is None and res['kind'] == 'channel'


def _nan_outside(values, want):
    """values (H, W) equals want (H, W) where want is finite, and is NaN exactly where want is NaN."""
    assert torch.equal(torch.isnan(values), torch.isnan(want))
    torch.testing.assert_close(values[~torch.isnan(want)], want[~torch.isnan(want)], rtol=1e-5, atol=1e-7)


def test_query_map_of_a_stripe_lights_the_query_stripe_only_padding_left_out():
    """Hand-checkable stripes on a 61 x 90 image: stage 2 (4 x 6 grid, 16 px a token) has vertical stripes 4 wide,
    padded symmetrically to 8 columns (one pad column each side): stripe 0 holds columns 0..2, stripe 1 columns
    3..5; stage 1 (8 x 12 grid, 8 px) has horizontal stripes 2 rows high. The expected row is a softmax over the
    stripe's real tokens from the branch's own q, k (B, H, W, c), computed here."""
    model = _build('SoftFreeCSWin')
    got, hooks = {}, []
    for name, m in model.named_modules():
        if type(m).__name__ == 'StripeBranch':
            def grab(mod, args, key=name):
                got[key] = args[:2]  # returns None: the arguments stay as they are
            hooks.append(m.register_forward_pre_hook(grab))
    cap = _run(model, b=1)
    for h in hooks:
        h.remove()
    cases = [  # layer, pixel (X, Y), query token (y, x), rows seen, columns seen
        ('stages.2.blocks.0.branches.0', (2 * 16 + 5, 1 * 16 + 3), (1, 2), range(4), range(0, 3)),
        ('stages.2.blocks.0.branches.0', (3 * 16, 3 * 16 + 12), (3, 3), range(4), range(3, 6)),
        ('stages.1.blocks.0.branches.1', (7 * 8 + 1, 5 * 8 + 7), (5, 7), range(4, 6), range(12)),
    ]
    for layer, xy, tok, rows, cols in cases:
        call = cap.calls[layer]
        q, k = got[layer]
        heads, d = call.num_heads, q.shape[-1] // call.num_heads
        for head in range(heads):
            qi = q[0, tok[0], tok[1], head * d:(head + 1) * d]
            keys = [(y, x) for y in rows for x in cols]
            s = torch.stack([qi @ k[0, y, x, head * d:(head + 1) * d] for y, x in keys]) / d ** 0.5
            want = torch.full(call.layout.grid, float('nan'))
            for (y, x), a in zip(keys, torch.softmax(s, 0)):
                want[y, x] = a
            res = query_map(call, xy, head=head)
            assert res['token'] == tok and res['kind'] == 'stripe'
            _nan_outside(res['values'], want)


@pytest.mark.parametrize('name', ['SoftFreePVT', 'SoftFreePVTv2'])
def test_query_map_of_reduced_keys_spreads_each_key_over_the_tokens_it_pools(name):
    """Hand-checkable reduction in stage 1 (16 x 23 grid): PVT v1 pools 8 x 8 cells with a stride-8 conv (2 x 2
    keys; columns 16..22 feed no key), PVT v2's linear SRA averages the grid into 7 x 7 adaptive bins. Token t
    shows sum_j a_j P[j, t], P being the pooling itself (torch's avg_pool2d / adaptive_avg_pool2d of one-hot
    images), a the softmax row from the kernel's q, k; tokens no key pools are NaN."""
    import torch.nn.functional as F
    model = _build(name, **({'linear': True} if name == 'SoftFreePVTv2' else {}))
    cap = _run(model, b=1)
    call = cap.calls['stages.0.blocks.0.attn']
    h, w = call.layout.grid
    assert (h, w) == (16, 23)
    eye = torch.eye(h * w).view(h * w, 1, h, w)
    pool = F.avg_pool2d(eye, 8) if name == 'SoftFreePVT' else F.adaptive_avg_pool2d(eye, 7)
    p = pool.reshape(h * w, -1).T  # (Nk, N)
    assert p.shape[0] == call.k.shape[2]
    for ty, tx in [(0, 0), (9, 20), (15, 12)]:
        i = ty * w + tx
        a = torch.softmax(call.q[0, 0, i] @ call.k[0, 0].T / call.q.shape[-1] ** 0.5, -1)
        want = (a @ p).view(h, w)
        want[(p.sum(0) == 0).view(h, w)] = float('nan')
        res = query_map(call, (tx * 4 + 1, ty * 4 + 2), head=0)
        assert res['token'] == (ty, tx) and res['kind'] == 'reduction'
        _nan_outside(res['values'], want)


def test_checkpointed_blocks_are_recorded_once():
    model = _build('SoftFreeSwin', with_cp=True).train()
    x = torch.randn(1, 3, 32, 32, requires_grad=True)
    with AttentionCapture(model) as cap:
        model(x)[-1].sum().backward()  # the backward pass re-runs every block
    assert len(cap.calls) == len(attention_layers(model))


def test_capture_rejects_unknown_layers_and_models_without_kernels():
    model = _build('SoftFreeSwin')
    with pytest.raises(ValueError, match='unknown attention layer'):
        AttentionCapture(model, layers=['stages.9.blocks.0.attn'])
    with pytest.raises(ValueError, match='no softfree_mm attention kernel'):
        AttentionCapture(torch.nn.Linear(2, 2))
    cap = AttentionCapture(model, layers=lambda n: n.startswith('stages.1'))
    assert [n for n, _ in cap.layers] == ['stages.1.blocks.0.attn', 'stages.1.blocks.1.attn']


def _any_fitting_model(kernel):
    """A tiny backbone that takes ``kernel``: PVTv2 with global attention everywhere (no mask, grids given), else
    XCiT (channel attention), else Swin (7 x 7 windows: kernels tied to a fixed length)."""
    for name, kw in (('SoftFreePVTv2', dict(sr_ratios=(1, 1, 1, 1))), ('SoftFreeXCiT', {}), ('SoftFreeSwin', {})):
        try:
            model = _build(name, kernel, **kw)
            with torch.no_grad():
                model(torch.randn(1, 3, 32, 32))
            return model
        except (ValueError, TypeError):
            continue
    raise AssertionError(f'no tiny backbone takes {kernel}')


@pytest.mark.parametrize('kernel', list_attentions())
def test_every_kernel_is_captured_with_a_matrix_that_reproduces_its_output(kernel):
    from softfree_mm.engine.hooks.matrix_norms import call_stats
    model = _any_fitting_model(kernel)
    outputs = {}
    hooks = [k.register_forward_hook(lambda mod, a, kw, out, n=n: outputs.setdefault(n, out), with_kwargs=True)
             for n, k in attention_layers(model)]
    with AttentionCapture(model) as cap, torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    for h in hooks:
        h.remove()
    assert len(cap.calls) == len(attention_layers(model))
    for n, call in cap.calls.items():
        # out == A @ v, plus the part that is no matrix shared by v's channels (InLine's official residual)
        rest = 0.0 if call.complete else call.residual().float()
        torch.testing.assert_close(call.matrix() @ call.v.float() + rest, outputs[n].float(), rtol=1e-3, atol=1e-4)
        st = call_stats(call)
        assert torch.isfinite(st['fro']).all() and st['fro'].shape == (call.num_heads, )
        assert (st['jac'] is not None) == (not call.kernel.no_score_map)  # built-ins: a map, or why not
        assert st['jac'] is not None or call.kernel.name in st['jac_note']
