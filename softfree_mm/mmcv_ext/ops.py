"""The stand-in for mmcv's compiled extension ``mmcv._ext``: mmcv's op functions on torchvision's and torch's
kernels, on every device.

mmcv-lite 2.1.0 is mmcv 2.1.0's Python without ``mmcv._ext``; every ``mmcv.ops`` module asks ``load_ext('_ext',
names)`` for its functions at import. This file is loaded AS ``mmcv._ext`` (``finder.py``) when no compiled one
exists, so it imports torch and torchvision only, never softfree_mm. Each function takes the arguments and fills the
output buffers exactly as mmcv's C++ function of the same name does (the callers are mmcv's ``autograd.Function`` s).

Served: ``nms``; ``roi_align_forward`` / ``_backward`` (``pool_mode='avg'``); ``deform_conv_*`` and
``modulated_deform_conv_*`` (DCN v1 / v2); ``sigmoid_focal_loss_*`` (mmcv calls it on CUDA only) and
``ms_deform_attn_*`` (on CUDA only; mmcv's own pure-torch form, differentiated by autograd). Any other name is a
function that raises :class:`MissingCompiledOp` naming the op and how to get the compiled ops.
"""
import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)

COMPILED_HOWTO = ('compile mmcv\'s ops instead: MMCV_COMPILED=1 bash tools/setup_env.sh (docs/get_started.md, '
                  '"mmcv: ops on torchvision or compiled")')
SERVED = []  # the op names served here
calls = {}  # op name -> calls served (the tests read it)


class MissingCompiledOp(NotImplementedError):
    pass


def _served(fn):
    def op(*args, **kwargs):
        calls[fn.__name__] = calls.get(fn.__name__, 0) + 1
        return fn(*args, **kwargs)

    op.__name__ = op.__qualname__ = fn.__name__
    op.__doc__ = fn.__doc__
    SERVED.append(fn.__name__)
    return op


def _unserved(name):
    def op(*args, **kwargs):
        raise MissingCompiledOp(f"mmcv op '{name}' has no torchvision or torch form in softfree_mm's stand-in for "
                                f'mmcv._ext (mmcv-lite); {COMPILED_HOWTO}')

    op.__name__ = name
    return op


def __getattr__(name):  # load_ext asserts hasattr for every name an mmcv.ops module asks for
    if name.startswith('__'):
        raise AttributeError(name)
    return _unserved(name)


def _compute_dtype(*tensors):
    """float32 for the AMP dtypes (box coordinates and sampling positions are never exact in 16 bits), else the
    promoted dtype (float64 stays float64); of tensors or dtypes."""
    dts = [t if isinstance(t, torch.dtype) else t.dtype for t in tensors]
    dt = dts[0]
    for other in dts[1:]:
        dt = torch.promote_types(dt, other)
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


# ------------------------------------------------------------------------------------------------ info
def get_compiler_version():
    return 'none: softfree_mm stand-in for mmcv._ext (ops on torchvision / torch)'


def get_compiling_cuda_version():
    return 'not available'  # what a CPU-only mmcv build answers; nothing here was compiled with CUDA


# ------------------------------------------------------------------------------------------------ nms
@_served
def nms(bboxes, scores, iou_threshold, offset=0):
    """Indices kept, in mmcv's order: by descending score as ``scores.sort(0, descending=True)`` leaves them (mmcv's
    own call, so tied scores come in its order, not torchvision's stable one); a box goes when its IoU with a kept
    box is > iou_threshold. ``offset=1`` is mmcv's legacy +1 box size, the same IoU as boxes one unit larger."""
    if offset:
        bboxes = torch.cat([bboxes[:, :2], bboxes[:, 2:4] + offset], dim=1)
    dt = _compute_dtype(bboxes, scores)
    order = scores.sort(0, descending=True)[1]
    rank = torch.arange(len(order), 0, -1, dtype=dt, device=bboxes.device)  # torchvision keeps this order
    keep = torch.ops.torchvision.nms(bboxes[order].to(dt), rank, float(iou_threshold))
    return order[keep]


# ------------------------------------------------------------------------------------------------ RoIAlign
ROI_ALIGN_CUDA_DTYPES = (torch.float16, torch.float32, torch.float64)  # what torchvision's CUDA kernel dispatches on
NEGATIVE_ROI = 'ROIs in ROIAlign cannot have non-negative size!'  # mmcv's CPU kernel's message, word for word


def _check_avg(pool_mode):
    if pool_mode != 1:  # mmcv passes 0 for 'max', 1 for 'avg'
        raise MissingCompiledOp("mmcv op 'roi_align' with pool_mode='max' has no torchvision form (torchvision "
                                f"averages); use pool_mode='avg', or {COMPILED_HOWTO}")


