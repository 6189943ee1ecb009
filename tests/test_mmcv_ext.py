"""softfree_mm/mmcv_ext: the stand-in for mmcv's compiled ``mmcv._ext`` (mmcv-lite has none).

Guards, each against a plain reference written here (not torchvision, not the stand-in): mmcv's ``nms`` (offset 0 /
1, score threshold, max_num; fp32 and the AMP dtypes), ``RoIAlign`` forward and gradients (aligned True / False,
sampling_ratio 0 and > 0, boxes across the map's edges, degenerate boxes; float64, fp32, fp16, bf16), deformable
convolution v1 / v2 with groups, stride, padding, dilation (forward and every gradient), the sigmoid focal loss and
multi-scale deformable attention (mmcv calls both on CUDA only: here through their autograd Functions on CPU); an op
without a torchvision form raises one line naming it and the compiled opt-in. The edges: a negative-size RoI with
``aligned`` is refused on the CPU with mmcv's CPU message; RoIAlign's compute dtype (the features' own on CUDA where
torchvision takes it); the focal loss in float64 stays float64. The stand-in is in place in a bare
Python of the environment (no softfree_mm import), and a compiled ``mmcv._ext``, where one exists, is the one used.
"""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import softfree_mm  # noqa: F401  (puts the stand-in in place in this process too)
from softfree_mm import compat
from softfree_mm.mmcv_ext import finder

from tests.helpers import ROOT

STANDIN = compat.mmcv_ext_is_standin()
needs_standin = pytest.mark.skipif(not STANDIN, reason='mmcv._ext is a compiled build here (MMCV_COMPILED=1)')
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # relative


def _close(actual, expected, dtype, msg=''):
    """``actual`` (in ``dtype``) against a float64 reference: within the dtype's rounding of the reference."""
    scale = expected.abs().max().clamp(min=1.0)
    err = (actual.double() - expected.double()).abs().max()
    assert err <= TOL[dtype] * scale, f'{msg}: max |diff| {float(err):.3g} (scale {float(scale):.3g}, {dtype})'


def _ext():
    import mmcv.ops  # noqa: F401
    return sys.modules['mmcv._ext']


# ------------------------------------------------------------------------------------------------ nms
def _iou(a, b, offset):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + offset)
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + offset)
    inter = w * h
    area = (a[2] - a[0] + offset) * (a[3] - a[1] + offset) + (b[2] - b[0] + offset) * (b[3] - b[1] + offset)
    return inter / (area - inter)


def nms_reference(boxes, scores, thr, offset=0, score_threshold=0.0, max_num=-1):
    """Greedy NMS in Python floats, in mmcv's order: the boxes scoring above ``score_threshold`` (when > 0) first
    (mmcv's Python), sorted as its C++ sorts them (``scores.sort(0, descending=True)``, so tied scores come in that sort's
    order); a box stays unless its IoU with a kept box is > thr."""
    b = boxes.double().tolist()
    valid = torch.nonzero(scores > score_threshold).squeeze(1) if score_threshold > 0 else torch.arange(len(scores))
    keep = []
    for i in valid[scores[valid].sort(0, descending=True)[1]].tolist():
        if all(_iou(b[i], b[j], offset) <= thr for j in keep):
            keep.append(i)
    return keep[:max_num] if max_num > 0 else keep


@needs_standin
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize('offset', [0, 1])
def test_nms_keeps_what_greedy_nms_keeps(dtype, offset):
    from mmcv.ops import nms
    g = torch.Generator().manual_seed(7 + offset)
    xy = torch.rand(400, 2, generator=g) * 60
    boxes = torch.cat([xy, xy + 1 + torch.rand(400, 2, generator=g) * 25], 1).to(dtype)
    scores = torch.randperm(400, generator=g).to(torch.float32).div(400).to(dtype) + 1e-3  # distinct in any dtype
    calls = _ext().calls.get('nms', 0)
    for thr, score_thr, max_num in ((0.5, 0.0, -1), (0.3, 0.2, 40), (0.7, 0.0, 5)):
        dets, inds = nms(boxes, scores, thr, offset=offset, score_threshold=score_thr, max_num=max_num)
        ref = nms_reference(boxes, scores, thr, offset, score_thr, max_num)
        assert inds.tolist() == ref, (thr, score_thr, max_num)
        assert 5 <= len(ref) < 400 and dets.dtype == dtype
        assert torch.equal(dets[:, :4], boxes[inds]) and torch.equal(dets[:, 4], scores[inds])
    assert _ext().calls['nms'] == calls + 3  # the stand-in served each call


