"""softfree_mm.analysis.task_curves: the task study's training-loss curves (curves.csv) and the segmentors' profiles.

Guards: the windowed losses, the lowest point and the rise after it, by hand on a curve that falls and climbs
back; a run's curve is read from its log only where the work dir's test gives the row's numbers (else the kept
curve stays, and a row with neither has none); curves.csv round-trips and a file without its columns is refused.
"""
import json
import os
import os.path as osp

import pytest

from softfree_mm.analysis import task_curves as tc
from softfree_mm.analysis import task_study as ts
from softfree_mm.analysis import task_study_report as tsr
from softfree_mm.analysis.warm_start import Runner

from tests.helpers import ROOT


def _curve(fn, end=3000, step=10):
    return [dict(iter=i, loss=fn(i), acc_seg=90.0 if i <= 2000 else 80.0) for i in range(step, end + 1, step)]


def _falls_and_climbs(i):
    return 1.0 if i <= 1000 else (0.2 if i <= 2000 else 0.5)


def test_windowed_losses_lowest_point_and_rise_by_hand():
    p = tc.profile(_curve(_falls_and_climbs))
    assert p['loss_500'] == p['loss_1000'] == 1.0
    assert p['loss_2000'] == pytest.approx(0.2) and p['loss_3000'] == pytest.approx(0.5)
    # (1000, 1100] is the first window all at 0.2: the lowest, first where tied
    assert p['low'] == pytest.approx(0.2) and p['low_iter'] == 1100
    assert p['rise'] == pytest.approx(0.3) and p['final'] == pytest.approx(0.5)
    assert p['acc_final'] == 80.0
    # a window that straddles the drop averages it: (1050 - 100, 1050] holds 5 records at 1.0 and 5 at 0.2
    assert tc.loss_at(_curve(_falls_and_climbs), 1050) == pytest.approx(0.6)
    # a run that ends at its lowest has no rise; a window with no record is None
    falling = tc.profile(_curve(lambda i: 1.0 / i))
    assert falling['rise'] == 0.0 and falling['low_iter'] == 3000
    assert tc.loss_at(_curve(_falls_and_climbs), 5000) is None


def _finished(root, key, **fields):
    os.makedirs(osp.join(root, key), exist_ok=True)
    with open(osp.join(root, key, 'result.json'), 'w') as f:
        json.dump(dict(status='ok', error='', key=key, **fields), f)


def _log(path, fn):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        for r in _curve(fn, end=200):
            f.write(json.dumps({'loss': r['loss'], 'decode.acc_seg': r['acc_seg'], 'iter': r['iter'],
                                'step': r['iter']}) + '\n')
        f.write(json.dumps({'mIoU': 1.0, 'step': 200}) + '\n')  # a validation record: not a training one


def _row(kernel, seed, miou, macc=70.0):
    return dict(layout='pvt', task='seg', kernel=kernel, start='scratch', recipe='scratch-300', seed=seed,
                cls_top1=70.0, status='ok', error='', mIoU=miou, mAcc=macc, source='study')


def test_curves_come_from_the_log_only_where_the_work_dirs_run_gave_the_row_else_the_kept_ones(tmp_path):
    runs = str(tmp_path / 'runs')
    for seed, miou in ((0, 60.0), (1, 40.0)):
        key = f'seg/pvt/softmax/scratch/seed{seed}'
        log = osp.join(runs, key, 'stamp', 'vis_data', 'scalars.json')
        _log(log, lambda i, s=seed: 1.0 + s)
        _finished(runs, key, checkpoint='x.pth', log=log)
        _finished(runs, key + '/test', metrics=dict(mIoU=miou, aAcc=90.0, mAcc=70.0))
    # seed 0's row is this work dir's run; seed 1's kept row says 45.0: another run of that key (its curve is kept);
    # seed 2 has no run here and no kept curve
    rows = [_row('softmax', 0, 60.0), _row('softmax', 1, 45.0), _row('softmax', 2, 50.0, macc=9.2)]
    study = ts.Study(Runner(runs, str(tmp_path), jobs=1, echo=lambda m: None), ROOT, [0, 1, 2], ['pvt'], ['seg'],
                     ['softmax'], echo=lambda m: None)
    new = study.curves(rows)
    assert list(new) == [tc.identity(rows[0])]
    assert [r['iter'] for r in new[tc.identity(rows[0])]] == list(range(10, 201, 10))  # no validation record
    kept = {tc.identity(rows[1]): [dict(iter=10, loss=7.0, acc_seg=None)]}
    curves = tc.merged(rows, new, kept)
    assert {(c['seed'], c['loss']) for c in curves} == {(0, 1.0), (1, 7.0)}
    # written by the study's outputs, read back the same; the segmentors' table and plot made from them
    out = tmp_path / 'out'
    tsr.write_outputs(rows, str(out), curves=curves)
    back = tc.read_curves(str(out / 'curves.csv'))
    assert back == {tc.identity(rows[0]): new[tc.identity(rows[0])], **kept}
    assert (out / 'seg_curves.png').stat().st_size > 0
    profiles = tc.seg_profiles(rows, curves, tsr.FLOOR_MACC)
    assert [(p['seed'], p['floor'], p['final']) for p in profiles] == [(0, False, 1.0), (1, False, 7.0)]
    table = tc.seg_markdown(profiles).splitlines()
    # 200 logged iterations: no loss at 500 and later; the lowest window ends at 110 (the first full one)
    assert table[2] == '| pvt | `softmax` | scratch | 0 | 60.0 | no |  |  |  |  | 1.000 (110) | 0.000 | 90.0 |'
    assert len(table) == 4
    with open(out / 'bad.csv', 'w') as f:
        f.write('layout,iter\npvt,10\n')
    with pytest.raises(ValueError, match='no column task, kernel'):
        tc.read_curves(str(out / 'bad.csv'))
    assert tc.read_curves(str(out / 'missing.csv')) == {}