def roi_align_dtype(features: torch.dtype, rois: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype RoIAlign computes in. On CUDA the features' own where torchvision's kernel takes it (float16 as
    mmcv's CUDA kernel: no float32 copy of a whole feature level under AMP), float32 for bfloat16, which it does not
    take; elsewhere :func:`_compute_dtype`'s (torchvision's CPU kernel is no faster in 16 bits)."""
    if device_type == 'cuda':
        return features if features in ROI_ALIGN_CUDA_DTYPES else torch.float32
    return _compute_dtype(features, rois)


def _roi_align_args(features, rois, spatial_scale, aligned):
    """(compute dtype, the RoIs in it); on CPU a RoI of negative size with ``aligned`` is refused as mmcv's CPU kernel
    refuses it (its CUDA kernel computes it: so does this one on CUDA)."""
    dt = roi_align_dtype(features.dtype, rois.dtype, features.device.type)
    if aligned and features.device.type != 'cuda' and rois.numel():
        size = (rois[:, 3:5] - rois[:, 1:3]) * float(spatial_scale)
        bad = (size < 0).any(1).nonzero().flatten()
        if bad.numel():
            i = int(bad[0])
            raise RuntimeError(f'{NEGATIVE_ROI} (RoI {i} of {len(rois)}: [batch, x1, y1, x2, y2] = '
                               f'{[round(float(v), 4) for v in rois[i]]}, aligned=True: x2 < x1 or y2 < y1; '
                               "mmcv's CPU kernel refuses such a RoI)")
    return dt, rois.to(dt)


@_served
def roi_align_forward(input, rois, output, argmax_y, argmax_x, aligned_height, aligned_width, spatial_scale,
                      sampling_ratio, pool_mode, aligned):
    """torchvision's roi_align has mmcv's semantics: ``aligned`` shifts by -0.5, ``sampling_ratio=0`` samples
    ceil(bin size) points per bin side."""
    _check_avg(pool_mode)
    dt, rois = _roi_align_args(input, rois, spatial_scale, aligned)
    # autocast off: torchvision's autocast form would copy the level to float32 and back
    with torch.autocast(input.device.type, enabled=False):
        out = torch.ops.torchvision.roi_align(input.to(dt), rois, float(spatial_scale), int(aligned_height),
                                              int(aligned_width), int(sampling_ratio), bool(aligned))
    output.copy_(out)


@_served
def roi_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input, aligned_height, aligned_width,
                       spatial_scale, sampling_ratio, pool_mode, aligned):
    _check_avg(pool_mode)
    dt, rois = _roi_align_args(grad_input, rois, spatial_scale, aligned)
    b, c, h, w = grad_input.shape
    with torch.autocast(grad_output.device.type, enabled=False):
        grad = torch.ops.torchvision._roi_align_backward(
            grad_output.to(dt), rois, float(spatial_scale), int(aligned_height), int(aligned_width), b, c, h, w,
            int(sampling_ratio), bool(aligned))
    grad_input.copy_(grad)


# ------------------------------------------------------------------------------------------------ DCN v1 / v2
def _deform(input, weight, offset, mask, bias, stride, pad, dilation, group, deformable_group):
    """torchvision's deform_conv2d (same offset layout as mmcv: (dy, dx) per kernel position; zero outside the
    map), its arguments and the dtype it computes in."""
    use_mask = mask is not None
    dt = _compute_dtype(input, weight, offset)
    if mask is None:  # torchvision's own placeholder when there is none
        mask = input.new_zeros((input.shape[0], 1))
    if bias is None or bias.numel() == 0:
        bias = input.new_zeros(weight.shape[0])
    args = [t.to(dt) for t in (input, weight, offset, mask, bias)]
    return args, (*stride, *pad, *dilation, int(group), int(deformable_group), use_mask)


@_served
def deform_conv_forward(input, weight, offset, output, columns, ones, kW, kH, dW, dH, padW, padH, dilationW,
                        dilationH, group, deformable_group, im2col_step):
    args, opts = _deform(input, weight, offset, None, None, (dH, dW), (padH, padW), (dilationH, dilationW), group,
                         deformable_group)
    output.copy_(torch.ops.torchvision.deform_conv2d(*args, *opts))


def _deform_grads(grad_output, args, opts):
    return torch.ops.torchvision._deform_conv2d_backward(grad_output.to(args[0].dtype), *args, *opts)


@_served
def deform_conv_backward_input(input, offset, gradOutput, gradInput, gradOffset, weight, columns, kW, kH, dW, dH,
                               padW, padH, dilationW, dilationH, group, deformable_group, im2col_step):
    args, opts = _deform(input, weight, offset, None, None, (dH, dW), (padH, padW), (dilationH, dilationW), group,
                         deformable_group)
    g_input, _, g_offset, _, _ = _deform_grads(gradOutput, args, opts)
    gradInput.copy_(g_input)
    gradOffset.copy_(g_offset)


@_served
def deform_conv_backward_parameters(input, offset, gradOutput, gradWeight, columns, ones, kW, kH, dW, dH, padW,
                                    padH, dilationW, dilationH, group, deformable_group, scale, im2col_step):
    # the weight's gradient does not depend on its values: a zero weight of its shape stands in for it
    args, opts = _deform(input, torch.zeros_like(gradWeight), offset, None, None, (dH, dW), (padH, padW),
                         (dilationH, dilationW), group, deformable_group)
    gradWeight.add_(scale * _deform_grads(gradOutput, args, opts)[1])


@_served
def modulated_deform_conv_forward(input, weight, bias, ones, offset, mask, output, columns, kernel_h, kernel_w,
                                  stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group,
                                  with_bias):
    args, opts = _deform(input, weight, offset, mask, bias if with_bias else None, (stride_h, stride_w),
                         (pad_h, pad_w), (dilation_h, dilation_w), group, deformable_group)
    output.copy_(torch.ops.torchvision.deform_conv2d(*args, *opts))


@_served
def modulated_deform_conv_backward(input, weight, bias, ones, offset, mask, columns, grad_input, grad_weight,
                                   grad_bias, grad_offset, grad_mask, grad_output, kernel_h, kernel_w, stride_h,
                                   stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group,
                                   with_bias):
    args, opts = _deform(input, weight, offset, mask, bias if with_bias else None, (stride_h, stride_w),
                         (pad_h, pad_w), (dilation_h, dilation_w), group, deformable_group)
    g_input, g_weight, g_offset, g_mask, g_bias = _deform_grads(grad_output, args, opts)
    for buf, g in ((grad_input, g_input), (grad_weight, g_weight), (grad_offset, g_offset), (grad_mask, g_mask)):
        buf.copy_(g)
    if with_bias:
        grad_bias.copy_(g_bias)


# ------------------------------------------------------------------------------------------------ focal loss
def _focal_terms(input, target, weight):
    x = input.to(_compute_dtype(input))
    p = torch.sigmoid(x)
    classes = torch.arange(x.shape[1], device=x.device)
    pos = (target.long()[:, None] == classes).to(x.dtype)
    w = weight.to(x.dtype)[target.long()][:, None] if weight is not None and weight.numel() else None
    tiny = torch.finfo(torch.float32).tiny  # FLT_MIN in every dtype, as mmcv's kernel clamps
    return p, pos, w, torch.log(p.clamp(min=tiny)), torch.log((1 - p).clamp(min=tiny))


@_served
def sigmoid_focal_loss_forward(input, target, weight, output, gamma, alpha):
    """mmcv's kernel: -alpha (1-p)^g log p for the target class, -(1-alpha) p^g log(1-p) for the others, times
    weight[target] when a weight is given."""
    p, pos, w, log_p, log_1p = _focal_terms(input, target, weight)
    out = -pos * alpha * (1 - p) ** gamma * log_p - (1 - pos) * (1 - alpha) * p ** gamma * log_1p
    output.copy_(out if w is None else out * w)


@_served
def sigmoid_focal_loss_backward(input, target, weight, grad_input, gamma, alpha):
    p, pos, w, log_p, log_1p = _focal_terms(input, target, weight)
    term_p = (1 - p) ** gamma * (1 - p - gamma * p * log_p)
    term_n = p ** gamma * (gamma * (1 - p) * log_1p - p)
    grad = -pos * alpha * term_p - (1 - pos) * (1 - alpha) * term_n
    grad_input.copy_(grad if w is None else grad * w)


# ------------------------------------------------------------------------------------------------ MSDeformAttn
def _ms_deform_attn(value, spatial_shapes, sampling_locations, attention_weights):
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    return multi_scale_deformable_attn_pytorch(value, spatial_shapes, sampling_locations, attention_weights)


@_served
def ms_deform_attn_forward(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                           attention_weights, im2col_step):
    """mmcv's own pure-torch form (grid_sample, zero padding), which mmcv runs itself off CUDA."""
    return _ms_deform_attn(value, value_spatial_shapes, sampling_locations, attention_weights)


@_served
def ms_deform_attn_backward(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                            attention_weights, grad_output, grad_value, grad_sampling_loc, grad_attn_weight,
                            im2col_step):
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (value, sampling_locations, attention_weights)]
        out = _ms_deform_attn(leaves[0], value_spatial_shapes, leaves[1], leaves[2])
        grads = torch.autograd.grad(out, leaves, grad_output)
    for buf, g in zip((grad_value, grad_sampling_loc, grad_attn_weight), grads):
        buf.copy_(g)