@needs_standin
def test_nms_with_tied_scores_keeps_mmcvs_order():
    """Tied scores (zero-padded image borders give many): the kept set and its order follow mmcv's sort, which
    torchvision's stable sort alone would not (the demo detector's numbers move with it)."""
    from mmcv.ops import nms
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(3000, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + 5 + torch.rand(3000, 2, generator=g) * 40], 1)
    scores = (torch.rand(3000, generator=g) * 20).round() / 20  # 21 distinct values
    inds = nms(boxes, scores, 0.7)[1]
    assert inds.tolist() == nms_reference(boxes, scores, 0.7)
    stable = torch.ops.torchvision.nms(boxes, scores, 0.7)
    assert stable.tolist() != inds.tolist()  # the case tells the two orders apart


# ------------------------------------------------------------------------------------------------ RoIAlign
def _bilinear_clamped(f, y, x):
    """RoIAlign's sample of f (C, H, W) at (y, x): zero beyond one pixel outside the map, clamped at the edges."""
    h, w = f.shape[-2:]
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return f.new_zeros(f.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * f[:, y0, x0] + (1 - ly) * lx * f[:, y0, x1] + ly * (1 - lx) * f[:, y1, x0]
            + ly * lx * f[:, y1, x1])


def roi_align_reference(x, rois, out_hw, scale, sampling_ratio, aligned):
    """mmcv's RoIAlign (avg) written out: each bin the mean of grid_h x grid_w bilinear samples at evenly spaced
    points; aligned shifts the box by half a pixel, unaligned boxes are at least 1 x 1; sampling_ratio 0 takes
    ceil(bin size) points per side."""
    ph, pw = out_hw
    outs = []
    for b, *box in rois.double().tolist():
        shift = 0.5 if aligned else 0.0
        x1, y1, x2, y2 = (c * scale - shift for c in box)
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(bh)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(bw)
        f = x[int(b)]
        bins = []
        for i in range(ph):
            for j in range(pw):
                acc = f.new_zeros(f.shape[0])
                for iy in range(gh):
                    for ix in range(gw):
                        acc = acc + _bilinear_clamped(f, y1 + i * bh + (iy + 0.5) * bh / gh,
                                                      x1 + j * bw + (ix + 0.5) * bw / gw)
                bins.append(acc / max(gh * gw, 1))
        outs.append(torch.stack(bins, -1).view(-1, ph, pw))
    return torch.stack(outs)


# boxes inside, across every edge, beyond the map, smaller than a pixel, degenerate, on the map's last row / column
ROIS = [[0, 3.2, 2.7, 15.9, 12.4], [1, -6.0, -3.5, 9.0, 7.0], [0, 14.0, 10.0, 30.0, 25.0], [1, 0.4, 0.6, 0.9, 1.3],
        [0, 5.0, 5.0, 5.0, 5.0], [1, 19.0, 0.0, 21.9, 17.8], [0, -9.0, -9.0, -3.0, -2.5], [1, 1.0, 2.0, 22.0, 17.0]]


@needs_standin
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_roi_align_forward_and_gradients_equal_the_reference(dtype):
    from mmcv.ops import roi_align
    g = torch.Generator().manual_seed(3)
    x64 = torch.randn(2, 3, 9, 11, generator=g, dtype=torch.float64)
    x = x64.to(dtype)
    rois = torch.tensor(ROIS, dtype=torch.float64)
    before = dict(_ext().calls)
    for aligned in (True, False):
        for ratio in (0, 2):
            for roi_dtype in {dtype, torch.float32}:  # under AMP the boxes stay float32 or follow the features
                xi = x.clone().requires_grad_()
                out = roi_align(xi, rois.to(roi_dtype), (3, 4), 0.5, ratio, 'avg', aligned)
                weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
                (out * weight.to(dtype)).sum().backward()
                xr = x.double().clone().requires_grad_()
                ref = roi_align_reference(xr, rois.to(roi_dtype).double(), (3, 4), 0.5, ratio, aligned)
                (ref * weight).sum().backward()
                what = f'aligned={aligned} sampling_ratio={ratio} rois {roi_dtype}'
                assert out.dtype == dtype and xi.grad.dtype == dtype
                _close(out, ref.detach(), dtype, 'forward, ' + what)
                _close(xi.grad, xr.grad, dtype, 'gradient, ' + what)
                assert ref.abs().sum() > 0 and xr.grad.abs().sum() > 0
    after = _ext().calls
    assert after['roi_align_forward'] > before.get('roi_align_forward', 0)
    assert after['roi_align_backward'] > before.get('roi_align_backward', 0)


