"""The seeds' released models load and compute as their official code does.

For each official model (InLine-Swin, InLine-PVT, InLine-CSwin, SOFT and SOFT-Norm, CSwin segmentation) a state dict
in the official key layout and shapes (random values, small dims and depths that keep the layout) goes through the
converter, loads strictly into our backbone, and our outputs equal a reference written here, function by function,
from the official code's computation on the official keys (float64, eval), to 1e-6: at 224 and, where the official
code accepts one with the same weights, at another size (InLine-Swin and InLine-CSwin are built for one resolution:
224, and 448 for InLine-CSwin). Measured against the official modules themselves (run beside ours in a scratch
folder): max |diff| 1e-12 or less for every family (README, "Official weights").
"""
import math

import pytest
import torch
import torch.nn.functional as F

import softfree_mm  # noqa: F401
from softfree_mm.models.backbones import SoftFreeCSWin, SoftFreePVT, SoftFreeSOFT, SoftFreeSwin
from softfree_mm.models.converters import detect_family, get_converter, unplaced_keys

F64 = torch.float64
TOL = dict(rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- helpers
def make_state(shapes, seed=0):
    """Random tensors for the given official names and shapes (norm weights around 1, everything else small)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in shapes.items():
        if name.endswith('num_batches_tracked'):
            sd[name] = torch.tensor(5)
        elif name.endswith('running_var'):
            sd[name] = torch.rand(shape, generator=g, dtype=F64) + 0.5
        elif ('norm' in name or name.endswith(('.1.weight', '.4.weight', '.7.weight'))) and len(shape) == 1 \
                and name.endswith('weight'):
            sd[name] = 1 + 0.1 * torch.randn(shape, generator=g, dtype=F64)
        else:
            sd[name] = 0.15 * torch.randn(shape, generator=g, dtype=F64)
    return sd


def image(*hw, seed=1):
    return torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(seed), dtype=F64)


def ln(x, sd, pre, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), sd[pre + '.weight'], sd[pre + '.bias'], eps)


def lin(x, sd, pre):
    return F.linear(x, sd[pre + '.weight'], sd.get(pre + '.bias'))


def mlp(x, sd, pre, act=F.gelu):
    return lin(act(lin(x, sd, pre + '.fc1')), sd, pre + '.fc2')


def load_strict(model, official, family):
    """Converted official keys load with strict=True (nothing missing, nothing unplaced)."""
    converted = get_converter(family)(official)
    assert unplaced_keys(family, converted) == []
    model.double().load_state_dict(converted, strict=True)  # float64 first: the random values are float64
    return model.eval()


def inline_residual_shapes(pre, c, heads):
    return {f'{pre}.residual.0.weight': (c, c // heads, 1), f'{pre}.residual.0.bias': (c,),
            f'{pre}.residual.2.weight': (9 * c, c // heads, 1), f'{pre}.residual.2.bias': (9 * c,)}


def official_inline(q, k, v, sd, pre, heads, hw, x_mean):
    """The official InLineAttention core on (b, n, c) q, k, v (before the projection): the linear part with the
    scale folded into k and v, the residual kernels from x_mean through the grouped 1x1 convs, one 3x3 kernel per
    (sample, channel) applied to v as an image with zero padding."""
    b, n, c = q.shape
    d = c // heads
    scale = d ** -0.5
    r = F.conv1d(x_mean.unsqueeze(-1), sd[f'{pre}.residual.0.weight'], sd[f'{pre}.residual.0.bias'], groups=heads)
    r = F.conv1d(F.gelu(r), sd[f'{pre}.residual.2.weight'], sd[f'{pre}.residual.2.bias'], groups=heads)
    res_weight = r.reshape(b * c, 1, 3, 3)
    q, k, v = (t.reshape(b, n, heads, d).permute(0, 2, 1, 3) for t in (q, k, v))
    kv = (k.transpose(-2, -1) * (scale / n) ** 0.5) @ (v * (scale / n) ** 0.5)
    out = q @ kv + (1 - q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) * scale) * v.mean(dim=2, keepdim=True)
    out = out.transpose(1, 2).reshape(b, n, c)
    v_img = v.transpose(1, 2).reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2).reshape(1, b * c, hw[0], hw[1])
    res = F.conv2d(v_img, res_weight, None, padding=1, groups=b * c)
    return out + res.reshape(b, c, n).permute(0, 2, 1)


# ---------------------------------------------------------------------------------------------- InLine-Swin
SWIN = dict(embed_dims=16, depths=(1, 1, 4, 1), num_heads=(1, 2, 2, 4))


def swin_layout(attn_types, dim=16, depths=(1, 1, 4, 1), heads=(1, 2, 2, 4), window=7):
    """Official InLineSwin names and shapes at 224 (cfg window 56: every 'I' block's window is its whole grid)."""
    shapes = {'patch_embed.proj.weight': (dim, 3, 4, 4), 'patch_embed.proj.bias': (dim,),
              'patch_embed.norm.weight': (dim,), 'patch_embed.norm.bias': (dim,)}
    c = dim
    for i, depth in enumerate(depths):
        for j in range(depth):
            pre = f'layers.{i}.blocks.{j}'
            shapes.update({f'{pre}.norm1.weight': (c,), f'{pre}.norm1.bias': (c,), f'{pre}.attn.qkv.weight': (3 * c, c),
                           f'{pre}.attn.qkv.bias': (3 * c,), f'{pre}.attn.proj.weight': (c, c),
                           f'{pre}.attn.proj.bias': (c,), f'{pre}.norm2.weight': (c,), f'{pre}.norm2.bias': (c,),
                           f'{pre}.mlp.fc1.weight': (4 * c, c), f'{pre}.mlp.fc1.bias': (4 * c,),
                           f'{pre}.mlp.fc2.weight': (c, 4 * c), f'{pre}.mlp.fc2.bias': (c,)})
            if attn_types[i][j] == 'I':
                shapes.update(inline_residual_shapes(f'{pre}.attn', c, heads[i]))
            else:
                shapes[f'{pre}.attn.relative_position_bias_table'] = ((2 * window - 1) ** 2, heads[i])
        if i < len(depths) - 1:
            shapes.update({f'layers.{i}.downsample.norm.weight': (4 * c,), f'layers.{i}.downsample.norm.bias': (4 * c,),
                           f'layers.{i}.downsample.reduction.weight': (2 * c, 4 * c)})
            c *= 2
    shapes.update({'norm.weight': (c,), 'norm.bias': (c,), 'head.weight': (10, c), 'head.bias': (10,)})
    sd = make_state(shapes)
    for i, depth in enumerate(depths):  # the buffers an official file also holds
        for j in range(depth):
            if attn_types[i][j] == 'S':
                sd[f'layers.{i}.blocks.{j}.attn.relative_position_index'] = _rel_index(window)
    return sd


def _rel_index(w):
    coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
    return (rel[..., 0] + w - 1) * (2 * w - 1) + rel[..., 1] + w - 1


def _swin_window_attention(x, sd, pre, heads, window, shift):
    """The official WindowAttention in a (shifted) window grid with the -100 region mask, x (B, H, W, C). A grid that
    is no window multiple is zero padded bottom / right first and cropped after, the pad tokens attended to as keys
    and the regions labelled on the padded grid (the official detection / segmentation code; the classification code
    never pads at 224)."""
    b, h0, w0, c = x.shape
    x = F.pad(x, (0, 0, 0, (-w0) % window, 0, (-h0) % window))
    h, w = x.shape[1:3]
    if shift:
        x = torch.roll(x, (-shift, -shift), (1, 2))
    win = x.view(b, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, window ** 2, c)
    n, d = window ** 2, c // heads
    q, k, v = lin(win, sd, pre + '.qkv').reshape(-1, n, 3, heads, d).permute(2, 0, 3, 1, 4)
    attn = (q * d ** -0.5) @ k.transpose(-2, -1)
    table = sd[pre + '.relative_position_bias_table']
    attn = attn + table[_rel_index(window).view(-1)].view(n, n, heads).permute(2, 0, 1)
    if shift:
        img = torch.zeros(1, h, w, 1, dtype=F64)
        cnt = 0
        for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                img[:, hs, ws, :] = cnt
                cnt += 1
        mw = img.view(1, h // window, window, w // window, window, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, n)
        mask = (mw[:, None, :] - mw[:, :, None]).ne(0).to(F64) * -100.0
        attn = (attn.view(b, -1, heads, n, n) + mask[None, :, None]).view(-1, heads, n, n)
    out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, n, c)
    out = lin(out, sd, pre + '.proj').view(b, h // window, w // window, window, window, c)
    out = out.permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
    out = torch.roll(out, (shift, shift), (1, 2)) if shift else out
    return out[:, :h0, :w0]


def official_inline_swin(sd, img, attn_types, heads, window_cfg=56):
    x = F.conv2d(img, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=4)
    h, w = x.shape[2:]
    x = ln(x.flatten(2).transpose(1, 2), sd, 'patch_embed.norm')
    for i in range(len(attn_types)):
        for j, kind in enumerate(attn_types[i]):
            pre = f'layers.{i}.blocks.{j}'
            window = window_cfg if kind == 'I' else max(7, window_cfg // 8)
            shift = 0 if j % 2 == 0 else window // 2
            if min(h, w) <= window:
                window, shift = min(h, w), 0
            xn = ln(x, sd, pre + '.norm1')
            if kind == 'I':  # the whole grid is one window (window 56 at 224)
                q, k, v = lin(xn, sd, pre + '.attn.qkv').reshape(1, h * w, 3, -1).unbind(2)
                y = lin(official_inline(q, k, v, sd, pre + '.attn', heads[i], (h, w), xn.mean(1)), sd,
                        pre + '.attn.proj')
            else:
                y = _swin_window_attention(xn.view(1, h, w, -1), sd, pre + '.attn', heads[i], window,
                                           shift).reshape(1, h * w, -1)
            x = x + y
            x = x + mlp(ln(x, sd, pre + '.norm2'), sd, pre + '.mlp')
        if i < len(attn_types) - 1:
            g = x.view(1, h, w, -1)
            g = torch.cat([g[:, 0::2, 0::2], g[:, 1::2, 0::2], g[:, 0::2, 1::2], g[:, 1::2, 1::2]], -1)
            h, w = h // 2, w // 2
            x = lin(ln(g.view(1, h * w, -1), sd, f'layers.{i}.downsample.norm'), sd, f'layers.{i}.downsample.reduction')
    return ln(x, sd, 'norm').transpose(1, 2).reshape(1, -1, h, w)


@pytest.mark.parametrize('arch,attn_types', [
    ('inline_tiny', ('I', 'I', 'IIII', 'S')),   # 'IIIS'
    ('inline_base', ('I', 'I', 'IISS', 'S')),   # 'IIMS2': two InLine blocks, then shifted softmax windows in stage 3
])
def test_inline_swin_release_layout_loads_strictly_and_equals_the_official_computation(arch, attn_types):
    official = swin_layout(attn_types)
    over = {}
    if arch == 'inline_base':  # the preset's per-block layout, shrunk to 4 blocks in stage 3
        over = dict(attn_cfg=['inline', 'inline', ['inline', 'inline', 'softmax', 'softmax'], 'softmax'],
                    global_window=(True, True, [True, True, False, False], False))
    model = SoftFreeSwin(arch=arch, drop_path_rate=0., out_indices=(3,), **SWIN, **over)
    load_strict(model, official, 'inline_swin')
    with torch.no_grad():
        x = image(224, 224)
        torch.testing.assert_close(model(x)[0], official_inline_swin(official, x, attn_types, SWIN['num_heads']),
                                   **TOL)


# ---------------------------------------------------------------------------------------------- InLine-PVT
PVT_DIMS, PVT_HEADS, PVT_MLP = (16, 32, 48, 64), (2, 4, 6, 8), (8, 8, 4, 4)


def pvt_layout(depths=(1, 1, 1, 1)):
    """Official InLine PyramidVisionTransformer names and shapes (la_sr_ratios 1111: no spatial reduction)."""
    shapes, cin = {}, 3
    for i, (c, depth) in enumerate(zip(PVT_DIMS, depths), start=1):
        p = 4 if i == 1 else 2
        side = 56 // 2 ** (i - 1)
        shapes.update({f'patch_embed{i}.proj.weight': (c, cin, p, p), f'patch_embed{i}.proj.bias': (c,),
                       f'patch_embed{i}.norm.weight': (c,), f'patch_embed{i}.norm.bias': (c,),
                       f'pos_embed{i}': (1, side * side, c)})
        for j in range(depth):
            pre = f'block{i}.{j}'
            hid = c * PVT_MLP[i - 1]
            shapes.update({f'{pre}.norm1.weight': (c,), f'{pre}.norm1.bias': (c,), f'{pre}.attn.q.weight': (c, c),
                           f'{pre}.attn.q.bias': (c,), f'{pre}.attn.kv.weight': (2 * c, c),
                           f'{pre}.attn.kv.bias': (2 * c,),
                           f'{pre}.attn.proj.weight': (c, c), f'{pre}.attn.proj.bias': (c,),
                           f'{pre}.norm2.weight': (c,), f'{pre}.norm2.bias': (c,), f'{pre}.mlp.fc1.weight': (hid, c),
                           f'{pre}.mlp.fc1.bias': (hid,), f'{pre}.mlp.fc2.weight': (c, hid),
                           f'{pre}.mlp.fc2.bias': (c,),
                           **inline_residual_shapes(f'{pre}.attn', c, PVT_HEADS[i - 1])})
        cin = c
    shapes.update({'head.weight': (10, PVT_DIMS[-1]), 'head.bias': (10,)})
    return make_state(shapes)


def official_inline_pvt(sd, img, depths=(1, 1, 1, 1)):
    """The four stage maps of the official forward_features (which then averages stage 4's tokens)."""
    x, outs = img, []
    for i in range(1, 5):
        p = 4 if i == 1 else 2
        x = F.conv2d(x, sd[f'patch_embed{i}.proj.weight'], sd[f'patch_embed{i}.proj.bias'], stride=p)
        h, w = x.shape[2:]
        x = ln(x.flatten(2).transpose(1, 2), sd, f'patch_embed{i}.norm')
        pos = sd[f'pos_embed{i}']
        side = 56 // 2 ** (i - 1)
        if not (i == 1 and h * w == 56 * 56):  # the official _get_pos_embed (compares with stage 1's patch count)
            pos = F.interpolate(pos.reshape(1, side, side, -1).permute(0, 3, 1, 2), size=(h, w),
                                mode='bilinear').reshape(1, -1, h * w).permute(0, 2, 1)
        x = x + pos
        for j in range(depths[i - 1]):
            pre = f'block{i}.{j}'
            xn = ln(x, sd, pre + '.norm1', 1e-6)
            q = lin(xn, sd, pre + '.attn.q')
            k, v = lin(xn, sd, pre + '.attn.kv').reshape(1, h * w, 2, -1).unbind(2)
            y = official_inline(q, k, v, sd, pre + '.attn', PVT_HEADS[i - 1], (h, w), xn.mean(1))
            x = x + lin(y, sd, pre + '.attn.proj')
            x = x + mlp(ln(x, sd, pre + '.norm2', 1e-6), sd, pre + '.mlp')
        x = x.reshape(1, h, w, -1).permute(0, 3, 1, 2)
        outs.append(x)
    return outs


@pytest.mark.parametrize('hw', [(224, 224), (160, 256)])
def test_inline_pvt_release_layout_loads_strictly_and_equals_the_official_computation(hw):
    official = pvt_layout()
    model = SoftFreePVT(arch='inline_small', embed_dims=PVT_DIMS, num_heads=PVT_HEADS, depths=(1, 1, 1, 1),
                        drop_path_rate=0.)
    load_strict(model, official, 'inline_pvt')
    with torch.no_grad():
        x = image(*hw)
        for ours, ref in zip(model(x), official_inline_pvt(official, x)):
            torch.testing.assert_close(ours, ref, **TOL)


# ---------------------------------------------------------------------------------------------- InLine-CSwin
CSWIN = dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 4))


def cswin_layout(kinds, segmentation=False, dim=16, depths=(1, 1, 2, 1), heads=(2, 2, 4, 4)):
    """Official CSWinTransformer names and shapes: 'I' blocks (InLine-CSwin) one branch with all heads and the
    residual, 'S' blocks two stripe branches (the last stage one global branch)."""
    shapes = {'stage1_conv_embed.0.weight': (dim, 3, 7, 7), 'stage1_conv_embed.0.bias': (dim,),
              'stage1_conv_embed.2.weight': (dim,), 'stage1_conv_embed.2.bias': (dim,)}
    c = dim
    for s, depth in enumerate(depths, start=1):
        last = s == len(depths)
        for j in range(depth):
            pre = f'stage{s}.{j}'
            shapes.update({f'{pre}.qkv.weight': (3 * c, c), f'{pre}.qkv.bias': (3 * c,), f'{pre}.norm1.weight': (c,),
                           f'{pre}.norm1.bias': (c,), f'{pre}.proj.weight': (c, c), f'{pre}.proj.bias': (c,),
                           f'{pre}.norm2.weight': (c,), f'{pre}.norm2.bias': (c,), f'{pre}.mlp.fc1.weight': (4 * c, c),
                           f'{pre}.mlp.fc1.bias': (4 * c,), f'{pre}.mlp.fc2.weight': (c, 4 * c),
                           f'{pre}.mlp.fc2.bias': (c,)})
            branches = 1 if (last or kinds[s - 1] == 'I') else 2
            for b in range(branches):
                part = c // branches
                shapes.update({f'{pre}.attns.{b}.get_v.weight': (part, 1, 3, 3),
                               f'{pre}.attns.{b}.get_v.bias': (part,)})
                if kinds[s - 1] == 'I':
                    shapes.update(inline_residual_shapes(f'{pre}.attns.{b}', part, heads[s - 1]))
        if segmentation:
            shapes.update({f'norm{s}.weight': (c,), f'norm{s}.bias': (c,)})
        if not last:
            shapes.update({f'merge{s}.conv.weight': (2 * c, c, 3, 3), f'merge{s}.conv.bias': (2 * c,),
                           f'merge{s}.norm.weight': (2 * c,), f'merge{s}.norm.bias': (2 * c,)})
            c *= 2
    if not segmentation:
        shapes.update({'norm.weight': (c,), 'norm.bias': (c,), 'head.weight': (10, c), 'head.bias': (10,)})
    return make_state(shapes)


def _cswin_softmax_branch(q, k, v, sd, pre, heads, hw, stripe, pad_zeros):
    """The official LePEAttention on (b, H, W, c) q, k, v: stripes of (sh, sw), the grid zero-padded symmetrically
    (segmentation code: the zero pad tokens stay keys), softmax with LePE (3x3 depthwise conv on v per stripe)."""
    b, h, w, c = q.shape
    sh, sw = stripe
    ph, pw = (sh - h % sh) % sh, (sw - w % sw) % sw
    assert pad_zeros or not (ph or pw)
    t, l = ph // 2, pw // 2
    q, k, v = (F.pad(x, (0, 0, l, pw - l, t, ph - t)) for x in (q, k, v))
    hp, wp = h + ph, w + pw
    d = c // heads

    def win(x):
        return x.view(b, hp // sh, sh, wp // sw, sw, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, sh * sw, c)
    qw, kw, vw = (win(x).reshape(-1, sh * sw, heads, d).transpose(1, 2) for x in (q, k, v))
    v_img = win(v).transpose(1, 2).reshape(-1, c, sh, sw)
    lepe = F.conv2d(v_img, sd[pre + '.get_v.weight'], sd[pre + '.get_v.bias'], padding=1, groups=c)
    lepe = lepe.reshape(-1, heads, d, sh * sw).transpose(2, 3)
    out = ((qw * d ** -0.5) @ kw.transpose(-2, -1)).softmax(-1) @ vw + lepe
    out = out.transpose(1, 2).reshape(b, hp // sh, wp // sw, sh, sw, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
    return out[:, t:t + h, l:l + w]


def _cswin_inline_branch(q, k, v, sd, pre, heads, hw, x_mean):
    """The official InLine-CSwin InLineAttention over the whole grid (idx -1), LePE added."""
    b, h, w, c = q.shape
    v_img = v.permute(0, 3, 1, 2)
    lepe = F.conv2d(v_img, sd[pre + '.get_v.weight'], sd[pre + '.get_v.bias'], padding=1, groups=c)
    flat = [x.reshape(b, h * w, c) for x in (q, k, v)]
    out = official_inline(*flat, sd, pre, heads, (h, w), x_mean) + lepe.flatten(2).transpose(1, 2)
    return out.view(b, h, w, c)


def official_cswin(sd, img, kinds, heads, stripes=(1, 2, 7, 7), segmentation=False, pad_zeros=False):
    x = F.conv2d(img, sd['stage1_conv_embed.0.weight'], sd['stage1_conv_embed.0.bias'], stride=4, padding=2)
    h, w = x.shape[2:]
    x = ln(x.flatten(2).transpose(1, 2), sd, 'stage1_conv_embed.2')
    outs = []
    for s in range(1, 5):
        if s > 1:
            g = F.conv2d(x.transpose(1, 2).reshape(1, -1, h, w), sd[f'merge{s - 1}.conv.weight'],
                         sd[f'merge{s - 1}.conv.bias'], stride=2, padding=1)
            h, w = g.shape[2:]
            x = ln(g.flatten(2).transpose(1, 2), sd, f'merge{s - 1}.norm')
        j = 0
        while f'stage{s}.{j}.qkv.weight' in sd:
            pre = f'stage{s}.{j}'
            c = x.shape[-1]
            q, k, v = lin(ln(x, sd, pre + '.norm1'), sd, pre + '.qkv').reshape(1, h, w, 3, c).unbind(3)
            mean = x.mean(1)
            if kinds[s - 1] == 'I':
                y = _cswin_inline_branch(q, k, v, sd, pre + '.attns.0', heads[s - 1], (h, w), mean)
            elif s == 4:
                y = _cswin_softmax_branch(q, k, v, sd, pre + '.attns.0', heads[s - 1], (h, w), (h, w), pad_zeros)
            else:
                half, hh = c // 2, heads[s - 1] // 2
                sp = stripes[s - 1]
                y = torch.cat([_cswin_softmax_branch(*(t[..., sl] for t in (q, k, v)), sd, f'{pre}.attns.{b}', hh,
                                                     (h, w), stripe, pad_zeros)
                               for b, (sl, stripe) in enumerate(((slice(0, half), (h, sp)),
                                                                 (slice(half, c), (sp, w))))], -1)
            x = x + lin(y.reshape(1, h * w, c), sd, pre + '.proj')
            x = x + mlp(ln(x, sd, pre + '.norm2'), sd, pre + '.mlp')
            j += 1
        if segmentation:
            outs.append(ln(x, sd, f'norm{s}').transpose(1, 2).reshape(1, -1, h, w))
    if segmentation:
        return outs
    return [ln(x, sd, 'norm').transpose(1, 2).reshape(1, -1, h, w)]


@pytest.mark.parametrize('size', [224, 448])  # the official model is built for one size: la_split 56-28 / 112-56
def test_inline_cswin_release_layout_loads_strictly_and_equals_the_official_computation(size):
    kinds = ('I', 'I', 'S', 'S')
    official = cswin_layout(kinds)
    model = SoftFreeCSWin(arch='inline_tiny', drop_path_rate=0., out_indices=(3,), **CSWIN)
    load_strict(model, official, 'inline_cswin')
    with torch.no_grad():
        x = image(size, size)
        torch.testing.assert_close(model(x)[0], official_cswin(official, x, kinds, CSWIN['num_heads'])[0], **TOL)


# 228x260: stripes padded in stages 2 and 3; 256x320: stage 3's 16x20 grid padded in both branches; 250x330: sides
# that are 2 mod 4 (the official stem's grid, 62x82, is a row and a column short of ceil(H / 4)); 96x320: stage 3's
# 6-row grid narrower than its 7-wide stripe (padded up to it, not cut)
@pytest.mark.parametrize('hw', [(224, 224), (228, 260), (256, 320), (250, 330), (96, 320)])
def test_cswin_segmentation_release_with_its_padding_rule_equals_the_official_segmentation_computation(hw):
    """The UperNet releases' rule, ``downstream_padding['cswin']`` (``pad_keys='zeros', patch_grid='floor'``): zero
    pad keys, stripes never cut to the grid, the stem conv's own grid; to 1e-10 in float64."""
    kinds = ('S', 'S', 'S', 'S')
    official = cswin_layout(kinds, segmentation=True)
    rule = SoftFreeCSWin.family.downstream_padding['cswin']
    assert rule == dict(pad_keys='zeros', patch_grid='floor')
    model = SoftFreeCSWin(arch='tiny', drop_path_rate=0., **rule, **CSWIN)
    load_strict(model, official, 'cswin')
    masked = SoftFreeCSWin(arch='tiny', drop_path_rate=0., **CSWIN)
    load_strict(masked, official, 'cswin')
    with torch.no_grad():
        x = image(*hw)
        ref = official_cswin(official, x, kinds, CSWIN['num_heads'], segmentation=True, pad_zeros=True)
        for ours, r in zip(model(x), ref):
            assert ours.shape == r.shape
            torch.testing.assert_close(ours, r, rtol=1e-10, atol=1e-10)
        if hw in ((224, 224), (228, 260)):
            # our default masks the pad keys: the same where nothing is padded, different where stripes are padded
            same = [torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(masked(x), ref)]
            assert same == ([True] * 4 if hw == (224, 224) else [True, False, False, False])


# ---------------------------------------------------------------------------------------------- SOFT
SOFT = dict(embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 3, 4), depths=(1, 1, 1, 1))


def soft_layout():
    """Official SoftmaxFreeVisionTransformer names and shapes (kernel method 'torch')."""
    dims, heads = SOFT['embed_dims'], SOFT['num_heads']
    shapes = {}

    def conv_bn(pre, cin, cout):
        shapes.update({f'{pre[0]}.weight': (cout, cin, 3, 3), f'{pre[0]}.bias': (cout,)})
        for k, shape in (('weight', (cout,)), ('bias', (cout,)), ('running_mean', (cout,)),
                         ('running_var', (cout,)), ('num_batches_tracked', ())):
            shapes[f'{pre[1]}.{k}'] = shape
    conv_bn(('patch_embed1.proj.0', 'patch_embed1.proj.1'), 3, 32)
    conv_bn(('patch_embed1.proj.3', 'patch_embed1.proj.4'), 32, 32)
    conv_bn(('patch_embed1.proj.6', 'patch_embed1.proj.7'), 32, dims[0])
    for i in (2, 3, 4):
        conv_bn((f'patch_embed{i}.proj.0', f'patch_embed{i}.proj.1'), dims[i - 2], dims[i - 1])
    for i, n in enumerate((3136, 784, 196, 50), start=1):
        shapes[f'pos_embed{i}'] = (1, n, dims[i - 1])
    for i, (ratio, conv) in enumerate(((8, 9), (4, 5), (2, 3)), start=1):
        c, h = dims[i - 1], heads[i - 1]
        d = c // h
        pre = f'block{i}.0.att'
        shapes.update({f'{pre}.mha.W_q.weight': (c, c), f'{pre}.mha.W_q.bias': (c,), f'{pre}.mha.W_v.weight': (c, c),
                       f'{pre}.mha.W_v.bias': (c,), f'{pre}.mha.attn.Qlandmark_op.weight': (d, d, ratio, ratio),
                       f'{pre}.mha.attn.Qnorm_act.0.weight': (d,), f'{pre}.mha.attn.Qnorm_act.0.bias': (d,),
                       f'{pre}.mha.attn.conv.weight': (h, 1, conv, conv), f'{pre}.mha.ff.weight': (c, c),
                       f'{pre}.mha.ff.bias': (c,), f'{pre}.norm1.weight': (c,), f'{pre}.norm1.bias': (c,),
                       f'{pre}.ff1.weight': (4 * c, c), f'{pre}.ff1.bias': (4 * c,), f'{pre}.ff2.weight': (c, 4 * c),
                       f'{pre}.ff2.bias': (c,), f'{pre}.norm2.weight': (c,), f'{pre}.norm2.bias': (c,)})
    c = dims[3]
    pre = 'block4.0'
    shapes.update({f'{pre}.norm1.weight': (c,), f'{pre}.norm1.bias': (c,), f'{pre}.attn.q.weight': (c, c),
                   f'{pre}.attn.q.bias': (c,), f'{pre}.attn.kv.weight': (2 * c, c), f'{pre}.attn.kv.bias': (2 * c,),
                   f'{pre}.attn.proj.weight': (c, c), f'{pre}.attn.proj.bias': (c,), f'{pre}.norm2.weight': (c,),
                   f'{pre}.norm2.bias': (c,), f'{pre}.mlp.fc1.weight': (4 * c, c), f'{pre}.mlp.fc1.bias': (4 * c,),
                   f'{pre}.mlp.fc2.weight': (c, 4 * c), f'{pre}.mlp.fc2.bias': (c,),
                   'norm.weight': (c,), 'norm.bias': (c,), 'cls_token': (1, 1, c), 'head.weight': (10, c),
                   'head.bias': (10,)})
    return make_state(shapes)


def _newton_plain(mat, iters=20):
    """The official newton_inv (SOFT/kernel/inverse.py): ridge 0.01, alpha = 0.9 * 2 / max row sum^2 per matrix."""
    eye = torch.eye(mat.shape[-1], dtype=F64)
    alpha = 0.9 * 2 / torch.max(torch.sum(mat, dim=-1), -1)[0] ** 2
    p = mat + 0.01 * eye
    v = alpha[..., None, None] * p
    for _ in range(iters):
        v = 2 * v - v @ p @ v
    return v


def _newton_norm(mat, iters=20):
    """The official SoftmaxFreeNormAttentionKernel.newton_inv: one alpha for the whole call, halved until the
    start's column-sum norm test passes (at most 10 times), no ridge."""
    eye = torch.eye(mat.shape[-1], dtype=F64)
    alpha = 2 / (torch.max(torch.sum(mat, dim=-1)) ** 2)
    v = alpha * mat
    norm = torch.max(torch.sum(torch.abs(eye - mat @ v), dim=-2))
    count = 0
    while norm > 1.01 and count < 10:
        alpha *= 0.5
        v = alpha * mat
        norm = torch.max(torch.sum(torch.abs(eye - mat @ v), dim=-2))
        count += 1
    for _ in range(iters):
        v = 2 * v - v @ mat @ v
    return v


def _gauss(a, b):
    """The official 'torch' kernel method: |a|^2 + |b|^2 - 2 a.b, then exp(-./2)."""
    sq = (a ** 2) @ torch.ones(a.shape[-1], b.shape[-2], dtype=F64) + \
        torch.ones(a.shape[-2], b.shape[-1], dtype=F64) @ (b ** 2).transpose(-2, -1) - 2 * a @ b.transpose(-2, -1)
    return torch.exp(-sq / 2)


def official_soft(sd, img, normalized):
    """The official SOFT forward: stem, SOFT blocks (post-norm, tanh GELU), stage 4 with the class token; returns
    the four maps (stage 4 after the final norm, without the class token) and the normed class token."""
    dims, heads = SOFT['embed_dims'], SOFT['num_heads']

    def conv_bn_relu(x, conv, bn, stride):
        x = F.conv2d(x, sd[conv + '.weight'], sd[conv + '.bias'], stride=stride, padding=1)
        x = F.batch_norm(x, sd[bn + '.running_mean'], sd[bn + '.running_var'], sd[bn + '.weight'], sd[bn + '.bias'],
                         False, 0.1, 1e-5)
        return F.relu(x)

    def positions(pos, hw):
        side = int(pos.shape[1] ** 0.5)
        pos = F.interpolate(pos.reshape(1, side, side, -1).permute(0, 3, 1, 2), size=hw, mode='bilinear',
                            align_corners=False)
        return pos.flatten(2).transpose(-1, -2)

    x, outs = img, []
    x = conv_bn_relu(x, 'patch_embed1.proj.0', 'patch_embed1.proj.1', 2)
    x = conv_bn_relu(x, 'patch_embed1.proj.3', 'patch_embed1.proj.4', 1)
    x = conv_bn_relu(x, 'patch_embed1.proj.6', 'patch_embed1.proj.7', 2)
    for i in (1, 2, 3):
        if i > 1:
            x = conv_bn_relu(x, f'patch_embed{i}.proj.0', f'patch_embed{i}.proj.1', 2)
        h, w = x.shape[2:]
        x = x.flatten(2).transpose(1, 2) + positions(sd[f'pos_embed{i}'], (h, w))
        pre = f'block{i}.0.att'
        nh, d = heads[i - 1], dims[i - 1] // heads[i - 1]
        q = lin(x, sd, pre + '.mha.W_q').reshape(1, h * w, nh, d).transpose(1, 2) / math.sqrt(math.sqrt(d))
        v = lin(x, sd, pre + '.mha.W_v').reshape(1, h * w, nh, d).transpose(1, 2)
        ratio = sd[pre + '.mha.attn.Qlandmark_op.weight'].shape[-1]
        lm = F.conv2d(q.reshape(nh, h, w, d).permute(0, 3, 1, 2), sd[pre + '.mha.attn.Qlandmark_op.weight'],
                      stride=ratio)
        lm = lm.flatten(2).transpose(1, 2).reshape(1, nh, -1, d)
        lm = F.gelu(ln(lm, sd, pre + '.mha.attn.Qnorm_act.0'))
        k1, k2 = _gauss(q, lm), _gauss(lm, lm)
        if normalized:
            dsym = 1 / k2.sum(-1, keepdim=True).sqrt()
            inv = dsym * _newton_norm(k2) * dsym.transpose(-1, -2)
        else:
            inv = _newton_plain(k2)
        y = (k1 @ inv) @ (k1.transpose(-1, -2) @ v)
        conv = sd[pre + '.mha.attn.conv.weight']
        vv = v.reshape(1, nh, h, w, d).permute(0, 4, 1, 2, 3).reshape(d, nh, h, w)
        y = y + F.conv2d(vv, conv, padding=conv.shape[-1] // 2, groups=nh).reshape(1, d, nh, h, w).flatten(3) \
            .permute(0, 2, 3, 1)
        y = lin(y.transpose(1, 2).reshape(1, h * w, -1), sd, pre + '.mha.ff')
        x = ln(x + y, sd, pre + '.norm1')
        x = ln(x + lin(F.gelu(lin(x, sd, pre + '.ff1'), approximate='tanh'), sd, pre + '.ff2'), sd, pre + '.norm2')
        x = x.reshape(1, h, w, -1).permute(0, 3, 1, 2)
        outs.append(x)
    x = conv_bn_relu(x, 'patch_embed4.proj.0', 'patch_embed4.proj.1', 2)
    h, w = x.shape[2:]
    pos = sd['pos_embed4']
    x = torch.cat([sd['cls_token'], x.flatten(2).transpose(1, 2)], 1) + \
        torch.cat([pos[:, :1], positions(pos[:, 1:], (h, w))], 1)
    pre, nh, c = 'block4.0', heads[3], dims[3]
    xn = ln(x, sd, pre + '.norm1', 1e-6)
    q = lin(xn, sd, pre + '.attn.q').reshape(1, -1, nh, c // nh).transpose(1, 2)
    k, v = lin(xn, sd, pre + '.attn.kv').reshape(1, -1, 2, nh, c // nh).permute(2, 0, 3, 1, 4)
    y = ((q @ k.transpose(-2, -1)) * (c // nh) ** -0.5).softmax(-1) @ v
    x = x + lin(y.transpose(1, 2).reshape(1, -1, c), sd, pre + '.attn.proj')
    x = ln(x + mlp(ln(x, sd, pre + '.norm2', 1e-6), sd, pre + '.mlp'), sd, 'norm', 1e-6)
    outs.append(x[:, 1:].transpose(1, 2).reshape(1, c, h, w))
    return outs, x[:, 0]


@pytest.mark.parametrize('normalized', [False, True], ids=['soft', 'soft_norm'])
@pytest.mark.parametrize('hw', [(224, 224), (193, 257)])
def test_soft_release_layout_loads_strictly_and_equals_the_official_computation(normalized, hw):
    official = soft_layout()
    model = SoftFreeSOFT(arch=dict(SOFT, normalized=normalized), drop_path_rate=0.)
    load_strict(model, official, 'soft')
    with torch.no_grad():
        x = image(*hw)
        ref_maps, ref_cls = official_soft(official, x, normalized)
        for ours, ref in zip(model(x), ref_maps):
            torch.testing.assert_close(ours, ref, **TOL)
        model.out_type = 'cls_token'
        torch.testing.assert_close(model(x)[0], ref_cls, **TOL)


# ---------------------------------------------------------------------------------------------- converter CLI
def test_convert_tool_detects_each_official_layout_and_places_every_key(tmp_path):
    """tools/convert_checkpoint.py auto: the family of each official layout (wrapped as the releases are: 'model' +
    the training config, or timm's 'state_dict' + 'state_dict_ema'), every key placed, and the file loads strictly."""
    import argparse

    import convert_checkpoint  # tools/convert_checkpoint.py (tests/conftest.py puts tools/ on sys.path)
    cases = {
        'inline_swin': (swin_layout(('I', 'I', 'IIII', 'S')),
                        SoftFreeSwin(arch='inline_tiny', out_indices=(3,), **SWIN)),
        'inline_pvt': (pvt_layout(), SoftFreePVT(arch='inline_small', embed_dims=PVT_DIMS, num_heads=PVT_HEADS,
                                                 depths=(1, 1, 1, 1))),
        'inline_cswin': (cswin_layout(('I', 'I', 'S', 'S')), SoftFreeCSWin(arch='inline_tiny', out_indices=(3,),
                                                                          **CSWIN)),
        'soft': (soft_layout(), SoftFreeSOFT(arch=dict(SOFT))),
    }
    for family, (official, model) in cases.items():
        assert detect_family(official)[0] == family
        src, dst = tmp_path / f'{family}.pth', tmp_path / f'{family}_ours.pth'
        ema = {k: v + 1 if v.is_floating_point() else v for k, v in official.items()}
        wrapped = {'state_dict': official, 'state_dict_ema': ema, 'args': argparse.Namespace(lr=1e-3)} \
            if family == 'soft' else {'model': official, 'epoch': 300}
        torch.save(wrapped, src)
        assert convert_checkpoint.main(['auto', str(src), str(dst)]) == 0
        converted = torch.load(dst)['state_dict']
        model.double().load_state_dict(converted, strict=True)
        if family == 'soft':  # the EMA weights, which the official SOFT evaluation loads
            assert torch.equal(converted['cls_token'], ema['cls_token'])
