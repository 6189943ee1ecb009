"""Tracing, export and FLOP counting on every backbone family (tiny presets, odd image sizes).

Under ``torch.jit.trace`` (what ONNX export, mmdeploy and mmengine's FLOP counters use) sizes read from tensors are
0-dim tensors, so the token grids the backbones hand to the kernels hold tensors: the grid checks must take them, and
the backbones' grid arithmetic must stay right when exported (ONNX divides integers by truncation). Each family is
exported in its own layout (softmax: masks, padding, ceil divisions) to ONNX (the graph run by onnxruntime against
eager; Swin also through ``torch.export``), every kernel is traced on a traced grid (with masks where it takes them), the
grid / landmark kernels are exported to ONNX, each family in the set-up of the grid kernels runs through mmengine's
``FlopAnalyzer`` (its MLP's first linear layer counted exactly: tokens x in x out computed here), and a detector
through mmdet's ``get_flops`` recipe with ``get_model_complexity_info``. (Counting the attention products themselves
is the project's own counter's job.)
"""
import io
import math
import warnings

import numpy as np
import pytest
import torch

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm import models
from softfree_mm.attention import build_attention, kernel_arguments, list_attentions

from tests.helpers.presets import TINY  # every registered backbone

FAMILIES = list(TINY)
# a kernel that needs the token grid, in each family's set-up for it (XCiT has no grid: poly; SOFT: its own
# default, the official SOFT kernels in stages 1-3)
GRID_KERNEL = {family: 'inline' for family in FAMILIES}
GRID_KERNEL.update(SoftFreeXCiT='poly', SoftFreeSOFT=None)
SIZE = (35, 45)  # odd on purpose: padding, ceil divisions, shifted and partial windows all happen


def build(family, kernel):
    """The tiny backbone with ``kernel`` (None: the family's default), in the set-up it fits (None when none)."""
    cls = getattr(models, family)
    attn = dict(type=kernel, mix=True) if kernel == 'synthesizer' else kernel
    for extra in ({}, (cls.family.fit or (None, None))[1]):
        if extra is None:
            break
        try:
            return cls(**dict(TINY[family], **extra, **({} if kernel is None else dict(attn_cfg=attn)))).eval()
        except ValueError:
            continue
    return None


def close(outs, refs, tol=1e-4):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        o = torch.as_tensor(np.asarray(o)) if not isinstance(o, torch.Tensor) else o
        assert o.shape == r.shape
        assert torch.allclose(o, r, atol=tol, rtol=tol), (o - r).abs().max()


# ---------------------------------------------------------------------------------------------- the grid check
def test_every_registered_backbone_is_covered():
    assert sorted(FAMILIES) == sorted(models.backbones.__all__)


def test_grid_check_takes_traced_sizes_and_still_refuses_wrong_ones():
    from softfree_mm.attention.base import check_hw, resolve_hw

    seen = {}

    def f(x):
        hw = (x.shape[1], x.shape[2])  # 0-dim tensors while tracing
        seen.setdefault('types', tuple(type(s) for s in hw))  # the first call is the tracing one
        h, w = check_hw('probe', hw, x.shape[1] * x.shape[2])
        return x.reshape(x.shape[0], h * w)

    traced = torch.jit.trace(f, torch.randn(2, 3, 5), check_trace=False)
    assert seen['types'] == (torch.Tensor, torch.Tensor)
    assert traced(torch.randn(2, 4, 6)).shape == (2, 24)  # the sizes stayed sizes in the graph, not constants

    def wrong(x):
        return check_hw('probe', (x.shape[1], x.shape[2]), x.shape[1] * x.shape[2] + 1)

    with pytest.raises(ValueError, match=r'probe: hw=\(3, 5\) gives 15 tokens but the input has N=16'):
        torch.jit.trace(wrong, torch.randn(1, 3, 5))
    with pytest.raises(ValueError, match=r'hw must be a pair of positive ints'):
        check_hw('probe', (3.0, 5), 15)
    with pytest.raises(ValueError, match=r'hw must be a pair of positive ints'):
        check_hw('probe', (torch.tensor(3.0), 5), 15)
    assert resolve_hw('probe', None, torch.tensor(16)) == (4, 4)


# ---------------------------------------------------------------------------------------------- jit.trace
class GridAttention(torch.nn.Module):
    """A kernel fed the way the backbones feed it: the grid read from tensor shapes (traced sizes under tracing),
    a padded-key mask when the kernel takes masks."""

    def __init__(self, kernel):
        super().__init__()
        cfg = dict(type=kernel, max_len=64) if 'max_len' in kernel_arguments(kernel) else kernel
        self.kernel = build_attention(cfg, num_heads=2, head_dim=8)

    def forward(self, x):  # (B, heads, H, W, 3 * d)
        b, h, gh, gw, _ = x.shape
        q, k, v = x.flatten(2, 3).chunk(3, dim=-1)
        mask = None
        if self.kernel.supports_mask:
            n = torch.arange(gh * gw, device=x.device)
            mask = (n[None, :] < gh * gw - gw) | (n[:, None] == n[None, :])  # last row: padded keys
        return self.kernel(q, k, v, hw=(gh, gw), scale=None, bias=None, mask=mask)


