"""CUDA-only checks (skipped without CUDA; tools/gpu_check.sh runs this file on a GPU machine).

Guards: the device check picks CUDA; the detector's mmcv ops run on CUDA through torchvision where mmcv has no CUDA
ops (the stand-in for mmcv._ext, or the route of a compiled mmcv), with the detections of the CPU ops; an --amp float16 run whose kernel overflows float16 stops with one
line naming the iteration and float16 (the overflow is inf, so it is seen), while bfloat16 (where the GPU has it)
trains; the SOFT detection set-ups' backbones fit a GPU at 1333x800, 2 images, with activation checkpointing; the
pointwise kernels' CUDA dispatch takes the fused kernel beyond the explicit budget, with the explicit path's numbers
and memory linear in N; the kernel benchmark times with CUDA events and reports the device's ceilings.
"""
import os.path as osp

import pytest
import torch

from tests.helpers import ROOT, load_tool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


def test_device_check_picks_cuda_also_under_a_launcher():
    from softfree_mm.engine import device
    assert device.diagnose() is None
    assert device.check('auto', 'pytorch') == 'cuda'


def _torchvision_calls():
    """Calls of nms / roi_align served on torchvision's kernels: by the stand-in for mmcv._ext (mmcv-lite), or by
    the compat route of a compiled mmcv without CUDA ops."""
    import sys
    from softfree_mm import compat
    if compat.mmcv_ext_is_standin():
        return dict(sys.modules['mmcv._ext'].calls)
    return {op: n for (how, op), n in compat.TORCHVISION_OPS.calls.items() if how == 'torchvision'}


