"""tools/benchmark.py and analysis/benchmark/: what they measure is measured right (memory, slopes, crossovers,
same weights in compare), the modes run end to end at toy sizes, and bad input is one line with exit status 2.
No timing assertions (the machine is shared)."""
import csv
import math

import pytest
import torch

from softfree_mm.analysis.benchmark import backbones, comparison, detector, kernels, references, timing

from tests.helpers import load_tool


def test_peak_memory_on_cpu_is_the_largest_live_allocation_sum():
    def fn():
        a = torch.empty(1 << 20, dtype=torch.float32)  # 4 MiB
        b = torch.empty(1 << 19, dtype=torch.float32)  # 2 MiB, both alive: 6 MiB
        del a, b
        c = torch.empty(1 << 18, dtype=torch.float32)  # 1 MiB after the others are freed
        return c.sum()

    peak = timing.peak_memory(fn, 'cpu')
    assert 6 * 2 ** 20 <= peak < 6 * 2 ** 20 + 64 * 1024


def test_fit_slope_and_crossover():
    ns = [1000, 2000, 4000, 8000]
    assert kernels.fit_slope(ns, [3 * n ** 1.5 for n in ns]) == pytest.approx(1.5)
    soft = [n ** 2 / 1000 for n in ns]  # 1000, 4000, 16000, 64000
    lin = [2000.0 * n / 1000 for n in ns]  # 2000, 4000, 8000, 16000: equal at 2000, below from there
    assert kernels.crossover(ns, lin, soft) == pytest.approx(2000)
    assert kernels.crossover(ns, [x / 10 for x in soft], soft) == 1000  # below everywhere
    assert kernels.crossover(ns, [x * 2 for x in soft], soft) is None  # never below
    # between grid points: ratio 2 at 1000 and 1/2 at 2000 -> log-log midpoint
    assert kernels.crossover([1000, 2000], [2.0, 0.5], [1.0, 1.0]) == pytest.approx(math.sqrt(2) * 1000)


def test_kernels_mode_rows_ratios_flops_and_memory(tmp_path, capsys):
    tool = load_tool('benchmark')
    out_csv = tmp_path / 'k.csv'
    out_png = tmp_path / 'k.png'
    assert tool.main(['kernels', '--tokens', '64', '256', '--kernels', 'softmax', 'matmul', 'poly', 'poly:degree=1',
                      '--head-dim', '8', '--heads', '2', '--backward', '--repeats', '1', '--device', 'cpu',
                      '--csv', str(out_csv), '--plot', str(out_png)]) == 0
    text = capsys.readouterr().out
    assert '| kernel | N | pass | ms |' in text and 'faster_than_softmax_from_N' in text
    rows = list(csv.DictReader(open(out_csv)))
    assert {(r['kernel'], r['N'], r['pass']) for r in rows} == {
        (k, n, p) for k in ('softmax', 'matmul', 'poly', 'poly:degree=1') for n in ('64', '256')
        for p in ('fwd', 'fwdbwd')}
    for r in rows:
        if r['kernel'] == 'softmax':
            assert float(r['time_ratio']) == 1.0 and float(r['memory_ratio']) == 1.0
        # declared multiply-adds: explicit products for softmax, matmul and cubic poly at head_dim 8
        n = int(r['N'])
        macs = 2 * n * n * 16 if r['kernel'] != 'poly:degree=1' else 2 * 2 * n * 8 * 8
        assert float(r['GFLOPs']) == pytest.approx(2 * macs / 1e9 * (1 if r['pass'] == 'fwd' else 3))
    # the plain products hold the N x N scores: at least one (2 heads x 256 x 256 floats) in forward
    mm = [r for r in rows if r['kernel'] == 'matmul' and r['N'] == '256' and r['pass'] == 'fwd'][0]
    assert float(mm['peak_MiB']) >= 2 * 256 * 256 * 4 / 2 ** 20
    assert out_png.stat().st_size > 10000


def test_backbone_point_measures_latency_memory_params_and_flops():
    """One point as ``backbone`` mode's subprocess measures it (here in-process: importing the mm stack again
    would cost more than the point)."""
    row = backbones.backbone_point('swin_t', 'softmax', (64, 64), repeats=1, device='cpu')
    assert row['params_M'] == pytest.approx(27.5, abs=0.5)  # Swin-T
    assert row['GFLOPs'] > 0 and row['fwd_peak_MiB'] > 0 and row['fwdbwd_peak_MiB'] > row['fwd_peak_MiB']
    assert row['images_per_s'] == pytest.approx(1e3 / row['fwd_ms'])