@needs_standin
def test_roi_align_reference_tells_the_options_apart():
    """The reference is not blind to what the comparison varies: each option changes the values of these boxes."""
    x = torch.randn(2, 3, 9, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rois = torch.tensor(ROIS, dtype=torch.float64)
    base = roi_align_reference(x, rois, (3, 4), 0.5, 0, True)
    for other in (roi_align_reference(x, rois, (3, 4), 0.5, 2, True),
                  roi_align_reference(x, rois, (3, 4), 0.5, 0, False)):
        assert (other - base).abs().max() > 1e-2


@needs_standin
def test_roi_align_max_pooling_is_one_line_naming_the_compiled_opt_in():
    from mmcv.ops import RoIAlign
    with pytest.raises(NotImplementedError) as err:
        RoIAlign((2, 2), 1.0, 2, 'max', True)(torch.randn(1, 1, 8, 8), torch.tensor([[0, 0, 0, 4, 4.]]))
    msg = str(err.value)
    assert '\n' not in msg and "pool_mode='max'" in msg and 'MMCV_COMPILED=1' in msg


@needs_standin
def test_a_negative_roi_with_aligned_is_refused_on_cpu_with_mmcvs_message_and_computed_unaligned():
    """mmcv's CPU kernel asserts a non-negative size for aligned RoIs (its message, word for word); unaligned ones
    are at least 1 x 1 (the reference); a RoI of zero size is no error. Its CUDA kernel computes negative ones."""
    from mmcv.ops import roi_align
    x = torch.randn(1, 2, 9, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for box in ([0, 6.0, 2.0, 3.0, 7.0], [0, 2.0, 6.0, 7.0, 3.0]):  # x2 < x1, then y2 < y1
        rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], box], dtype=torch.float64)
        with pytest.raises(RuntimeError) as err:
            roi_align(x, rois, (2, 2), 1.0, 2, 'avg', True)
        msg = str(err.value)
        assert msg.startswith('ROIs in ROIAlign cannot have non-negative size!') and 'RoI 1 of 2' in msg, msg
        assert '\n' not in msg
        out = roi_align(x, rois, (2, 2), 1.0, 2, 'avg', False)
        _close(out, roi_align_reference(x, rois, (2, 2), 1.0, 2, False), torch.float64, 'unaligned')
        xi = x.clone().requires_grad_()  # the backward pass refuses it too (mmcv's CPU backward asserts the same)
        from softfree_mm.mmcv_ext import ops
        with pytest.raises(RuntimeError, match='cannot have non-negative size'):
            ops.roi_align_backward(torch.ones(2, 2, 2, 2, dtype=torch.float64), rois, None, None,
                                   torch.zeros_like(xi), 2, 2, 1.0, 2, 1, True)
    zero = torch.tensor([[0, 5.0, 5.0, 5.0, 5.0]], dtype=torch.float64)
    _close(roi_align(x, zero, (2, 2), 1.0, 2, 'avg', True), roi_align_reference(x, zero, (2, 2), 1.0, 2, True),
           torch.float64, 'zero size')


