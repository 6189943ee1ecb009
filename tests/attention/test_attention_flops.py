"""Every kernel declares its multiply-adds (``flops``); the declarations against torch's own counter on the kernel's
forward, against counts by hand, and the FLOPs of whole models (analysis/flops.py, tools/analysis/get_flops.py)."""
import math
import os

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from softfree_mm.attention import ATTENTION, build_attention, list_attentions

from tests.helpers import ROOT, load_tool

VARIANTS = [dict(type=n) for n in list_attentions() if n != 'softmax'] + [
    dict(type='poly', degree=1), dict(type='poly', degree=2), dict(type='inline', local_residual='head'),
    dict(type='inline', local_residual=False), dict(type='soft', num_landmarks=5),
    dict(type='soft', landmark_ratio=2, normalized=True, conv_size=3, tie_qk=False),
    dict(type='soft', landmark_op='avgpool', landmark_ratio=2), dict(type='synthesizer', mode='dense', mix=True),
    dict(type='synthesizer', mode='factorized_random'), dict(type='synthesizer', mode='factorized_dense')]


def _label(cfg):
    return ','.join(f'{k}={v}' for k, v in cfg.items())


def _counted(fn):
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops() // 2  # torch counts 2 flops per multiply-add


@pytest.mark.parametrize('cfg', VARIANTS, ids=_label)
def test_declared_flops_equal_torchs_count_of_the_kernels_own_forward(cfg):
    """Two shapes (a square and an oblong grid, d != dv), with and without a mask where the kernel takes one.
    softmax is below (torch's counter does not see CPU SDPA); InLine's masked 'channel' residual is written out
    elementwise (per row), which torch's counter cannot see: it is in the hand counts."""
    for nq, d, dv, hw in ((36, 8, 8, (6, 6)), (40, 4, 4, (5, 8)), (35, 6, 3, (5, 7))):
        kern = build_attention(cfg, num_heads=1, head_dim=d)
        g = torch.Generator().manual_seed(nq)
        q, k = torch.randn(1, 1, nq, d, generator=g), torch.randn(1, 1, nq, d, generator=g)
        v = torch.randn(1, 1, nq, dv, generator=g)
        if (kern.local_residual == 'channel' if cfg['type'] == 'inline' else cfg['type'] == 'agent') and dv != d:
            continue  # the official residual (InLine) and the depthwise conv on v (agent) need dv == d
        masks = [None]
        if kern.supports_mask and not (cfg['type'] == 'inline' and kern.local_residual == 'channel'):
            masks.append(torch.rand(nq, nq, generator=g) > 0.3)
        for mask in masks:
            got = _counted(lambda: kern(q, k, v, hw=hw, mask=mask))
            assert kern.flops(nq, nq, d, dv, masked=mask is not None, hw=hw) == got, (nq, mask is not None)


def test_every_registered_kernel_declares_flops():
    for name in list_attentions():
        kern = build_attention(name, num_heads=2, head_dim=8)
        assert isinstance(kern.flops(49, 49, 8, 8, hw=(7, 7)), int)
        if ATTENTION.get(name).supports_mask:
            assert isinstance(kern.flops(49, 49, 8, 8, masked=True, hw=(7, 7)), int)


def test_flops_by_hand():
    sm = build_attention('softmax')
    assert sm.flops(10, 20, 8, 4) == 10 * 20 * 8 + 10 * 20 * 4  # q k^T and A v
    # the explicit matrix path of softmax has the same products (torch's counter does see those)
    q, k, v = torch.randn(1, 1, 10, 8), torch.randn(1, 1, 20, 8), torch.randn(1, 1, 20, 4)
    assert _counted(lambda: sm.attention_matrix(q, k) @ v) == sm.flops(10, 20, 8, 4)
    assert build_attention('poly').flops(10, 20, 8, 4) == 2400  # C(10, 3) = 120 features: explicit is cheaper
    # poly p = 2, d = 2: 3 monomial features (x^2, xy, y^2); k's features times v, q's features times kv
    assert build_attention(dict(type='poly', degree=2)).flops(1000, 1000, 2, 4) == (1000 + 1000) * 3 * 4
    assert build_attention('linear').flops(10, 20, 8, 4) == 20 * 8 * 4 + 10 * 8 * 4 + 10 * 8  # + the normaliser
    assert build_attention('linear').flops(10, 20, 8, 4, masked=True) == 2400
    # SOFT at a 16 x 16 grid, ratio 8: 2 x 2 = 4 landmarks from an 8 x 8 stride-8 conv over 8 channels
    soft = build_attention('soft', num_heads=1, head_dim=8)
    conv, gauss, newton = 4 * 8 * 8 * 64, 256 * 4 * 8 + 4 * 4 * 8, 20 * 2 * 4 ** 3
    assert soft.flops(256, 256, 8, 8, hw=(16, 16)) == conv + gauss + newton + 512 * 4 * 8 + 4 * 4 * 8
    # InLine under a mask, official residual without context: means, A, A @ v; per-row residual weights
    # (two grouped 1x1 convs, d -> d -> 9d) and the 3x3 neighbourhood of every row's d channels
    inl = build_attention('inline', num_heads=1, head_dim=4)
    assert inl.flops(9, 9, 4, 4, masked=True, hw=(3, 3)) == 3 * 81 * 4 + 81 * 4 + 81 * 4 + 9 * 10 * 16 + 9 * 9 * 4


