"""softfree_mm.analysis.task_study (tools/analysis/task_study.py): the detection and segmentation study.

Guards: the paired differences to softmax, their 95 % t-intervals and the table, by hand on a small set of rows with
a failed seed and a kernel that does not fit; a resumed study repeats nothing (every finished run is read from its
result.json; only an unfinished one starts a process); a kernel a layout refuses is a row with the fit error's line;
unknown layouts, tasks and kernels are one line listing the known ones.
"""
import json
import math
import os
import os.path as osp
import subprocess
import sys

import pytest

from softfree_mm.analysis import task_study as ts
from softfree_mm.analysis import task_study_report as tsr
from softfree_mm.analysis.warm_start import Runner

from tests.helpers import ROOT


def _row(task, kernel, seed, status='ok', start='scratch', **metrics):
    return dict(layout='pvt', task=task, kernel=kernel, start=start, recipe=ts.recipe_of('pvt', start), seed=seed,
                cls_top1=70.0 + seed, status=status, error='' if status == 'ok' else 'boom: it broke', **metrics)


ROWS = [
    *[_row('det', 'softmax', s, bbox_mAP=b, segm_mAP=m) for s, b, m in ((0, .50, .30), (1, .40, .35), (2, .45, .32))],
    _row('det', 'poly:degree=3', 0, bbox_mAP=.46, segm_mAP=.31), _row('det', 'poly:degree=3', 1, 'failed'),
    _row('det', 'poly:degree=3', 2, bbox_mAP=.47, segm_mAP=.30),
    *[_row('det', 'soft:landmark_ratio=2', s, 'unfit') for s in (0, 1, 2)],
    *[_row('seg', 'softmax', s, mIoU=v) for s, v in ((0, 60.0), (1, 62.0), (2, 58.0))],
    *[_row('seg', 'linear', s, mIoU=v) for s, v in ((0, 55.0), (1, 57.0), (2, 54.0))],
]


def test_paired_differences_intervals_and_table_by_hand_with_a_failed_seed_and_an_unfit_kernel():
    summary = tsr.summarise(ROWS)
    poly = next(e for e in summary if e['kernel'] == 'poly:degree=3')
    # seeds 0 and 2 pair up (seed 1 failed): -0.04 and +0.02
    d = [.46 - .50, .47 - .45]
    mean, std = sum(d) / 2, math.sqrt(sum((x - sum(d) / 2) ** 2 for x in d) / 1)
    poly_std = std
    assert (poly['n'], poly['failed']) == (2, 1)
    assert poly['bbox_mAP'] == pytest.approx((.46 + .47) / 2)
    assert poly['d_bbox_mAP'] == pytest.approx(mean) and poly['d_bbox_mAP_std'] == pytest.approx(std)
    half = 12.7062 * std / math.sqrt(2)  # t(0.975, 1)
    assert poly['d_bbox_mAP_ci'] == pytest.approx((mean - half, mean + half), rel=1e-5)
    assert poly['d_bbox_mAP_within'] is True and poly['d_bbox_mAP_above'] == 1 and poly['d_bbox_mAP_n'] == 2
    assert poly['cls_top1'] == pytest.approx((70.0 + 72.0) / 2)
    lin = next(e for e in summary if e['kernel'] == 'linear')
    d = [-5.0, -5.0, -4.0]
    mean = sum(d) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = 4.3027 * std / math.sqrt(3)  # t(0.975, 2)
    assert lin['d_mIoU'] == pytest.approx(mean) and lin['d_mIoU_ci'] == pytest.approx((mean - half, mean + half), rel=1e-5)
    assert lin['d_mIoU_within'] is False and lin['d_mIoU_above'] == 0
    soft = next(e for e in summary if e['kernel'] == 'soft:landmark_ratio=2')
    assert (soft['n'], soft['unfit'], soft['failed']) == (0, 3, 0)

    table = tsr.markdown(summary)
    assert '| `poly:degree=3` | scratch | scratch-300 | 2 (1 failed) | 71.0 | 0.465 ± 0.007 | 0.305 ± 0.007 | ' \
           f'{mean_cell(-0.01, poly_std)}, 1 of 2 seeds above; 95 % [{-0.01 - half_of(poly_std, 2):+.3f}, ' \
           f'{-0.01 + half_of(poly_std, 2):+.3f}]: no difference detectable at n = 2, half-width ' \
           f'{half_of(poly_std, 2):.3f} | ' in table, table
    assert '| `soft:landmark_ratio=2` | scratch | scratch-300 | 0 | does not fit: boom: it broke |' in table
    assert '| `linear` | scratch | scratch-300 | 3 | 71.0 | 55.3 ± 1.5 | -4.7 ± 0.6, 0 of 3 seeds above; 95 % ' \
           '[-6.1, -3.2]: excludes zero | 0 of 3 |' in table
    lines = tsr.within_and_extremes(summary)
    assert any(line.startswith('pvt seg mIoU: no difference from softmax detectable (the interval holds zero): none; '
                               'interval excludes zero: linear (scratch) -4.67') for line in lines), lines
    assert any(line.startswith('pvt det bbox_mAP: no difference from softmax detectable (the interval holds zero): '
                               'poly:degree=3 (scratch); interval excludes zero: none') for line in lines), lines