@pytest.mark.parametrize('name', ['swin_t', 'pvt_v2_b2', 'xcit_s12'])
def test_compare_pairs_compute_the_same_function_as_their_references(name):
    """So that the timing compares implementations, not models."""
    ours, ref = references.reference_pair(name)
    ours.eval()
    ref.eval()
    x = torch.randn(1, 3, *references.PARITY_SIZE)
    with torch.no_grad():
        a, b = ours(x), ref(x)
    assert len(a) == len(b) == 4
    for o, r in zip(a, b):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
    # the reference runs torch's own layers (XCiT's adapter: plain ConvTranspose2d, not our matrix-product form)
    deconvs = [m for m in ref.modules() if isinstance(m, torch.nn.ConvTranspose2d)]
    assert all(type(m) is torch.nn.ConvTranspose2d for m in deconvs)
    assert (len(deconvs) == 3) == (name == 'xcit_s12')


def test_compare_ratio_is_the_median_of_per_repeat_ratios_with_their_range(monkeypatch):
    """Scripted times (the timer is the only thing replaced): a slow phase that hits both sides of one repeat
    must not move the ratio, which it would if each side's median were divided."""
    # per pass (fwd, fwdbwd): repeat r times the two back to back, ours first on even repeats
    script = {0: (1.0, 1.1), 1: (3.0, 3.3), 2: (1.0, 1.2), 3: (3.0, 3.0), 4: (1.0, 1.1)}  # r: (ours, ref)
    monkeypatch.setattr(comparison, 'peak_memory', lambda fn, device: 1)
    seq = []
    for r in range(5):
        o, f = script[r]
        seq += [o, f] if r % 2 == 0 else [f, o]
    it = iter(seq * 2)
    monkeypatch.setattr(comparison, 'timed', lambda fn, device, clock='wall': next(it))
    row, = comparison.compare(['swin_t'], size=(64, 96), repeats=5)
    assert row['fwd_ms_ours'] == pytest.approx(1000.0) and row['fwd_ms_ref'] == pytest.approx(1200.0)
    assert row['fwd_speed_ratio'] == pytest.approx(1.1)  # median of 1.1, 1.1, 1.2, 1.0, 1.1; 1200/1000 would be 1.2
    assert row['fwd_ratio_range'] == '1.00..1.20'
    assert row['max_abs_diff'] < 1e-4


def test_kernel_time_ratio_is_the_median_of_per_repeat_ratios_with_their_range(monkeypatch):
    """kernels mode, scripted times (the timer is the only thing replaced): the ratio to softmax is the median over
    the repeats of the two kernels' times in the same repeat, so a slow phase spanning one repeat does not move it;
    dividing each kernel's median would."""
    # repeat r: (softmax, relu) for fwd, each kernel timed once per pass; the order alternates every repeat
    script = [(1.0, 1.1), (3.0, 3.3), (1.0, 1.6), (3.0, 3.0), (1.0, 1.1)]
    monkeypatch.setattr(kernels, 'peak_memory', lambda fn, device: 1)
    seq = []
    for r, (soft, relu) in enumerate(script):
        seq += [soft, relu] if r % 2 == 0 else [relu, soft]
    it = iter(seq)
    monkeypatch.setattr(kernels, 'timed', lambda fn, device, clock='wall': next(it))
    rows = kernels.run_kernels(['softmax', 'relu'], [64], head_dim=8, repeats=5, passes=('fwd', ), memory=False)
    soft, relu = rows
    assert soft['time_ratio'] == 1.0 and soft['time_ratio_range'] == '1.00..1.00'
    assert relu['ms'] == pytest.approx(1600.0) and soft['ms'] == pytest.approx(1000.0)
    assert relu['time_ratio'] == pytest.approx(1.1)  # median of 1.1, 1.1, 1.6, 1.0, 1.1; 1600 / 1000 would be 1.6
    assert relu['time_ratio_range'] == '1.00..1.60'
    assert all(not k.startswith('_') for r in rows for k in r)