def test_roi_align_computes_in_the_features_dtype_on_cuda_where_torchvision_takes_it():
    """On CUDA: float16 stays float16 (no float32 copy of a feature level under AMP, as mmcv's CUDA kernel),
    bfloat16 (which torchvision's CUDA kernel does not take) goes to float32, the RoIs follow the features. On the
    CPU: float32 for the 16-bit dtypes, float64 stays float64, the promoted dtype of features and RoIs otherwise."""
    from softfree_mm.mmcv_ext.ops import roi_align_dtype
    f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
    cuda = {(f16, f16): f16, (f16, f32): f16, (bf16, bf16): f32, (bf16, f32): f32, (f32, f32): f32, (f32, f64): f32,
            (f64, f64): f64, (f64, f32): f64}
    cpu = {(f16, f16): f32, (f16, f32): f32, (bf16, bf16): f32, (bf16, f32): f32, (f32, f32): f32, (f32, f64): f64,
           (f64, f64): f64, (f64, f32): f64}
    for device, table in (('cuda', cuda), ('cpu', cpu)):
        got = {pair: roi_align_dtype(*pair, device) for pair in table}
        assert got == table, device


# ------------------------------------------------------------------------------------------------ DCN v1 / v2
def _bilinear_zero(f, y, x):
    """f (N, C, H, W) sampled at y, x (N, *S): bilinear, corners outside the map count as zero -> (N, C, *S)."""
    n, c, h, w = f.shape
    y0, x0 = y.floor(), x.floor()
    ly, lx = y - y0, x - x0  # on a grid line the sample takes the cell below / right of it
    out = 0
    flat = f.reshape(n, c, h * w)
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yy, xx = y0 + dy, x0 + dx
        wgt = (ly if dy else 1 - ly) * (lx if dx else 1 - lx)
        valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        idx = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).long().reshape(n, 1, -1).expand(n, c, -1)
        val = flat.gather(2, idx).view(n, c, *y.shape[1:])
        out = out + val * (wgt * valid).unsqueeze(1)
    return out


def deform_conv_reference(x, weight, offset, mask, bias, stride, pad, dil, groups, dgroups):
    """Deformable convolution written out: every kernel tap samples the input at its place plus its learnt (dy, dx)
    offset (one per deformable group), times its mask (v2), then a grouped convolution of the samples."""
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    off = offset.view(n, dgroups, kh * kw, 2, ho, wo)
    base_y = (torch.arange(ho, dtype=x.dtype) * stride[0] - pad[0]).view(1, ho, 1)
    base_x = (torch.arange(wo, dtype=x.dtype) * stride[1] - pad[1]).view(1, 1, wo)
    taps = []
    for k in range(kh * kw):
        i, j = divmod(k, kw)
        per_group = []
        for d, xs in enumerate(x.chunk(dgroups, 1)):
            v = _bilinear_zero(xs, base_y + i * dil[0] + off[:, d, k, 0], base_x + j * dil[1] + off[:, d, k, 1])
            if mask is not None:
                v = v * mask.view(n, dgroups, kh * kw, ho, wo)[:, d, k].unsqueeze(1)
            per_group.append(v)
        taps.append(torch.cat(per_group, 1))  # (n, c, ho, wo)
    cols = torch.stack(taps, 2)  # (n, c, k, ho, wo)
    outs = [torch.einsum('nckhw,ock->nohw', cc, ww.flatten(2))
            for cc, ww in zip(cols.chunk(groups, 1), weight.chunk(groups, 0))]
    out = torch.cat(outs, 1)
    return out if bias is None else out + bias.view(1, -1, 1, 1)