def test_soft_cost_is_cubic_in_n_with_a_landmark_ratio_and_linear_with_fixed_landmarks():
    ratio = build_attention('soft', num_heads=1, head_dim=32)
    fixed = build_attention(dict(type='soft', num_landmarks=49), num_heads=1, head_dim=32)
    sides = [64, 128, 256]
    slope = lambda kern: math.log(kern.flops(sides[-1] ** 2, sides[-1] ** 2, 32, 32, hw=(sides[-1],) * 2) /  # noqa
                                  kern.flops(sides[0] ** 2, sides[0] ** 2, 32, 32, hw=(sides[0],) * 2)) / \
        math.log(sides[-1] ** 2 / sides[0] ** 2)
    assert slope(ratio) > 2.5  # m = N / 64 landmarks: the Newton steps' m^3 dominate at large N
    assert 0.9 < slope(fixed) <= 1.0  # linear (constants of the m landmarks aside)
    assert ratio.complexity == 'cubic' and fixed.complexity == 'linear'


def test_model_flops_add_the_kernels_declarations_to_mmengines_count(monkeypatch):
    """A tiny Swin: the attention part is every window's declared cost; the rest is mmengine's own count of the
    model minus what it saw inside the kernel modules (which for SDPA is nothing; softmax's explicit CPU path for
    small biased windows and poly's products it sees)."""
    from mmengine.analysis import FlopAnalyzer

    from softfree_mm.analysis.flops import count_flops
    from softfree_mm.attention import softmax as softmax_module
    from softfree_mm.models import SoftFreeSwin

    torch.manual_seed(0)
    limits = {n: getattr(softmax_module, n) for n in ('EXPLICIT_CPU_ELEMENTS', 'TINY_CPU_ELEMENTS')}
    for kernel, sdpa in (('softmax', True), ('softmax', False), ('poly', False)):
        for name, value in limits.items():
            monkeypatch.setattr(softmax_module, name, 0 if sdpa else value)
        model = SoftFreeSwin(arch=dict(embed_dims=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4)),
                             attn_cfg=kernel).eval()
        res = count_flops(model, (1, 3, 112, 112))
        # windows of 7 x 7: stage grids 28, 14, 7, 4 (padded to 7); dims 16, 32, 64, 128 in 1, 2, 2, 4 heads
        windows = [16 * 2, 4 * 2, 1, 1]  # windows x blocks
        heads, head_dims = (1, 2, 2, 4), (16, 16, 32, 32)
        expect = sum(w * h * 49 * 49 * 2 * d for w, h, d in zip(windows, heads, head_dims))
        assert res['attention'] == expect and res['counter'] == 'mmengine'
        fa = FlopAnalyzer(model, (torch.randn(1, 3, 112, 112),))
        fa.unsupported_ops_warnings(False)
        fa.uncalled_modules_warnings(False)
        inside = sum(v for n, v in fa.by_module().items() if n.endswith('.kernel'))
        assert res['rest'] == fa.total() - inside
        assert inside == (0 if sdpa else expect)  # mmengine sees explicit products, not SDPA's


def _get_flops_main():
    return load_tool('analysis/get_flops').main


