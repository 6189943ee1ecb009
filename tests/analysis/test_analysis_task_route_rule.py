"""softfree_mm.analysis.task_route_rule: the task route against the ImageNet route (docs/warm_start.md, "The task
route at small scale"), by hand on small synthetic rows: each branch of the verdict and of the x^3 segmentor's
answer, the seeds at the floor, and 'not run yet' without the task route's rows."""
from softfree_mm.analysis import task_route_rule as trr
from softfree_mm.analysis.findings import COLLAPSE_MACC

SEEDS = range(5)


def _rows(task, start, values, kernel='linear', macc=None):
    """One row per seed: ``values`` the primary metric's (det: bbox, and segm = bbox + ``segm_shift``)."""
    out = []
    for s, v in zip(SEEDS, values):
        r = dict(layout='pvt', task=task, kernel=kernel, start=start, seed=s, status='ok')
        if task == 'det':
            r.update(bbox_mAP=v[0], segm_mAP=v[1]) if isinstance(v, tuple) else r.update(bbox_mAP=v, segm_mAP=v)
        else:
            r.update(mIoU=v, mAcc=macc[s] if macc else 60.0)
        out.append(r)
    return out


BASE = [10.0, 12.0, 11.0, 13.0, 9.0]


def _with(task_values, task='seg', **kw):
    return _rows(task, 'transfer', BASE, **kw) + _rows(task, 'task', task_values, **kw) + \
        _rows(task, 'scratch', [v - 1 for v in BASE], **kw)


def test_above_zero_throughout_on_every_metric_is_the_task_route():
    # differences +2.0, +2.5, +1.5, +2.2, +1.8: every leave-one-out interval above zero
    rows = _with([b + d for b, d in zip(BASE, (2.0, 2.5, 1.5, 2.2, 1.8))])
    assert trr.side(trr.contrasts(rows, 'seg', 'linear', 'task', 'transfer')['mIoU']) == 'above'
    assert trr.verdict(rows, 'seg', 'linear') == 'task'


def test_below_zero_throughout_on_every_metric_is_the_imagenet_route():
    rows = _with([b - d for b, d in zip(BASE, (2.0, 2.5, 1.5, 2.2, 1.8))])
    assert trr.verdict(rows, 'seg', 'linear') == 'imagenet'


def test_an_interval_holding_zero_or_one_seed_carrying_it_is_neither():
    rows = _with([b + d for b, d in zip(BASE, (1.0, -1.0, 0.5, -0.5, 0.2))])
    assert trr.verdict(rows, 'seg', 'linear') == 'neither'
    # above zero overall (+1.40 [+0.29, +2.51]), but with any seed but the large gain's left out the interval holds
    # zero: one seed carries it
    d = (1.0, 1.1, 0.9, 1.0, 3.0)
    c = trr.contrast({s: b + x for s, b, x in zip(SEEDS, BASE, d)}, dict(zip(SEEDS, BASE)))
    assert c['interval'].low > 0 and c['drop_seed'][0].holds_zero and trr.side(c) == 'neither'
    rows = _with([b + x for b, x in zip(BASE, d)])
    assert trr.verdict(rows, 'seg', 'linear') == 'neither'


def test_the_detectors_two_metrics_on_different_sides_are_neither():
    up, down = (2.0, 2.5, 1.5, 2.2, 1.8), (-2.0, -2.5, -1.5, -2.2, -1.8)
    values = [(b + u, b + w) for b, u, w in zip(BASE, up, down)]
    rows = _rows('det', 'transfer', BASE) + _rows('det', 'task', values)
    got = trr.contrasts(rows, 'det', 'linear', 'task', 'transfer')
    assert (trr.side(got['bbox_mAP']), trr.side(got['segm_mAP'])) == ('above', 'below')
    assert trr.verdict(rows, 'det', 'linear') == 'neither'
    both = _rows('det', 'transfer', BASE) + _rows('det', 'task', [b + u for b, u in zip(BASE, up)])
    assert trr.verdict(both, 'det', 'linear') == 'task'


def test_fewer_than_five_seeds_paired_is_not_decided():
    rows = _with([b + 3 for b in BASE])
    rows = [r for r in rows if not (r['start'] == 'task' and r['seed'] == 4)]
    assert trr.verdict(rows, 'seg', 'linear') is None


def _x3(task_macc, imagenet_macc, gain):
    k = 'poly:degree=3'
    return (_rows('seg', 'transfer', BASE, kernel=k, macc=imagenet_macc) +
            _rows('seg', 'task', [b + g for b, g in zip(BASE, gain)], kernel=k, macc=task_macc))


FLOOR, UP = 9.0, 60.0
assert FLOOR <= COLLAPSE_MACC < UP


def test_the_x3_segmentors_collapse_answer_in_each_branch():
    gain = (20.0, 25.0, 22.0, 21.0, 24.0)
    # fewer at the floor and above zero throughout: yes
    rows = _x3([UP] * 5, [FLOOR, FLOOR, FLOOR, UP, UP], gain)
    assert trr.at_floor(rows, 'poly:degree=3', 'task') == (0, 5)
    assert trr.at_floor(rows, 'poly:degree=3', 'transfer') == (3, 5)
    assert trr.collapse_answer(rows) == 'yes'
    # as many at the floor, no gain: no
    assert trr.collapse_answer(_x3([FLOOR, FLOOR, FLOOR, UP, UP], [FLOOR, FLOOR, UP, UP, FLOOR],
                                   (0.5, -0.5, 0.2, -0.2, 0.1))) == 'no'
    # fewer at the floor but the mIoU difference holds zero: inconclusive
    assert trr.collapse_answer(_x3([FLOOR, UP, UP, UP, UP], [FLOOR, FLOOR, UP, UP, UP],
                                   (0.5, -0.5, 0.2, -0.2, 0.1))) == 'inconclusive'
    # as many at the floor yet above zero throughout: inconclusive too
    assert trr.collapse_answer(_x3([FLOOR, FLOOR, UP, UP, UP], [FLOOR, FLOOR, UP, UP, UP], gain)) == 'inconclusive'
    assert trr.collapse_answer(_x3([UP] * 5, [FLOOR] * 5, gain)[:-1]) is None


def test_without_the_task_routes_rows_every_line_says_not_run_yet():
    rows = _rows('seg', 'transfer', BASE) + _rows('seg', 'scratch', BASE)
    lines = trr.lines(rows)
    assert '- seg `linear`: not run yet.' in lines and '- det `agent`: not run yet.' in lines
    assert lines[-1] == '- The x^3 segmentor: not decided yet (fewer than 5 seeds of both routes).'
    got = trr.lines(_with([b + d for b, d in zip(BASE, (1.0, -1.0, 0.5, -0.5, 0.0))]))
    (line, ) = [ln for ln in got if ln.startswith('- seg `linear`')]
    # differences +1, -1, +0.5, -0.5, 0: mean 0, std sqrt(2.5 / 4), half 2.7764 x 0.7906 / sqrt(5) = 0.98
    assert line.startswith('- seg `linear`: task minus transfer: mIoU +0.00 [-0.98, +0.98] (95 %, n = 5 seeds), '
                           'neither throughout; task minus scratch: mIoU +1.00 [+0.02, +1.98]'), line
    assert 'at the floor task 0 of 5, transfer 0 of 5, scratch 0 of 5' in line
    assert line.endswith('Verdict: no difference established at equal images: the route is chosen by what the user '
                         'holds and by its cost.'), line