@needs_standin
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize('modulated', [False, True])
def test_deform_conv_forward_and_gradients_equal_the_reference(modulated, dtype):
    from mmcv.ops import deform_conv2d, modulated_deform_conv2d
    g = torch.Generator().manual_seed(11 + modulated)
    n, c, o, groups, dgroups, stride, pad, dil = 2, 4, 6, 2, 2, (2, 1), (1, 2), (1, 2)
    x = torch.randn(n, c, 9, 10, generator=g, dtype=torch.float64)
    weight = torch.randn(o, c // groups, 3, 3, generator=g, dtype=torch.float64)
    ho = (9 + 2 * pad[0] - dil[0] * 2 - 1) // stride[0] + 1
    wo = (10 + 2 * pad[1] - dil[1] * 2 - 1) // stride[1] + 1
    offset = torch.randn(n, dgroups * 2 * 9, ho, wo, generator=g, dtype=torch.float64) * 2.5  # some taps leave the map
    mask = torch.rand(n, dgroups * 9, ho, wo, generator=g, dtype=torch.float64)
    bias = torch.randn(o, generator=g, dtype=torch.float64)
    ins = [x, offset, weight] + ([mask, bias] if modulated else [])
    leaves = [t.to(dtype).clone().requires_grad_() for t in ins]
    if modulated:
        xi, oi, wi, mi, bi = leaves
        out = modulated_deform_conv2d(xi, oi, mi, wi, bi, stride, pad, dil, groups, dgroups)
    else:
        xi, oi, wi = leaves
        out = deform_conv2d(xi, oi, wi, stride, pad, dil, groups, dgroups)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * up.to(dtype)).sum().backward()
    refs = [t.to(dtype).double().clone().requires_grad_() for t in ins]  # the same rounded inputs
    ref = deform_conv_reference(refs[0], refs[2], refs[1], refs[3] if modulated else None,
                                refs[4] if modulated else None, stride, pad, dil, groups, dgroups)
    (ref * up).sum().backward()
    _close(out, ref.detach(), dtype, 'forward')
    for name, a, r in zip(('input', 'offset', 'weight', 'mask', 'bias'), leaves, refs):
        _close(a.grad, r.grad, dtype if dtype != torch.float16 else torch.bfloat16, f'gradient of {name}')
        assert r.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------------ focal loss
@needs_standin
@pytest.mark.parametrize('with_weight', [False, True])
def test_sigmoid_focal_loss_equals_the_formula(with_weight):
    """mmcv's sigmoid focal loss (its CUDA kernel's formula; the stand-in serves it on every device): -alpha
    (1-p)^g log p for the target class, -(1-alpha) p^g log(1-p) for the others, times the target's class weight."""
    from mmcv.ops import sigmoid_focal_loss
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(40, 7, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, 7 if with_weight else 8, (40,), generator=g)  # 7: background, no positive class
    weight = torch.rand(7, generator=g, dtype=torch.float64) + 0.5 if with_weight else None
    for reduction in ('none', 'mean', 'sum'):
        li = logits.float().requires_grad_()
        out = sigmoid_focal_loss(li, target, 2.0, 0.25, None if weight is None else weight.float(), reduction)
        out.sum().backward()
        lr = logits.clone().requires_grad_()
        p = lr.sigmoid()
        t = torch.nn.functional.one_hot(target, 8)[:, :7].double()
        ref = -0.25 * t * (1 - p) ** 2 * p.log() - 0.75 * (1 - t) * p ** 2 * (1 - p).log()
        if weight is not None:
            ref = ref * weight[target][:, None]
        ref = {'none': ref, 'mean': ref.sum() / 40, 'sum': ref.sum()}[reduction]
        ref.sum().backward()
        _close(out, ref.detach(), torch.float32, reduction)
        _close(li.grad, lr.grad, torch.float32, 'gradient, ' + reduction)