def test_get_flops_tool_prints_the_openmmlab_summary_and_exits_2_on_bad_input(capsys):
    """The tool's main() in this process (importing the mm stack again in a subprocess costs more than the run)."""
    main = _get_flops_main()
    cfg = os.path.join(ROOT, 'configs', 'cls_swin_t_poly3.py')
    assert main([cfg, '--shape', '64', '--cfg-options', 'model.backbone.depths=[1,1,1,1]']) == 0
    out = capsys.readouterr().out
    assert 'Input shape: (64, 64)' in out and 'GFLOPs (attention: ' in out and 'Params: ' in out
    assert main(['configs/nope.py']) == 2
    assert capsys.readouterr().err.strip() == 'error: config file not found: configs/nope.py'
    assert main([cfg, '--shape', '8']) == 2
    assert capsys.readouterr().err.strip().startswith('error: --shape must be H W or one size, each >= 32')
    assert main([cfg, '--cfg-options', 'model.backbone.attn_cfg.type=nope']) == 2
    assert "unknown attention type 'nope'" in capsys.readouterr().err


def test_get_flops_csv_has_one_row_per_config_with_the_printed_figures(capsys, tmp_path):
    """--csv: the rows the docs' parameter / FLOP tables are made from hold exactly what the summary printed."""
    import csv
    import re

    main = _get_flops_main()
    cfgs = [os.path.join(ROOT, 'configs', f'cls_swin_t_{k}.py') for k in ('poly3', 'linear')]
    path = tmp_path / 'flops.csv'
    assert main([*cfgs, '--shape', '224', '--cfg-options', 'model.backbone.depths=[1,1,1,1]',
                 '--csv', str(path)]) == 0
    out = capsys.readouterr().out
    printed = re.findall(r'Flops: ([\d.]+) GFLOPs \(attention: ([\d.]+), rest: ([\d.]+).*\nParams: ([\d.]+) M', out)
    rows = list(csv.DictReader(open(path)))
    assert [r['config'] for r in rows] == ['cls_swin_t_poly3', 'cls_swin_t_linear']
    assert [(r['GFLOPs'], r['attention_GFLOPs'], r['rest_GFLOPs'], r['params_M']) for r in rows] == printed
    assert all(r['shape'] == '224x224' and r['counter'] for r in rows)
    # each kernel's own cost is counted (224: no padded windows, so linear takes its factorised path)
    assert rows[0]['attention_GFLOPs'] != rows[1]['attention_GFLOPs']


def test_model_count_of_a_call_with_a_bias_and_no_mask_is_the_explicit_cost():
    """poly p = 2, d = 2, N = 64: without bias or mask the factorised path is cheaper (3 features), but a bias (as
    Swin's relative position bias) takes the explicit path, S = q k^T and A @ v, whatever the mask. The count of
    analysis/flops.py for each way of calling, against the formulas and against torch's count of the call."""
    from softfree_mm.analysis.flops import attention_flops

    n, d, dv, heads = 64, 2, 4, 3
    features = 3  # x^2, xy, y^2
    explicit, factorised = n * n * (d + dv), (n + n) * features * dv

    class Block(torch.nn.Module):
        def __init__(self, call):
            super().__init__()
            self.kernel = build_attention(dict(type='poly', degree=2), num_heads=heads, head_dim=d)
            self.call = call

        def forward(self, x):
            q, k, v = x[..., :d], x[..., d:2 * d], x[..., 2 * d:]
            return self.call(self.kernel, q, k, v)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, heads, n, 2 * d + dv, generator=g)
    bias = torch.randn(heads, n, n, generator=g)
    mask = torch.rand(n, n, generator=g) > 0.3
    calls = {
        'plain': (lambda kern, q, k, v: kern(q, k, v), factorised),
        'bias=': (lambda kern, q, k, v: kern(q, k, v, bias=bias), explicit),
        'bias positional': (lambda kern, q, k, v: kern(q, k, v, None, None, bias), explicit),
        'mask=': (lambda kern, q, k, v: kern(q, k, v, mask=mask), explicit),
        'bias and mask': (lambda kern, q, k, v: kern(q, k, v, bias=bias, mask=mask), explicit),
    }
    for what, (call, per_pair) in calls.items():
        block = Block(call)
        assert attention_flops(block, (x,)) == {'kernel': 2 * heads * per_pair}, what
        assert _counted(lambda: block(x)) == 2 * heads * per_pair, what  # torch's count of the path taken