def test_the_lines_name_a_one_seed_row_as_without_interval_and_give_the_range_of_differences():
    """A row with one paired seed has no interval: the line says so rather than counting it in neither list; the
    differences are given as a range from the lowest to the highest, one figure where one row is compared."""
    rows = [_row('seg', 'softmax', s, mIoU=m) for s, m in ((0, 50.0), (1, 52.0), (2, 54.0))]
    one = tsr.within_and_extremes(tsr.summarise(rows + [_row('seg', 'linear', 0, mIoU=40.0)]))
    assert one == ['pvt seg mIoU: no difference from softmax detectable (the interval holds zero): none; interval '
                   'excludes zero: none; no interval (one seed): linear (scratch); the paired difference -10 '
                   '(linear, scratch)'], one
    rows += [_row('seg', 'linear', s, mIoU=m) for s, m in ((0, 40.0), (1, 41.0), (2, 45.0))]
    rows += [_row('seg', 'inline', s, mIoU=m) for s, m in ((0, 51.0), (1, 51.0), (2, 56.0))]
    two = tsr.within_and_extremes(tsr.summarise(rows))
    assert two[0].endswith('; paired differences from -10 (linear, scratch) to +0.667 (inline, scratch)'), two
    assert 'no interval' not in two[0]


def test_a_paired_mean_that_cancels_to_rounding_error_reads_as_zero():
    """Seeds whose differences cancel give a float mean like -1.85e-17: the lines say +0, not an exponent."""
    d = [0.48 - 0.49, 0.347 - 0.34, 0.5 - 0.497]
    assert sum(d) / 3 != 0 and abs(sum(d) / 3) < 1e-15
    assert tsr._signed(sum(d) / 3) == '+0'
    assert (tsr._signed(0.0961), tsr._signed(-35.63), tsr._signed(-0.0137)) == ('+0.0961', '-35.6', '-0.0137')


def mean_cell(mean, std):
    return f'{mean:+.3f} ± {std:.3f}'.replace('+-', '-')


def half_of(std, n):
    return {1: 12.7062, 2: 4.3027, 3: 3.1824}[n - 1] * std / math.sqrt(n)  # the t table for 2 to 4 seeds


def test_outputs_csv_summary_plot_and_the_docs_section_between_markers(tmp_path):
    docs = tmp_path / 'study.md'
    docs.write_text('# Study\n\nsome text\n')
    tsr.write_outputs(ROWS, str(tmp_path / 'out'), str(docs))
    text = docs.read_text()
    assert text.count(tsr.BEGIN) == 1 and '## Detection and segmentation' in text and 'some text' in text
    assert '![detection and segmentation per kernel, seeds and means](out/task_study.png)' in text
    tsr.write_outputs(ROWS[:6], str(tmp_path / 'out'), str(docs))  # again: the section is replaced, not added
    again = docs.read_text()
    assert again.count(tsr.BEGIN) == 1 and again.count('## Detection and segmentation') == 1
    assert 'linear' not in again.split(tsr.BEGIN)[1]
    rows = ts.read_rows(str(tmp_path / 'out' / 'runs.csv'))
    assert [r['seed'] for r in rows] == [0, 1, 2, 0, 1, 2] and rows[0]['bbox_mAP'] == 0.5
    assert (tmp_path / 'out' / 'task_study.png').stat().st_size > 10000


