"""softfree_mm.analysis.task_layer_stats / tools/analysis/task_layer_stats.py: the task study's classifiers and
segmentors measured per attention layer at several sizes.

Guards: a segmentation row's two models are the work dir's classifier it started from and its segmentor (real
PVTv2-b0 models with random weights in the runs' layout), measured on their own val images with the token counts
each size gives; a row whose work-dir test gives other numbers is not measured; the largest / median gains by hand;
the tool keeps what its --out holds (nothing measured again) and refuses bad input with one line.
"""
import json
import os
import os.path as osp
import pytest
import torch

from softfree_mm.analysis import task_layer_stats as tl
from softfree_mm.analysis import task_study as ts
from softfree_mm.analysis import task_study_report as tsr
from softfree_mm.analysis.grid_runner import kernel_config
from softfree_mm.attention import Kernel
from softfree_mm.analysis.sweep import safe_name
from softfree_mm.analysis.warm_start import Runner

from tests.helpers import ROOT, load_tool, main_as_command


def _run(root, key, config_text, **fields):
    """A finished run of the runner's layout: child config, random-weight checkpoint, result.json."""
    from softfree_mm.analysis import probe
    folder = osp.join(root, key)
    os.makedirs(folder, exist_ok=True)
    config = osp.join(folder, f'{safe_name(key)}.py')
    with open(config, 'w') as f:
        f.write(config_text)
    ckpt = osp.join(folder, 'weights.pth')
    torch.manual_seed(0)
    cfg = probe.load_checked(config, {'model.backbone.init_cfg.type': 'Scratch'})  # random weights, no file
    torch.save(dict(state_dict=probe.build_model(cfg, 'none', config).state_dict()), ckpt)
    with open(osp.join(folder, 'result.json'), 'w') as f:
        json.dump(dict(status='ok', error='', key=key, checkpoint=ckpt, **fields), f)


def _test(root, key, miou):
    os.makedirs(osp.join(root, key + '/test'), exist_ok=True)
    with open(osp.join(root, key + '/test', 'result.json'), 'w') as f:
        json.dump(dict(status='ok', error='', key=key + '/test', metrics=dict(mIoU=miou, aAcc=90.0, mAcc=9.0)), f)


def _row(seed, miou):
    return dict(layout='pvt', task='seg', kernel='poly:degree=3', start='scratch', recipe='scratch-300', seed=seed,
                cls_top1=70.0, status='ok', error='', mIoU=miou, mAcc=9.0, source='study')


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('task_runs'))
    lay = ts.LAYOUTS['pvt']
    kernel = Kernel('poly:degree=3').cfg
    _run(root, 'scratch/pvt/poly_degree=3/seed0', kernel_config(osp.join(ROOT, lay.classifier), kernel),
         top1_final=70.0)
    _run(root, 'seg/pvt/poly_degree=3/scratch/seed0', kernel_config(osp.join(ROOT, lay.config('seg')), kernel))
    _test(root, 'seg/pvt/poly_degree=3/scratch/seed0', 8.3)
    return root