@needs_standin
def test_sigmoid_focal_loss_in_float64_computes_in_float64():
    """float64 logits stay float64 (the dtype _compute_dtype states): forward and gradient within float64's
    rounding of the formula, not float32's."""
    from mmcv.ops import sigmoid_focal_loss
    g = torch.Generator().manual_seed(6)
    logits = (torch.randn(30, 5, generator=g, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(0, 5, (30,), generator=g)  # with a class weight, as the formula test: no background
    weight = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    out = sigmoid_focal_loss(logits, target, 2.0, 0.25, weight, 'none')
    out.sum().backward()
    lr = logits.detach().clone().requires_grad_()
    p = lr.sigmoid()
    t = torch.nn.functional.one_hot(target, 6)[:, :5].double()
    ref = (-0.25 * t * (1 - p) ** 2 * p.log() - 0.75 * (1 - t) * p ** 2 * (1 - p).log()) * weight[target][:, None]
    ref.sum().backward()
    assert out.dtype == torch.float64
    _close(out, ref.detach(), torch.float64, 'forward')
    _close(logits.grad, lr.grad, torch.float64, 'gradient')


# ------------------------------------------------------------------------------------------------ MSDeformAttn
def ms_deform_attn_reference(value, shapes, locations, weights):
    """Each query's heads sample every level at (x W - 0.5, y H - 0.5) (bilinear, zero outside) at each point and
    sum the samples by their attention weights."""
    bs, _, heads, dim = value.shape
    _, nq, _, levels, points, _ = locations.shape
    out = 0
    start = 0
    for lvl, (h, w) in enumerate(shapes.tolist()):
        v = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(bs * heads, dim, h, w)
        start += h * w
        loc = locations[:, :, :, lvl].permute(0, 2, 1, 3, 4).reshape(bs * heads, nq, points, 2)
        s = _bilinear_zero(v, loc[..., 1] * h - 0.5, loc[..., 0] * w - 0.5)  # (bs*heads, dim, nq, points)
        a = weights[:, :, :, lvl].permute(0, 2, 1, 3).reshape(bs * heads, 1, nq, points)
        out = out + (s * a).sum(-1)
    return out.view(bs, heads * dim, nq).transpose(1, 2)


@needs_standin
def test_ms_deform_attn_function_equals_the_reference():
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    g = torch.Generator().manual_seed(9)
    shapes = torch.tensor([[6, 8], [3, 4], [2, 2]])
    start = torch.cat([shapes.new_zeros(1), (shapes[:, 0] * shapes[:, 1]).cumsum(0)[:-1]])
    value = torch.randn(2, int((shapes[:, 0] * shapes[:, 1]).sum()), 2, 4, generator=g, dtype=torch.float64)
    loc = torch.rand(2, 5, 2, 3, 4, 2, generator=g, dtype=torch.float64) * 1.2 - 0.1  # some points off the map
    attn = torch.rand(2, 5, 2, 3, 4, generator=g, dtype=torch.float64)
    leaves = [t.float().clone().requires_grad_() for t in (value, loc, attn)]
    out = MultiScaleDeformableAttnFunction.apply(leaves[0], shapes, start, leaves[1], leaves[2], 64)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * up.float()).sum().backward()
    refs = [t.clone().requires_grad_() for t in (value, loc, attn)]
    ref = ms_deform_attn_reference(refs[0], shapes, refs[1], refs[2])
    (ref * up).sum().backward()
    _close(out, ref.detach(), torch.float32, 'forward')
    for name, a, r in zip(('value', 'sampling locations', 'attention weights'), leaves, refs):
        _close(a.grad, r.grad, torch.float32, 'gradient of ' + name)


# ------------------------------------------------------------------------------------------------ unserved ops
@needs_standin
def test_an_op_without_a_torchvision_form_is_one_error_naming_it_and_the_compiled_opt_in():
    from mmcv.ops import soft_nms
    ext = _ext()
    assert hasattr(ext, 'carafe_forward') and hasattr(ext, 'softnms')  # mmcv.ops imports: load_ext asserts them
    with pytest.raises(NotImplementedError) as err:
        soft_nms(torch.tensor([[0, 0, 10, 10.]]), torch.tensor([0.9]))
    msg = str(err.value)
    assert '\n' not in msg
    assert msg.startswith("mmcv op 'softnms' has no torchvision or torch form") and 'MMCV_COMPILED=1' in msg
    assert 'softnms' not in ext.SERVED and 'nms' in ext.SERVED


# ------------------------------------------------------------------------------------------------ in place
def _python(code, env=None, cwd=None):
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


@needs_standin
def test_a_bare_python_of_the_environment_imports_mmdet_and_mmseg_through_the_standin(tmp_path):
    """No softfree_mm import: the .pth the install wrote puts the stand-in in place (also for torchrun workers, mim and
    the mm packages' own tools, which start this same Python); without its finder, the same imports fail."""
    code = """
        import sys
        {strip}
        import mmdet.models, mmseg.models, mmdet.evaluation, mmdet.datasets
        import mmcv._ext
        assert 'softfree_mm' not in sys.modules, 'softfree_mm was imported'
        print(mmcv._ext.__file__)
        """
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = _python(code.format(strip=''), env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.realpath(proc.stdout.strip()) == os.path.realpath(finder.STANDIN)
    strip = f'sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, {finder.MARK!r}, False)]'
    proc = _python(code.format(strip=strip), env, tmp_path)
    assert proc.returncode != 0 and "No module named 'mmcv._ext'" in proc.stderr


def test_the_pth_line_leaves_a_softfree_mm_without_the_standin_alone(tmp_path):
    """The line the install puts in site-packages, run where the softfree_mm found first has no stand-in (an older
    checkout on PYTHONPATH): no error and no finder; with this package found, it puts the finder in place."""
    shadow = tmp_path / 'old' / 'softfree_mm'
    shadow.mkdir(parents=True)
    (shadow / '__init__.py').write_text('')
    code = f"""
        import sys
        sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, {finder.MARK!r}, False)]
        exec({finder.PTH_LINE!r})
        print(sum(bool(getattr(f, {finder.MARK!r}, False)) for f in sys.meta_path))
        """
    env = dict(os.environ, PYTHONPATH=str(shadow.parent))
    proc = _python(code, env, tmp_path)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, '0', '')
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = _python(code, env, tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, '1'), proc.stderr[-2000:]


@needs_standin  # a compiled build is itself the case: its .so is found before anything on mmcv's path
def test_a_compiled_ext_is_used_and_the_standin_stays_out_of_the_way(tmp_path):
    """An ``mmcv/_ext`` that Python's own path finder finds (a compiled build; here a module on mmcv's path) is the
    one mmcv.ops gets, and softfree_mm then routes only CUDA calls (compat.TorchvisionOps)."""
    fake = tmp_path / 'compiled'
    fake.mkdir()
    (fake / '_ext.py').write_text(textwrap.dedent("""
        COMPILED = True
        def get_compiling_cuda_version():
            return 'not available'
        def __getattr__(name):
            if name.startswith('__'):
                raise AttributeError(name)
            return lambda *a, **k: 'compiled ' + name
        """))
    proc = _python(f"""
        import mmcv
        mmcv.__path__.append({str(fake)!r})
        import mmcv.ops, mmcv._ext, sys
        assert getattr(mmcv._ext, 'COMPILED', False), mmcv._ext.__file__
        import softfree_mm
        from softfree_mm import compat
        assert not compat.mmcv_ext_is_standin()
        assert 'mmcv_ops_on_torchvision' in compat.APPLIED
        assert sys.modules['mmcv.ops.nms'].ext_module is compat.TORCHVISION_OPS
        import torch
        print(sys.modules['mmcv.ops.nms'].ext_module.nms(torch.zeros(1, 4), torch.ones(1), iou_threshold=0.5))
        """, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == 'compiled nms'


@needs_standin
def test_the_repair_route_is_not_applied_over_the_standin():
    import mmcv.ops  # noqa: F401
    assert 'mmcv_ops_on_torchvision' not in compat.APPLIED and compat.TORCHVISION_OPS is None
    for name in ('nms', 'roi_align'):
        assert sys.modules[f'mmcv.ops.{name}'].ext_module is _ext()
    assert finder.is_standin(_ext()) and _ext().get_compiling_cuda_version() == 'not available'


@needs_standin
def test_mmdets_own_train_py_trains_a_shipped_config_on_the_standin(tmp_path):
    """mmdet's tools/train.py (as mim ships it), not ours: it imports mmdet before the config's custom_imports bring
    softfree_mm, and the Mask R-CNN's RPN / RoI heads and mask targets call nms and roi_align on every step."""
    import mmdet
    from tests.helpers.demo import DEMO, TINY
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    data = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'make_demo_data.py'), '--out', 'data/demo',
                           '--only', 'coco'], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert data.returncode == 0, data.stderr[-2000:]
    base, text = TINY['maskrcnn']
    (tmp_path / 'tiny.py').write_text(f'_base_ = {os.path.join(DEMO, base)!r}\n{text}\n'
                                      'train_cfg = dict(max_iters=2, val_interval=1000)\n'
                                      'default_hooks = dict(logger=dict(interval=1))\n')
    train = os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    proc = subprocess.run([sys.executable, train, 'tiny.py', '--work-dir', 'work'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    steps = [line for line in proc.stdout.splitlines() if 'Iter(train) [' in line]
    assert len(steps) == 2 and all('loss_mask:' in line and 'loss_rpn_cls:' in line for line in steps)
    assert (tmp_path / 'work' / 'iter_2.pth').is_file()