FAKE_TOOL = """import sys
with open({log!r}, 'a') as f:
    f.write(' '.join(sys.argv[:2]) + '\\n')
print('error: the fake tool ran', file=sys.stderr)
sys.exit(1)
"""


def _finished(root, key, **fields):
    os.makedirs(osp.join(root, key), exist_ok=True)
    with open(osp.join(root, key, 'result.json'), 'w') as f:
        json.dump(dict(status='ok', error='', key=key, **fields), f)


def test_a_resumed_study_repeats_nothing_and_runs_only_what_did_not_finish(tmp_path):
    tools, runs, log = tmp_path / 'tools', str(tmp_path / 'runs'), str(tmp_path / 'calls.log')
    tools.mkdir()
    for name in ('train.py', 'test.py'):
        (tools / name).write_text(FAKE_TOOL.format(log=log))
    # the study's PVTv2 warm starts are transfer-final (its rows were made with it): its runs' keys name its stage 1
    assert ts.LAYOUTS['pvt'].default == 'transfer-final' and ts.recipe_of('pvt', 'transfer') == 'transfer-final-75'
    for key in ('scratch/pvt/softmax/seed0', 'scratch/pvt/linear/seed0',
                'transfer/pvt/linear/kernel+qkv/blocks+final-0.33/75/seed0',
                'transfer_ft/pvt/linear/kernel+qkv/blocks+final-0.33/75/seed0'):
        _finished(runs, key, checkpoint=key + '.pth', top1_final=70.0)
    for kernel, start, miou in (('softmax', 'scratch', 60.0), ('linear', 'scratch', 55.0),
                                ('linear', 'transfer-transfer-final', 58.0)):
        key = f'seg/pvt/{kernel}/{start}/seed0'
        _finished(runs, key, checkpoint=key + '.pth')
        _finished(runs, key + '/test', metrics=dict(mIoU=miou, aAcc=90.0, mAcc=70.0))

    def study():
        runner = Runner(runs, str(tools), jobs=1, echo=lambda m: None)
        return ts.Study(runner, ROOT, [0], ['pvt'], ['seg'], ['softmax', 'linear'], starts=['scratch', 'transfer'],
                        echo=lambda m: None)

    rows = study().run()
    assert not osp.exists(log), open(log).read()  # nothing ran: every run is read
    assert [(r['kernel'], r['start'], r['mIoU'], r['cls_top1']) for r in rows] == [
        ('softmax', 'scratch', 60.0, 70.0), ('linear', 'scratch', 55.0, 70.0), ('linear', 'transfer', 58.0, 70.0)]
    assert [r['recipe'] for r in rows] == ['scratch-300', 'scratch-300', 'transfer-final-75']
    os.remove(osp.join(runs, 'seg/pvt/linear/transfer-transfer-final/seed0/test', 'result.json'))
    rows = study().run()
    calls = open(log).read().splitlines()
    test_dir = osp.join(runs, 'seg/pvt/linear/transfer-transfer-final/seed0/test')
    assert len(calls) == 1 and calls[0].endswith(
        'test.py ' + osp.join(test_dir, 'seg_pvt_linear_transfer-transfer-final_seed0_test.py'))
    (failed,) = [r for r in rows if r['status'] != 'ok']
    assert (failed['kernel'], failed['start'], failed['status']) == ('linear', 'transfer', 'failed')
    assert 'the fake tool ran' in failed['error']