@pytest.mark.parametrize('kernel', list_attentions())
def test_every_kernel_traces_with_a_traced_grid_and_matches_eager(kernel):
    module = GridAttention(kernel).eval()
    x = torch.randn(2, 2, 5, 6, 24)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore', torch.jit.TracerWarning)
        traced = torch.jit.trace(module, x, check_trace=False)
        close([traced(x)], [module(x)])


# ---------------------------------------------------------------------------------------------- export
def onnx_outputs(model, x):
    import onnxruntime as ort
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(buf.getvalue(), options, providers=['CPUExecutionProvider'])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


@pytest.mark.parametrize('family', FAMILIES)
def test_onnx_export_runs_in_onnxruntime_and_matches_eager(family):
    """The family's own layout (softmax): window / stripe masks and padding, ceil divisions, the grid checks, all in
    the traced graph the ONNX exporter (and mmdeploy) work from."""
    x = torch.randn(1, 3, *SIZE)
    model = build(family, 'softmax')
    with torch.no_grad():
        ref = model(x)
    close(onnx_outputs(model, x), ref)


def test_torch_export_matches_eager():
    """torch.export (dynamo) on the family with the most grid logic (shifted, padded, masked windows); the others
    export alike (torch.export sees sizes as ints, which the grid code has always taken)."""
    x = torch.randn(1, 3, *SIZE)
    model = build('SoftFreeSwin', 'softmax')
    with torch.no_grad():
        close(torch.export.export(model, (x,)).module()(x), model(x))


@pytest.mark.parametrize('kernel', ['soft', 'nystrom', 'inline'])
def test_grid_and_landmark_kernels_export_to_onnx(kernel):
    """Landmark grids (ceil of H / ratio), segment means over a token count that is not a constant, local residual
    on the grid: in the no-reduction PVTv2 set-up, where every token-grid kernel fits."""
    x = torch.randn(1, 3, *SIZE)
    model = getattr(models, 'SoftFreePVTv2')(**dict(TINY['SoftFreePVTv2'], attn_cfg=kernel, sr_ratios=(1, 1, 1, 1)))
    with torch.no_grad():
        ref = model.eval()(x)
    close(onnx_outputs(model, x), ref)


# ---------------------------------------------------------------------------------------------- FLOP counters
def _fc1_flops(family, model, size):
    """{module name: MACs} of the first MLP layer of every stage, from the token grid computed here: ceil(H / s) x
    ceil(W / s) tokens at stride s (plus SOFT's class token in its last stage; mmengine counts one multiply-add as
    one FLOP)."""
    h, w = size
    out = {}
    if family == 'SoftFreeXCiT':
        n = math.ceil(h / 16) * math.ceil(w / 16)
        fc1 = model.blocks[0].mlp.fc1
        return {'blocks.0.mlp.fc1': n * fc1.in_features * fc1.out_features}
    for i, stage in enumerate(model.stages):
        n = math.ceil(h / 2 ** (i + 2)) * math.ceil(w / 2 ** (i + 2)) + int(getattr(stage, 'with_cls', False))
        fc1 = stage.blocks[0].mlp.fc1
        out[f'stages.{i}.blocks.0.mlp.fc1'] = n * fc1.in_features * fc1.out_features
    return out


@pytest.mark.parametrize('family', FAMILIES)
def test_mmengine_flop_analyzer_traces_each_family_and_counts_the_mlp_exactly(family):
    """mmengine's FlopAnalyzer (what get_model_complexity_info runs) on the family's grid set-up (a kernel that
    needs the token grid: InLine's local residual, SOFT's landmarks; XCiT: poly)."""
    from mmengine.analysis import FlopAnalyzer

    model = build(family, GRID_KERNEL[family])
    x = torch.randn(1, 3, *SIZE)
    by_module = FlopAnalyzer(model, (x,)).by_module()
    assert by_module[''] > 0
    for name, macs in _fc1_flops(family, model, SIZE).items():
        assert by_module[name] == macs, name


def test_mmdet_get_flops_recipe_runs_on_a_detector_with_our_backbone():
    """What mmdet's tools/analysis_tools/get_flops.py does per image: preprocess a batch, bind its data samples to
    forward, count the whole detector's FLOPs with get_model_complexity_info (mmdet's RetinaNet, our PVTv2)."""
    import importlib
    import os
    from functools import partial

    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmengine.analysis import get_model_complexity_info
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    base = os.path.join(os.path.dirname(importlib.import_module('mmdet').__file__), '.mim', 'configs', '_base_',
                        'models', 'retinanet_r50_fpn.py')
    cfg = Config.fromfile(base)
    cfg.model.backbone = dict(type='SoftFreePVTv2', **TINY['SoftFreePVTv2'])
    cfg.model.neck.in_channels = list(TINY['SoftFreePVTv2']['embed_dims'])
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model).eval()
    image = torch.randint(0, 255, (3, *SIZE), dtype=torch.uint8)
    sample = DetDataSample(metainfo=dict(img_shape=SIZE, ori_shape=SIZE, scale_factor=(1., 1.)))
    data = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]))
    model.forward = partial(model.forward, data_samples=data['data_samples'])
    info = get_model_complexity_info(model, None, inputs=data['inputs'], show_table=False, show_arch=False)
    size = tuple(data['inputs'].shape[-2:])  # padded to a multiple of 32 by the preprocessor
    assert info['flops'] > sum(_fc1_flops('SoftFreePVTv2', model.backbone, size).values())
    assert info['params'] == sum(p.numel() for p in model.parameters())