@pytest.mark.parametrize('argv,message', [
    (['kernels', '--kernels', 'nope'], "unknown attention type 'nope'"),
    (['kernels', '--kernels', 'poly:degre=2'], "unknown argument(s) ['degre']"),
    (['nope'], "unknown mode 'nope'"),
    (['backbone', '--backbones', 'swim_t'], "unknown backbone 'swim_t'"),
    (['backbone', '--sizes', '12x12'], 'image size must be HxW (each >= 32)'),
    (['kernels', '--dtype', 'fp8'], '--dtype must be fp32, bf16 or fp16'),
    (['compare', '--backbones', 'cswin_t'], "compare: no reference for ['cswin_t']"),
    (['compare', '--tokens', '64'], 'unrecognized arguments: --tokens 64'),  # an option of another mode
    (['kernels', '--repeats', '0'], '--repeats must be >= 1, got 0'),
])
def test_bad_input_is_one_line_and_exit_status_2(argv, message, capsys):
    assert load_tool('benchmark').main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: ') and message in err and '\n' not in err


def test_without_a_mode_the_tool_runs_the_kernels_mode(capsys):
    assert load_tool('benchmark').main(['--tokens', '16', '--kernels', 'softmax', '--head-dim', '8', '--repeats', '1',
                                        '--no-memory', '--device', 'cpu']) == 0
    assert capsys.readouterr().out.startswith('kernels: B=1 heads=1 head_dim=8')


def test_the_help_lists_every_modes_options(capsys):
    with pytest.raises(SystemExit):
        load_tool('benchmark').main(['--help'])
    text = capsys.readouterr().out
    for option in ('--tokens', '--sides', '--ceilings', '--no-flops', '--sizes', '--size', '--detectors', '--clock'):
        assert option in text, option


# ------------------------------------------------------------------------------------------- the CUDA additions
def test_timer_is_cuda_events_on_cuda_and_the_process_clock_only_when_asked():
    assert timing.timer('cuda') == timing.timer('cuda:1') == 'cuda-events'
    assert timing.timer('cpu') == 'perf-counter' and timing.timer('cpu', 'cpu') == 'process-time'


def test_device_ceilings_measure_a_matrix_rate_and_a_copy_bandwidth():
    """On CPU at small sizes (the GPU check runs n = 8192 and 1 GiB): positive rates, the flop and byte counts the
    formulas say (2 n^3 for the product; read + write for the copy)."""
    c = kernels.device_ceilings('cpu', torch.float32, n=128, copy_mib=8, repeats=2)
    assert c['matrix_n'] == 128 and c['copy_MiB'] == 8 and c['timer'] == 'perf-counter'
    assert c['matrix_TFLOP_per_s'] > 0 and c['copy_GB_per_s'] > 0
    assert kernels.io_bytes('fwd', 2, 3, 100, 64, torch.bfloat16) == 4 * 2 * 3 * 100 * 64 * 2
    assert kernels.io_bytes('fwdbwd', 1, 1, 10, 8, torch.float32) == 11 * 10 * 8 * 4


def test_kernel_rows_report_the_fractions_of_the_ceilings():
    ceilings = dict(matrix_TFLOP_per_s=2.0, copy_GB_per_s=10.0)
    rows = kernels.run_kernels(['softmax', 'linear'], [64], head_dim=8, repeats=1, memory=False, ceilings=ceilings)
    for r in rows:
        assert r['of_matrix_rate'] == pytest.approx(r['TFLOP_per_s'] / 2.0)
        assert r['of_copy_bandwidth'] == pytest.approx(r['GB_per_s'] / 10.0)
        assert r['GB_per_s'] == pytest.approx(kernels.io_bytes(r['pass'], 1, 1, 64, 8, torch.float32) / r['ms'] * 1e-6)


def test_detector_configs_differ_from_mmdets_only_in_the_backbone():
    """So that the detector mode compares backbones: each backbone's ours / mmdet pair has the same neck, heads and
    preprocessor; mmdet's side is mmdet's own class; no pretrained weights are fetched; no SyncBN (one process)."""
    assert set(detector.DETECTORS) == {f'{b}:{k}' for b in ('swin_t', 'pvt_v2_b2')
                                 for k in ('softmax', 'poly3', 'inline', 'mmdet')}
    for backbone, ref_type in (('swin_t', 'mmdet.SwinTransformer'), ('pvt_v2_b2', 'mmdet.PyramidVisionTransformerV2')):
        ref = detector.detector_config(f'{backbone}:mmdet').model
        for kernel in ('softmax', 'poly3', 'inline'):
            ours = detector.detector_config(f'{backbone}:{kernel}').model
            assert ours.backbone.type.startswith('SoftFree') and 'init_cfg' not in ours.backbone
            for part in ('neck', 'rpn_head', 'roi_head', 'data_preprocessor', 'train_cfg', 'test_cfg'):
                assert ours[part] == ref[part], (backbone, kernel, part)
        assert ref.backbone.type == ref_type and ref.backbone.init_cfg is None
        assert 'SyncBN' not in str(ref)
    with pytest.raises(ValueError, match="unknown detector 'swin_t:poly2'; valid: backbone:kernel of .*swin_t:softmax"):
        detector.detector_config('swin_t:poly2')