def test_the_finished_rows_of_an_earlier_runs_csv_are_kept_and_nothing_of_them_runs_again(tmp_path):
    """The work dir gone (another machine): the committed runs.csv's finished rows are not run again, nor their
    classifiers; what it does not hold runs (its classifier first); rows outside the selection stay; a row of a start
    that now takes another recipe is not kept."""
    tools, runs, log = tmp_path / 'tools', str(tmp_path / 'runs'), str(tmp_path / 'calls.log')
    tools.mkdir()
    for name in ('train.py', 'test.py'):
        (tools / name).write_text(FAKE_TOOL.format(log=log))
    keep = [_row('seg', 'softmax', 0, mIoU=60.0), _row('seg', 'linear', 0, mIoU=55.0),
            dict(_row('seg', 'linear', 0, start='transfer', mIoU=50.0), recipe='transfer-75'),
            _row('seg', 'softmax', 7, mIoU=61.0), _row('seg', 'linear', 0, 'failed')]
    for r in keep:
        r['source'] = 'study'
    tsr.write_outputs(keep[:4], str(tmp_path / 'out'))
    kept = ts.read_rows(str(tmp_path / 'out' / 'runs.csv'))

    def study(keep_rows, starts):
        runner = Runner(runs, str(tools), jobs=1, echo=lambda m: None)
        return ts.Study(runner, ROOT, [0], ['pvt'], ['seg'], ['softmax', 'linear'], starts=starts, keep=keep_rows,
                        echo=lambda m: None)

    rows = study(kept, ['scratch']).run()
    assert not osp.exists(log), open(log).read()  # nothing ran: no classifier, no segmentor
    assert [(r['kernel'], r['seed'], r['mIoU'], r['status']) for r in rows] == [
        ('softmax', 0, 60.0, 'ok'), ('linear', 0, 55.0, 'ok'), ('linear', 0, 50.0, 'ok'), ('softmax', 7, 61.0, 'ok')]
    # the transfer start now takes transfer-final: its old transfer-75 row is not kept; it runs from the softmax
    # classifier (which the kept rows did not need) and fails here, a row with its error
    rows = study(kept, ['scratch', 'transfer']).run()
    calls = [c.split()[1] for c in open(log).read().splitlines()]
    assert calls == [osp.join(runs, 'scratch/pvt/softmax/seed0', 'scratch_pvt_softmax_seed0.py')], calls
    assert [(r['kernel'], r['start'], r['recipe'], r['status']) for r in rows] == [
        ('softmax', 'scratch', 'scratch-300', 'ok'), ('linear', 'scratch', 'scratch-300', 'ok'),
        ('linear', 'transfer', 'transfer-final-75', 'failed'), ('softmax', 'scratch', 'scratch-300', 'ok')]
    # a failed row is run again
    os.remove(log)
    study([keep[0], keep[4]], ['scratch']).run()
    calls = [c.split()[1] for c in open(log).read().splitlines()]
    assert calls == [osp.join(runs, 'scratch/pvt/linear/seed0', 'scratch_pvt_linear_seed0.py')], calls


def test_report_only_runs_nothing_and_a_row_whose_inputs_did_not_run_is_not_run_not_failed(tmp_path):
    tools, runs, log = tmp_path / 'tools', str(tmp_path / 'runs'), str(tmp_path / 'calls.log')
    tools.mkdir()
    for name in ('train.py', 'test.py'):
        (tools / name).write_text(FAKE_TOOL.format(log=log))
    _finished(runs, 'scratch/pvt/softmax/seed0', checkpoint='softmax.pth', top1_final=70.0)
    _finished(runs, 'seg/pvt/softmax/scratch/seed0', checkpoint='seg.pth')
    _finished(runs, 'seg/pvt/softmax/scratch/seed0/test', metrics=dict(mIoU=60.0, aAcc=90.0, mAcc=70.0))
    runner = Runner(runs, str(tools), jobs=1, echo=lambda m: None, report_only=True)
    rows = ts.Study(runner, ROOT, [0], ['pvt'], ['seg'], ['softmax', 'linear'], echo=lambda m: None).run()
    assert not osp.exists(log), open(log).read()
    assert [(r['kernel'], r['start'], r['status'], r['mIoU']) for r in rows] == [
        ('softmax', 'scratch', 'ok', 60.0), ('linear', 'scratch', 'not run', None),
        ('linear', 'transfer', 'not run', None), ('linear', 'task', 'not run', None)]


def test_a_kernel_the_layout_refuses_is_a_row_with_its_fit_error():
    assert ts.fit_error(osp.join(ROOT, ts.LAYOUTS['pvt'].classifier), 'linear') == ''
    err = ts.fit_error(osp.join(ROOT, ts.LAYOUTS['xcit'].classifier), 'inline')
    assert err.startswith("SoftFreeXCiT: attention kernel 'inline' cannot be used in layer 0 (cross-covariance "
                          'attention)') and '\n' not in err