def test_a_rows_classifier_and_segmentor_measured_at_each_size_on_their_own_images(work):
    study = ts.Study(Runner(work, ROOT, jobs=1, echo=lambda m: None, report_only=True), ROOT, [0], ['pvt'],
                     ['seg'], ['poly:degree=3'], echo=lambda m: None)
    # seed 0's row is the work dir's run (mIoU 8.3); a row saying 50.0 was made by another run: not measured
    entries = tl.models_of(study, [_row(0, 8.3), dict(_row(0, 50.0), seed=0)], tsr.FLOOR_MACC)
    assert [(e['model'], e['floor'], osp.basename(e['config']), e['checkpoint'] == 'none') for e in entries] == [
        ('init', True, 'scratch_pvt_poly_degree=3_seed0.py', True),
        ('classifier', True, 'scratch_pvt_poly_degree=3_seed0.py', False),
        ('segmentor', True, 'seg_pvt_poly_degree=3_scratch_seed0.py', False)]
    init, entries = entries[0], entries[1:]
    rows = [r for e in entries for r in tl.measure(e, [64, 96], 1)]
    # PVTv2's stages at strides 4, 8, 16, 32: (side / stride)^2 tokens, two blocks each, both models
    for model in ('classifier', 'segmentor'):
        for size in (64, 96):
            got = [(r['layer'].split('.')[2], r['rows']) for r in rows if (r['model'], r['size']) == (model, size)]
            assert got == [(str(i), (size // s) ** 2) for i, s in enumerate((4, 8, 16, 32)) for _ in (0, 1)]
    for r in rows:
        assert r['gain'] == pytest.approx(r['out_rms'] / r['v_rms'])
        assert (r['kernel'], r['seed'], r['mIoU'], r['floor']) == ('poly:degree=3', 0, 8.3, True)
    # the initialisation: the classifier's config with init_weights under the row's seed, not the run's checkpoint.
    # The fixture's checkpoint is that very model for seed 0 (init_weights after torch.manual_seed(0)), so seed 0's
    # init measures the same gains; under seed 1 the initialisation differs from the checkpoint
    checkpoint = [r['gain'] for r in rows if (r['model'], r['size']) == ('classifier', 64)]
    first = tl.measure(init, [64], 1)
    assert [r['gain'] for r in first] == pytest.approx(checkpoint, rel=1e-6)
    assert {r['model'] for r in first} == {'init'}
    other = [r['gain'] for r in tl.measure(dict(init, seed=1), [64], 1)]
    assert other != pytest.approx(checkpoint, rel=1e-3)


def test_init_is_measured_for_rows_from_scratch_only(work):
    """A warm start's classifier began from the softmax teacher, not from an initialisation: no 'init' entry."""
    study = ts.Study(Runner(work, ROOT, jobs=1, echo=lambda m: None, report_only=True), ROOT, [0], ['pvt'],
                     ['seg'], ['poly:degree=3'], echo=lambda m: None)
    row = dict(_row(0, 8.3), start='transfer', recipe='transfer-final-75')
    assert all(e['model'] != 'init' for e in tl.models_of(study, [row], tsr.FLOOR_MACC))


def test_largest_and_median_gain_by_hand():
    base = dict(layout='pvt', task='seg', kernel='k', start='scratch', recipe='r', seed=0, model='segmentor',
                mIoU=8.3, floor='True', size=64)
    rows = [dict(base, layer=f'backbone.l{i}', gain=g, out_rms=10 * g, score_rms=g + 1, branch_ratio=r)
            for i, (g, r) in enumerate(((0.5, 0.2), (4.0, 0.1), (1.0, 2.5), (2.0, '')))]
    (e,) = tl.largest_gain(rows)
    assert (e['top_layer'], e['top_gain'], e['median_gain'], e['top_out_rms'], e['top_score_rms'],
            e['max_branch_ratio']) == ('backbone.l1', 4.0, 1.5, 40.0, 5.0, 2.5)
    table = tl.markdown([e]).splitlines()
    assert table[2] == '| pvt | `k` | scratch | 0 | segmentor | 8.3 | yes | l1 | 4 | 5 | 1.5 | 2.5 |'
    # a row measured before the stream's columns: the cell is blank
    (old,) = tl.largest_gain([{k: v for k, v in r.items() if k != 'branch_ratio'} for r in rows])
    assert old['max_branch_ratio'] is None and tl.markdown([old]).splitlines()[2].endswith('| 1.5 |  |')


def test_the_tool_keeps_what_its_out_holds_and_refuses_bad_input(work, tmp_path, capsys):
    runs = tmp_path / 'runs.csv'
    tsr.write_outputs([_row(0, 8.3)], str(tmp_path / 'ts'))
    os.rename(tmp_path / 'ts' / 'runs.csv', runs)
    out = tmp_path / 'layer_stats.csv'
    call = main_as_command(load_tool('analysis/task_layer_stats'), capsys)
    base = ['--work-dir', work, '--runs', str(runs), '--out', str(out), '--docs', '', '--sizes', '64',
            '--num-images', '1']
    status, stdout, err = call(*base, '--models', 'segmentor')
    assert status == 0, err
    assert 'segmentor: 8 rows' in stdout
    status, stdout, err = call(*base)
    assert status == 0, err
    assert 'init: 8 rows' in stdout and 'classifier: 8 rows' in stdout and 'segmentor:' not in stdout  # kept
    assert len(out.read_text().splitlines()) == 1 + 24
    for args, message in ((['--models', 'teacher'], '--models teacher: unknown (known: init, classifier, segmentor)'),
                          (['--sizes', '48'], '--sizes 48: distinct sides, multiples of 32'),
                          (['--kernels', 'nope'], 'nope')):
        status, _, err = call(*base, *args)
        assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    (tmp_path / 'other.csv').write_text('a,b\n1,2\n')
    status, _, err = call(*base, '--runs', str(tmp_path / 'other.csv'))
    assert status == 2 and 'not a runs.csv of the task study' in err, err