def test_detector_point_runs_a_training_step_and_reports_speed_and_memory():
    """One step (loss, backward, AdamW) of the PVTv2-b2 poly3 Mask R-CNN on one 64 x 96 image, in-process (the mode
    runs each detector in a subprocess of its own): the row has what the table reads."""
    row = detector.detector_point('pvt_v2_b2:poly3', size=(64, 96), batch=1, repeats=1, warmup=0)
    assert row['detector'] == 'pvt_v2_b2:poly3' and row['impl'] == 'ours' and row['size'] == '64x96'
    assert row['images_per_s'] == pytest.approx(1e3 / row['step_ms'])
    assert row['peak_MiB'] > 0 and 40 < row['params_M'] < 50 and math.isfinite(row['loss'])


def test_detector_ratios_are_to_mmdets_backbone_and_to_our_softmax():
    rows = [dict(detector='swin_t:mmdet', kernel='mmdet', images_per_s=10.0, peak_MiB=100.0),
            dict(detector='swin_t:softmax', kernel='softmax', images_per_s=12.0, peak_MiB=90.0),
            dict(detector='swin_t:poly3', kernel='poly3', images_per_s=9.0, peak_MiB=80.0),
            dict(detector='pvt_v2_b2:softmax', error='CUDA out of memory')]
    out = {r['detector']: r for r in detector.detector_ratios(rows)}
    assert out['swin_t:softmax']['speed_vs_mmdet'] == pytest.approx(1.2)
    assert out['swin_t:softmax']['memory_vs_mmdet'] == pytest.approx(0.9)
    assert out['swin_t:poly3']['speed_vs_softmax'] == pytest.approx(0.75)
    assert 'speed_vs_mmdet' not in out['swin_t:mmdet'] and 'speed_vs_softmax' not in out['swin_t:softmax']
    assert 'speed_vs_mmdet' not in out['pvt_v2_b2:softmax']


@pytest.mark.parametrize('argv,message', [
    (['detector', '--detectors', 'swin_t:flash'], "detector: unknown detector 'swin_t:flash'; valid: backbone:kernel of"),
    (['detector', '--size', '800x1200'], 'detector: --size must be a multiple of 32 each way'),
    (['detector', '--batch', '0'], '--batch must be >= 1, got 0'),
])
def test_detector_mode_bad_input_is_one_line_and_exit_status_2(argv, message, capsys):
    assert load_tool('benchmark').main(argv + ['--device', 'cpu']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: ') and message in err and '\n' not in err


def test_a_kernel_out_of_device_memory_ends_the_sweep_with_the_rows_measured_so_far(capsys):
    """A kernel that runs out of (GPU) memory at some N: the rows of the smaller N come back, N and beyond are not
    measured, and stderr names the kernel, the pass and N (the GPU check then still writes its CSV)."""
    from softfree_mm.attention import ATTENTION, kernel_class

    class Greedy(kernel_class('relu')):
        def _forward(self, q, k, v, hw, scale, bias, mask):
            if q.shape[2] > 64:
                raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 716.00 MiB.')
            return super()._forward(q, k, v, hw, scale, bias, mask)

    ATTENTION.register('test_greedy')(Greedy)
    try:
        rows = kernels.run_kernels(['softmax', 'test_greedy'], [16, 64, 144, 256], head_dim=8, repeats=1,
                                   memory=False)
    finally:
        del ATTENTION._map['test_greedy']
    assert sorted({r['N'] for r in rows}) == [16, 64]
    assert {r['kernel'] for r in rows} == {'softmax', 'test_greedy'} and len(rows) == 2 * 2 * 2
    assert 'test_greedy (fwd) ran out of cpu memory at N=144; N >= 144 not measured' in capsys.readouterr().err