@pytest.mark.parametrize('args,message', [
    (['--layouts', 'pvt', 'swin'], "unknown backbone layout 'swin'; known: pvt, pvt_n64, pvt_lowlr, pvt_fixn, pvt_long, xcit"),
    (['--tasks', 'cls'], "unknown task 'cls'; known: det, seg"),
    (['--layouts', 'xcit', '--kernels', 'inline'], "unknown kernel 'inline' for xcit; known: softmax, poly:degree=3, "
                                                   'linear'),
    (['--seeds', '1', '1'], '--seeds 1 1: distinct ints >= 0, at least one'),
    (['--det-from', 'no/such.csv'], "--det-from no/such.csv: no such file (the warm-start grid's detectors.csv, "
                                     "or '')"),
    (['--keep-from', 'no/such.csv'], "--keep-from no/such.csv: no such file (a runs.csv of this study, or '')"),
])
def test_bad_input_is_one_line_naming_the_known_forms(args, message, tmp_path):
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'analysis', 'task_study.py'), *args,
                           '--work-dir', str(tmp_path / 'w'), '--out', str(tmp_path / 'o'), '--docs', ''],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == f'error: {message}', proc.stderr
    assert not (tmp_path / 'w').exists()


def test_collapses_are_counted_and_the_starts_compared_with_each_other_by_hand():
    """A segmentor at mAcc 9.0 (background only: one class of eleven) is one seed at the floor; a warm start's row is
    also compared with the same kernel from scratch, paired by seed (+1, +3, +5: mean +3, half-width
    t(0.975, 2) x 2 / sqrt(3) = 4.97)."""
    rows = [*[_row('seg', 'softmax', s, mIoU=60.0, mAcc=70.0) for s in (0, 1, 2)],
            *[_row('seg', 'linear', s, mIoU=50.0 + s, mAcc=9.0 if s == 1 else 60.0) for s in (0, 1, 2)],
            *[_row('seg', 'linear', s, start='transfer', mIoU=51.0 + 3 * s, mAcc=60.0) for s in (0, 1, 2)]]
    summary = tsr.summarise(rows)
    scratch = next(e for e in summary if e['kernel'] == 'linear' and e['start'] == 'scratch')
    assert tsr.floor_seeds(scratch) == 1
    assert '| 1 of 3 |' in tsr.markdown(summary)
    (line, ) = tsr.starts_compared(summary)
    assert line.startswith('pvt seg linear: transfer: ') and line.endswith(
        'minus scratch: mIoU +3.0 [-2.0, +8.0] (95 %, n = 3 seeds)'), line


def test_a_layout_on_anothers_classifiers_is_compared_with_it_seed_by_seed_by_hand():
    """pvt_n64 minus pvt, paired by seed (same classifier): the row's own difference and the change of its gap to
    softmax; seeds at the floor in both; every interval of the lines is counted in the multiplicity line."""
    def row(layout, kernel, seed, miou, macc=60.0):
        return dict(_row('seg', kernel, seed, mIoU=miou, mAcc=macc), layout=layout)
    rows = [*[row('pvt', 'softmax', s, 60.0 + s) for s in (0, 1, 2)],
            *[row('pvt', 'poly:degree=3', s, v, m) for s, v, m in ((0, 8.0, 9.0), (1, 30.0, 40.0), (2, 8.3, 9.0))],
            *[row('pvt_n64', 'softmax', s, 50.0 - s) for s in (0, 1, 2)],
            *[row('pvt_n64', 'poly:degree=3', s, v, m) for s, v, m in ((0, 9.0, 9.0), (1, 34.0, 45.0), (2, 14.3, 20.0))]]
    summary = tsr.summarise(rows)
    lines = tsr.layouts_compared(summary)
    assert len(lines) == 2, lines
    # softmax: n64 - pvt = -10, -12, -14: mean -12, std 2, half 4.3027 * 2 / sqrt(3) = 4.97
    assert lines[0] == ('pvt_n64 seg softmax (scratch) minus pvt: mIoU -12.0 [-17.0, -7.0] (95 %, n = 3 seeds); '
                        'seeds at the floor 0 of 3 (in pvt: 0 of 3)'), lines[0]
    # x^3: n64 - pvt = +1, +4, +6 (mean +3.67, std 2.52, half 6.25); gap change = +1 - (-10), +4 - (-12), +6 - (-14) =
    # +11, +16, +20 (mean +15.67, std 4.51, half 11.20)
    assert lines[1] == ('pvt_n64 seg poly:degree=3 (scratch) minus pvt: mIoU +3.7 [-2.6, +9.9] (95 %, n = 3 seeds); '
                        'its paired Δ mIoU vs softmax minus that in pvt +15.7 [+4.5, +26.9] (95 %, n = 3 seeds); '
                        'seeds at the floor 1 of 3 (in pvt: 2 of 3)'), lines[1]
    section = tsr.docs_section(summary, 'results')
    assert 'the lines above 3 more; by chance alone about' in section and '- ' + lines[1] in section


