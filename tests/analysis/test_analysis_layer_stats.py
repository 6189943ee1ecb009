"""tools/analysis/layer_stats.py: one model at two input sizes, per attention layer.

Guards: the token count of each stage follows the input size (PVTv2-b0 without reduction: (side / stride)^2); softmax
stays within its bounds (||A||_F <= sqrt(N), Jacobian <= 2 sqrt(N)) at every size; the output RMS and the score RMS
equal an independent computation from the captured q, k, v by the formula (x^3 / sqrt(N) and softmax); bad sizes are
one line and exit 2.
"""
import csv
import math
import os.path as osp
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT

CONFIG = osp.join(ROOT, 'configs', 'demo', 'study_pvt_v2_b0_digits.py')
TOOL = osp.join(ROOT, 'tools', 'analysis', 'layer_stats.py')


def _run(tmp_path, kernel):
    out = str(tmp_path / kernel)
    proc = subprocess.run([sys.executable, TOOL, CONFIG, 'none', '--sizes', '32', '64', '--num-images', '1',
                           '--out', out, '--cfg-options', f'model.backbone.attn_cfg.type={kernel}'],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return list(csv.DictReader(open(out + '_summary.csv')))


def test_token_counts_follow_the_size_and_softmax_keeps_its_bounds(tmp_path):
    rows = _run(tmp_path, 'softmax')
    strides = {'0': 4, '1': 8, '2': 16, '3': 32}
    for r in rows:
        stage = r['layer'].split('stages.')[1].split('.')[0]
        assert float(r['rows']) == (int(r['size']) // strides[stage]) ** 2 == float(r['keys'])
        assert float(r['fro_sqrt_n']) <= 1 + 1e-6 and float(r['jac_sqrt_n']) <= 2 + 1e-6
    assert {r['size'] for r in rows} == {'32', '64'} and len(rows) == 16


def test_the_measures_equal_the_formula_on_the_captured_inputs():
    """One captured call of x^3 / sqrt(N): the score RMS is that of scale q k^T, the output RMS that of
    (s^3 / sqrt(N)) @ v, the gain their ratio to v's RMS; computed here from q, k, v without the kernel."""
    from mmengine.dataset import pseudo_collate
    from softfree_mm.analysis import probe
    from softfree_mm.analysis.layer_stats import call_layer_stats, resized
    from softfree_mm.engine.hooks import AttentionCapture
    cfg = probe.load_checked(CONFIG, {'model.backbone.attn_cfg.type': 'poly'})
    torch.manual_seed(0)
    model = probe.build_model(cfg, 'none', CONFIG)
    ds = probe.build_dataset(cfg, 'val', CONFIG)
    _, sample = next(probe.dataset_samples(ds, 1))
    data = resized(model.data_preprocessor(pseudo_collate([sample]), False), 64)
    assert data['inputs'].shape[-2:] == (64, 64)
    with AttentionCapture(model.backbone, prefix='backbone.') as cap:
        with torch.no_grad():
            model.backbone(data['inputs'])
    call = cap.calls['backbone.stages.1.blocks.0.attn']
    got = call_layer_stats(call)
    q, k, v = call.q.double(), call.k.double(), call.v.double()
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    out = (s ** 3 / math.sqrt(k.shape[2])) @ v
    rms = lambda x: float(x.pow(2).mean().sqrt())  # noqa: E731
    assert got['score_rms'] == pytest.approx(rms(s), rel=1e-5)
    assert got['out_rms'] == pytest.approx(rms(out), rel=1e-4)
    assert got['gain'] == pytest.approx(rms(out) / rms(v), rel=1e-4)
    assert got['rows'] == 64  # stage 1 of a 64 px input: stride 8
    assert got['fro_sqrt_n'] == pytest.approx(float((s ** 3 / 8).pow(2).sum(-1).sum(-1).sqrt().mean()) / 8, rel=1e-4)


def test_the_residual_streams_scale_equals_the_blocks_computed_by_hand():
    """The stream's and the branch's RMS of a layer (layer_stats' StreamScale hooks) equal those computed here by
    running the stage's patch embedding and blocks by hand: the stream entering stages.0.blocks.1 and the attention
    branch that block adds to it; the ratio is theirs; a layer outside any block list has none."""
    from mmengine.dataset import pseudo_collate
    from softfree_mm.analysis import probe
    from softfree_mm.analysis.layer_stats import block_and_branch, layer_stats, resized
    cfg = probe.load_checked(CONFIG, {'model.backbone.attn_cfg.type': 'poly'})
    torch.manual_seed(0)
    model = probe.build_model(cfg, 'none', CONFIG).eval()
    ds = probe.build_dataset(cfg, 'val', CONFIG)
    name, sample = next(probe.dataset_samples(ds, 1))
    rows = {r['layer']: r for r in layer_stats(model, [(name, sample)], [64], jacobian=False)}
    got = rows['backbone.stages.0.blocks.1.attn']
    stage = model.backbone.stages[0]
    with torch.no_grad():
        x = resized(model.data_preprocessor(pseudo_collate([sample]), False), 64)['inputs']
        x, hw = stage.patch_embed(x)
        if stage.pos_embed is not None:
            x = x + stage.positions(hw)
        x = stage.blocks[0](x, hw)
        branch = stage.blocks[1].attn(stage.blocks[1].norm1(x), hw)
    rms = lambda t: float(t.double().pow(2).mean().sqrt())  # noqa: E731
    assert got['stream_rms'] == pytest.approx(rms(x), rel=1e-5)
    assert got['branch_rms'] == pytest.approx(rms(branch), rel=1e-5)
    assert got['branch_ratio'] == pytest.approx(rms(branch) / rms(x), rel=1e-5)
    assert all(r['stream_rms'] > 0 and r['branch_ratio'] > 0 for r in rows.values()) and len(rows) == 8
    assert block_and_branch('stages.0.blocks.1.attn.w_msa') == ('stages.0.blocks.1', 'stages.0.blocks.1.attn')
    assert block_and_branch('blocks.3.attn') == ('blocks.3', 'blocks.3.attn') and block_and_branch('attn') is None


def test_bad_sizes_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, TOOL, CONFIG, 'none', '--sizes', '48'], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and '--sizes 48: distinct sides, multiples of 32' in proc.stderr.strip().splitlines()[-1]