def test_detector_on_cuda_gives_the_detections_of_the_cpu_ops(monkeypatch):
    from softfree_mm import compat
    from tests.test_compat_ops import _cfg, _build, _det_batch
    monkeypatch.delenv(compat.ROUTE_ENV, raising=False)
    cfg = _cfg('maskrcnn')
    cfg.model.backbone.norm_cfg = dict(type='BN')
    cfg.model.test_cfg.rpn.max_per_img = 300
    model = _build(cfg).eval()
    with torch.no_grad():
        ref = model(**model.data_preprocessor(_det_batch(False), False), mode='predict')  # CPU
        model.cuda()
        before = _torchvision_calls()
        out = model(**model.data_preprocessor(_det_batch(False), False), mode='predict')
    calls = _torchvision_calls()
    if not compat.mmcv_has_cuda_ops():
        assert calls['nms'] > before.get('nms', 0)
        assert calls['roi_align_forward'] > before.get('roi_align_forward', 0)
    for r, o in zip(ref, out):
        r, o = r.pred_instances, o.pred_instances.cpu()
        assert len(r) > 10 and abs(len(o) - len(r)) <= 2  # float sums in another order may flip a borderline box
        k = min(len(r), len(o), 20)
        assert torch.equal(o.labels[:k], r.labels[:k])
        torch.testing.assert_close(o.scores[:k], r.scores[:k], rtol=0, atol=1e-3)
        torch.testing.assert_close(o.bboxes[:k], r.bboxes[:k], rtol=0, atol=0.1)
        assert (o.masks[:k] == r.masks[:k]).float().mean() > 0.99
    # training on CUDA: mask targets and RoIAlign's backward through the same route
    model.train()
    data = model.data_preprocessor(_det_batch(True), True)
    losses = model(**data, mode='loss')
    total = sum(v if torch.is_tensor(v) else sum(v) for k, v in losses.items() if 'loss' in k)
    total.backward()
    assert torch.isfinite(total) and float(losses['loss_mask']) > 0
    grads = [p.grad for n, p in model.named_parameters() if n.startswith('roi_head.mask_head') and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def _tiny_cls(tmp_path):
    cfg = tmp_path / 'cls_tiny.py'
    root = str(tmp_path / 'data' / 'demo' / 'imagenet')
    cfg.write_text(f"""_base_ = {osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py')!r}
data_root = {root!r}
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=8, dataset=dict(data_root=data_root, indices=16))
val_dataloader = dict(batch_size=8, dataset=dict(data_root=data_root, indices=8))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2, val_interval=100)
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=2))
""")
    return str(cfg)


def test_roi_align_under_amp_runs_in_float16_without_a_float32_copy_of_the_level():
    """The stand-in's RoIAlign on CUDA in the features' float16 (under autocast, as a detector with --amp runs it):
    forward and gradient within float16's tolerance of the float32 result, and no float32 copy of the feature level
    (the forward's peak well under the level's float32 size; the backward's under mmcv's float16 gradient buffer
    plus torchvision's float16 gradient, which together are that size, where a float32 copy would add as much
    again)."""
    from softfree_mm import compat
    if not compat.mmcv_ext_is_standin():
        pytest.skip('mmcv._ext is a compiled build here')
    from mmcv.ops import roi_align
    g = torch.Generator(device='cuda').manual_seed(0)
    x32 = torch.randn(2, 256, 200, 304, device='cuda', generator=g)  # a P2 level of an 800x1216 batch of two
    boxes = torch.rand(512, 4, device='cuda', generator=g) * torch.tensor([1216., 800., 1216., 800.], device='cuda')
    rois = torch.cat([torch.randint(0, 2, (512, 1), device='cuda', generator=g).float(),
                      torch.minimum(boxes[:, :2], boxes[:, 2:]), torch.maximum(boxes[:, :2], boxes[:, 2:])], 1)
    x16 = x32.half().requires_grad_()
    peaks = []

    def measured(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        return result

    with torch.autocast('cuda', dtype=torch.float16):
        out = measured(lambda: roi_align(x16, rois.half(), (7, 7), 0.25, 0, 'avg', True))
    loss = out.float().square().sum()
    measured(loss.backward)
    x = x32.clone().requires_grad_()
    ref = roi_align(x, rois, (7, 7), 0.25, 0, 'avg', True)
    ref.square().sum().backward()
    assert out.dtype == torch.float16 and x16.grad.dtype == torch.float16
    level32 = x32.numel() * 4
    mib = [f'{p / 2**20:.1f}' for p in peaks]
    assert peaks[0] < 0.5 * level32 and peaks[1] < 1.25 * level32, \
        f'peaks (forward, backward) {mib} MiB against the level\'s float32 {level32 / 2**20:.1f} MiB'
    for a, r, what in ((out, ref, 'forward'), (x16.grad, x.grad, 'gradient')):
        err = (a.float() - r).abs().max() / r.abs().max().clamp(min=1)
        assert err < 1e-2, f'{what}: max |diff| / scale {float(err):.3g}'


def test_amp_float16_overflow_stops_with_one_line_and_bfloat16_trains(tmp_path, capsys):
    """poly with a constant of 1e8: its outputs (up to about 1e8) overflow float16 (65504) but not bfloat16 or
    float32. Under --amp float16 the overflow is inf, the loss is not finite: exit 2 naming the iteration and
    float16, no checkpoint written."""
    train = load_tool('train')
    cfg = _tiny_cls(tmp_path)
    blowup = 'model.backbone.attn_cfg.scale=100000000.0'
    rc = train.main([cfg, '--work-dir', str(tmp_path / 'fp16'), '--amp', '--amp-dtype', 'float16',
                     '--cfg-options', blowup])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error: ')]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith('error: iteration 1: the loss is') and 'float16' in err[0] and 'bfloat16' in err[0]
    assert not (tmp_path / 'fp16' / 'iter_2.pth').exists()
    if torch.cuda.is_bf16_supported():
        assert train.main([cfg, '--work-dir', str(tmp_path / 'bf16'), '--amp', '--cfg-options', blowup]) == 0
        ckpt = torch.load(tmp_path / 'bf16' / 'iter_2.pth', map_location='cpu')
        assert ckpt['meta']['iter'] == 2


@pytest.mark.parametrize('config', ['maskrcnn_swin_t_soft.py', 'maskrcnn_pvt_v2_b2_soft.py',
                                    'maskrcnn_cswin_t_soft.py', 'maskrcnn_soft_s_softnorm.py'])
def test_soft_detection_backbone_fits_a_gpu_at_1333x800_with_two_images(config):
    """Forward + backward of the SOFT set-up's backbone on 2 images of 800x1344 (the padded 1333x800) with the
    config's activation checkpointing: peak memory under 20 GiB (the README's estimate: about 8 GiB for the largest
    block recomputed in backward, plus the stored block inputs)."""
    import importlib
    from softfree_mm.engine import config_checks
    cfg = config_checks.load_config(osp.join(ROOT, 'configs', config))
    assert cfg.model.backbone.with_cp is True
    importlib.import_module('mmdet.utils').register_all_modules(init_default_scope=True)
    from mmdet.registry import MODELS
    bb = cfg.model.backbone.copy()
    bb.pop('init_cfg', None)
    if 'norm_cfg' in bb:
        bb.norm_cfg = dict(type='BN')
    model = MODELS.build(bb).cuda().train()
    torch.cuda.reset_peak_memory_stats()
    x = torch.randn(2, 3, 800, 1344, device='cuda', requires_grad=True)
    outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    peak = torch.cuda.max_memory_allocated() / 2 ** 30
    print(f'{config}: peak {peak:.1f} GiB')
    assert peak < 20, f'{config}: {peak:.1f} GiB'


def test_rng_states_round_trip_through_a_checkpoint_loaded_onto_the_gpu(tmp_path):
    """What RNGStateHook saves (this process's CUDA generator included) loads back with mmengine's resume, which maps
    the checkpoint onto the GPU, and restores the same random streams."""
    from softfree_mm.engine.hooks import rng_state
    torch.cuda.init()
    torch.manual_seed(3)
    torch.rand(1, device='cuda')
    saved = rng_state._rng_to_checkpoint(rng_state.capture_rng())
    assert 'cuda' in saved
    expected = (torch.rand(4), torch.rand(4, device='cuda').cpu())
    torch.save({'rng': saved}, tmp_path / 'rng.pth')
    loaded = torch.load(tmp_path / 'rng.pth', map_location='cuda')['rng']  # weights_only: plain types only
    torch.manual_seed(99)
    rng_state.restore_rng(rng_state._rng_from_checkpoint(loaded))
    assert torch.equal(torch.rand(4), expected[0]) and torch.equal(torch.rand(4, device='cuda').cpu(), expected[1])


def _attention_cases():
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)

    def unit(*s):  # XCiT's q and k are L2-normalised over the tokens
        return torch.nn.functional.normalize(r(*s), dim=-1)

    # PVT's reduced keys (fp32 training: the explicit products), XCiT's channel attention (tiny matrix, head_dim
    # beyond the fused kernels': explicit), Swin's windows with bias and mask (SDPA)
    mask = (torch.rand(6, 1, 49, 49, generator=g) > 0.3) | torch.eye(49, dtype=torch.bool)
    return [dict(q=r(1, 2, 4000, 64), k=r(1, 2, 250, 64), v=r(1, 2, 250, 64)),
            dict(q=unit(1, 8, 48, 3800), k=unit(1, 8, 48, 3800), v=r(1, 8, 48, 3800), scale=r(8, 1, 1).abs() + 0.5),
            dict(q=r(6, 3, 49, 32), k=r(6, 3, 49, 32), v=r(6, 3, 49, 32), bias=r(1, 3, 49, 49), mask=mask)]


@pytest.mark.parametrize('case', [0, 1, 2])
@pytest.mark.parametrize('recompute', [False, True])
def test_softmax_paths_on_cuda_match_float64_in_outputs_and_gradients(case, recompute):
    """Each CUDA route of the softmax kernel, fp32 training, against the float64 formula on the CPU."""
    from softfree_mm.attention import build_attention

    inp = _attention_cases()[case]
    ref_in = {k: v.requires_grad_(v.is_floating_point()) for k, v in inp.items()}
    s = ref_in['q'] @ ref_in['k'].transpose(-2, -1)
    s = s * (ref_in['scale'] if 'scale' in ref_in else ref_in['q'].shape[-1] ** -0.5)
    if 'bias' in ref_in:
        s = s + ref_in['bias']
    if 'mask' in ref_in:
        s = s.masked_fill(~ref_in['mask'], float('-inf'))
    ref = torch.softmax(s, -1) @ ref_in['v']
    cu = {k: v.detach().cuda().to(torch.float32 if v.is_floating_point() else v.dtype).requires_grad_(
        v.is_floating_point()) for k, v in inp.items()}
    out = build_attention(dict(type='softmax', recompute=recompute))(**cu)
    g = torch.randn(ref.shape, dtype=torch.float64)
    leaves = [k for k in cu if cu[k].requires_grad]
    got = torch.autograd.grad((out * g.cuda().float()).sum(), [cu[k] for k in leaves])
    want = torch.autograd.grad((ref * g).sum(), [ref_in[k] for k in leaves])
    torch.testing.assert_close(out.double().cpu(), ref.detach(), rtol=1e-4, atol=2e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double().cpu(), b, rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize('name', ['poly', 'relu', 'sigmoid'])
def test_cuda_auto_dispatch_takes_the_fused_kernel_beyond_the_budget_with_the_explicit_numbers(name):
    """bf16, 4 heads, N = 4096, d = 64: beyond a 64 MiB budget the call runs fused (its launches counted), within the
    default budget explicitly; the two agree to bf16 rounding in the output and the gradients."""
    from softfree_mm.attention import build_attention, dispatch
    from softfree_mm.attention import fused_pointwise as fp
    g = torch.Generator(device='cuda').manual_seed(0)
    q, k, v = (torch.randn(1, 4, 4096, 64, device='cuda', generator=g, dtype=torch.bfloat16) for _ in range(3))
    fused = build_attention(dict(type=name, explicit_mib=64))
    explicit = build_attention(dict(type=name, impl='explicit'))
    assert fused.path(q, k, v) == 'fused' and dispatch.rule('cuda', 4, 4096, 4096, 64 * 2 ** 20) == 'fused'
    dout = torch.randn(1, 4, 4096, 64, device='cuda', generator=g, dtype=torch.bfloat16)
    results = []
    for kern in (fused, explicit):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        before = fp.LAUNCHES['forward']
        out = kern(*leaves)
        launched = fp.LAUNCHES['forward'] - before
        results.append((out, torch.autograd.grad(out, leaves, dout), launched))
    assert results[0][2] == 1 and results[1][2] == 0
    for a, b in zip([results[0][0], *results[0][1]], [results[1][0], *results[1][1]]):
        err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
        assert err < 3e-2, err


def test_fused_kernel_memory_grows_linearly_in_the_tokens():
    """Forward + backward of poly3 at N = 16384 in bf16 (1 head): the peak beyond the inputs is a few (N, d) tensors,
    far below the 1 GiB one fp32 score matrix would take."""
    from softfree_mm.analysis.benchmark.timing import peak_memory
    from softfree_mm.attention import build_attention
    kern = build_attention(dict(type='poly', degree=3, impl='fused'))
    leaves = [torch.randn(1, 1, 16384, 64, device='cuda', dtype=torch.bfloat16).requires_grad_(True) for _ in range(3)]

    def step():
        kern(*leaves).float().sum().backward()

    step()  # the first-use check and the compile
    peak = peak_memory(step, 'cuda')
    unit = 16384 * 64 * 2
    assert peak < 16 * unit, f'{peak / 2 ** 20:.1f} MiB'


def test_kernel_benchmark_on_cuda_times_with_events_and_reports_the_ceilings():
    from softfree_mm.analysis.benchmark.kernels import device_ceilings, run_kernels
    ceilings = device_ceilings('cuda', torch.bfloat16, n=2048, copy_mib=64, repeats=3)
    assert ceilings['timer'] == 'cuda-events' and ceilings['matrix_TFLOP_per_s'] > 1
    rows = run_kernels(['softmax', 'poly'], [1024], heads=2, dtype=torch.bfloat16, device='cuda', repeats=2,
                       ceilings=ceilings)
    for r in rows:
        assert r['timer'] == 'cuda-events' and 0 < r['of_matrix_rate'] < 2 and r['peak_MiB'] >= 0