def test_a_layout_that_shares_anothers_classifiers_runs_none_of_its_own_and_only_its_tasks(tmp_path):
    """pvt_n64 (the segmentor at the classifier's token count) starts from pvt's classifier runs: none of its own,
    the same checkpoint passed to its segmentor, its own segmentor config; it has no detector rows."""
    tools, runs, log = tmp_path / 'tools', str(tmp_path / 'runs'), str(tmp_path / 'calls.log')
    tools.mkdir()
    for name in ('train.py', 'test.py'):
        (tools / name).write_text(FAKE_TOOL.replace("sys.argv[:2]", "sys.argv").format(log=log))
    assert ts.LAYOUTS['pvt_n64'].classifiers == 'pvt' and ts.LAYOUTS['pvt_n64'].tasks == ('seg', )
    _finished(runs, 'scratch/pvt/softmax/seed0', checkpoint='softmax.pth', top1_final=70.0)
    _finished(runs, 'seg/pvt/softmax/scratch/seed0', checkpoint='seg.pth')
    _finished(runs, 'seg/pvt/softmax/scratch/seed0/test', metrics=dict(mIoU=60.0, aAcc=90.0, mAcc=70.0))
    _finished(runs, 'det/pvt/softmax/scratch/seed0', checkpoint='det.pth')
    _finished(runs, 'det/pvt/softmax/scratch/seed0/test', metrics={'coco/bbox_mAP': 0.4, 'coco/segm_mAP': 0.3})
    runner = Runner(runs, str(tools), jobs=2, echo=lambda m: None)
    rows = ts.Study(runner, ROOT, [0], ['pvt', 'pvt_n64'], ['det', 'seg'], ['softmax'], echo=lambda m: None).run()
    assert [(r['layout'], r['task'], r['status']) for r in rows] == [
        ('pvt', 'det', 'ok'), ('pvt', 'seg', 'ok'), ('pvt_n64', 'seg', 'failed')]
    (call, ) = open(log).read().splitlines()  # one run: pvt_n64's segmentor (the fake tool fails it)
    config = osp.join(runs, 'seg/pvt_n64/softmax/scratch/seed0', 'seg_pvt_n64_softmax_scratch_seed0.py')
    assert call.split()[1] == config and 'model.backbone.init_cfg.checkpoint=softmax.pth' in call
    assert 'semfpn_pvt_v2_b0_digits_n64.py' in open(config).read()
    assert not osp.exists(osp.join(runs, 'scratch', 'pvt_n64'))


def test_the_task_routes_budget_is_the_imagenet_routes_images_by_hand():
    """The ImageNet route's warm start (75 x 32 digit crops) plus the detector's / segmentor's schedule (400 / 3000
    iterations x 4), as iterations at the task config's batch of 4."""
    from softfree_mm.analysis import task_study_route as route
    lay = ts.LAYOUTS['pvt']
    det = route.budget(osp.join(ROOT, lay.classifier), osp.join(ROOT, lay.det))
    seg = route.budget(osp.join(ROOT, lay.classifier), osp.join(ROOT, lay.seg))
    assert (det['images'], det['iters']) == (75 * 32 + 400 * 4, 1000)
    assert (seg['images'], seg['iters']) == (75 * 32 + 3000 * 4, 3600)
    assert ts.recipe_of('pvt', 'task') == 'task (transfer-final, equal images)'


def test_the_task_routes_runs_read_the_softmax_model_of_their_seed_and_their_stages_budgets(tmp_path, monkeypatch):
    """Start 'task': stage 1 (attention transfer, teacher the softmax segmentor of the same seed) then stage 2 (its
    backbone stage 1's checkpoint, its neck and head the softmax segmentor's) at the recipe's split of 3600
    iterations; a finished stage is not run again, a finished row runs nothing."""
    from mmengine.config import Config
    monkeypatch.setattr(ts, 'fit_error', lambda config, kernel: '')  # both fit (its own test builds them)
    tools, runs, log = tmp_path / 'tools', str(tmp_path / 'runs'), str(tmp_path / 'calls.log')
    tools.mkdir()
    for name in ('train.py', 'test.py'):
        (tools / name).write_text(FAKE_TOOL.replace("sys.argv[:2]", "sys.argv").format(log=log))
    softmax = osp.join(runs, 'seg/pvt/softmax/scratch/seed1/iter_3000.pth')
    _finished(runs, 'scratch/pvt/softmax/seed1', checkpoint='softmax_cls.pth', top1_final=70.0)
    _finished(runs, 'seg/pvt/softmax/scratch/seed1', checkpoint=softmax)
    _finished(runs, 'seg/pvt/softmax/scratch/seed1/test', metrics=dict(mIoU=60.0, aAcc=90.0, mAcc=70.0))

    def study():
        runner = Runner(runs, str(tools), jobs=1, echo=lambda m: None)
        return ts.Study(runner, ROOT, [1], ['pvt'], ['seg'], ['softmax', 'linear'], starts=['task'],
                        echo=lambda m: None).run()

    key = 'seg/pvt/linear/task-transfer-final/seed1'
    rows = study()
    (call, ) = open(log).read().splitlines()  # stage 1 (the fake tool fails it): nothing else
    stage1_key = 'seg/pvt/linear/task-transfer-final-stage1/seed1'  # beside stage 2's folder, not inside it
    stage1 = osp.join(runs, stage1_key, 'seg_pvt_linear_task-transfer-final-stage1_seed1.py')
    assert call.split()[1] == stage1 and 'randomness.seed=1' in call
    cfg = Config.fromfile(stage1)
    assert cfg.model.type == 'AttentionTransfer' and cfg.model.teacher.init_cfg.checkpoint == softmax
    assert cfg.model.teacher.attn_cfg == dict(type='softmax') and cfg.model.backbone.attn_cfg['type'] == 'linear'
    assert cfg.train_cfg.max_iters == 1200 and cfg.warm_start.route == 'task'
    (row, ) = [r for r in rows if r['start'] == 'task']
    assert (row['kernel'], row['status'], row['recipe'], row['cls_top1']) == (
        'linear', 'failed', 'task (transfer-final, equal images)', 70.0)
    assert row['error'].startswith('stage 1: ') and 'the fake tool ran' in row['error']

    os.remove(log)
    _finished(runs, stage1_key, checkpoint='stage1.pth')
    study()
    (call, ) = open(log).read().splitlines()  # stage 2 alone: stage 1 finished
    stage2 = osp.join(runs, key, 'seg_pvt_linear_task-transfer-final_seed1.py')
    assert call.split()[1] == stage2 and 'model.backbone.init_cfg.checkpoint=stage1.pth' in call
    cfg = Config.fromfile(stage2)
    assert cfg.train_cfg.max_iters == 2400 and cfg.model.backbone.attn_cfg['type'] == 'linear'
    assert cfg.model.decode_head.init_cfg == dict(type='Pretrained', checkpoint=softmax, prefix='decode_head.')
    assert cfg.model.neck.init_cfg['checkpoint'] == softmax

    os.remove(log)
    _finished(runs, key, checkpoint='stage2.pth', wall_s=10.0)
    _finished(runs, key + '/test', metrics=dict(mIoU=55.0, aAcc=90.0, mAcc=65.0), wall_s=1.0)
    rows = study()
    assert not osp.exists(log), open(log).read()  # finished: nothing runs again
    (row, ) = [r for r in rows if r['start'] == 'task']
    assert (row['status'], row['mIoU']) == ('ok', 55.0)
