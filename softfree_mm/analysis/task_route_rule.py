"""The task route against the ImageNet route at small scale (docs/warm_start.md, "The task route at small scale: the
rule, stated before its runs"): the rule applied to the task study's rows (``docs/results/task_study/runs.csv``,
layout ``pvt``).

Per kernel (x^3 / sqrt(N), linear, InLine, agent) and task (the demo Mask R-CNN: bbox and segm mAP; the demo
Semantic FPN: mIoU), paired by seed (the seed is the unit: a seed's runs share its softmax classifier and data
order), the 95 % t-interval over seeds and the interval with each seed left out in turn:

* task route minus ImageNet route (start ``task`` minus start ``transfer``) decides (:func:`verdict`): ``'task'``
  where on every primary metric of the task the interval and every leave-one-seed-out interval lie above zero;
  ``'imagenet'`` where they all lie below zero on every primary metric; ``'neither'`` otherwise (no difference
  established, or the metrics disagree); None (not decided yet) with fewer than :data:`SEEDS` seeds paired;
* each route minus from scratch (``task`` / ``transfer`` minus ``scratch``), recorded by the same sides;
* segmentors at the floor (mAcc at most :data:`~softfree_mm.analysis.findings.COLLAPSE_MACC`: background only) as
  k of n per start;
* the x^3 segmentor (:func:`collapse_answer`): fitting the kernel at the segmentor's token count changes the
  collapse where the task route leaves fewer x^3 segmentors at the floor than the ImageNet route and its mIoU minus
  the ImageNet route's lies above zero throughout; it does not where the task route has as many at the floor or more
  and that difference is not above zero; anything else is inconclusive.

A kernel and task without rows of the task route: 'not run yet'.
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence

from .findings import COLLAPSE_MACC
from .stats import Interval, interval

LAYOUT = 'pvt'
KERNELS = ('poly:degree=3', 'linear', 'inline', 'agent')
PRIMARY = {'det': ('bbox_mAP', 'segm_mAP'), 'seg': ('mIoU', )}
TASK, IMAGENET, SCRATCH = 'task', 'transfer', 'scratch'
SEEDS = 5  # seeds paired before a verdict is taken
RUNS = ('docs', 'results', 'task_study', 'runs.csv')
BEGIN = ('<!-- task route at small scale: made by tools/analysis/doc_figures.py from docs/results/task_study/runs.csv, '
         'do not edit by hand -->')
END = '<!-- task route at small scale: end -->'


def scores(rows: Sequence[dict], task: str, kernel: str, start: str, metric: str) -> Dict[int, float]:
    """seed -> the metric of the layout's finished runs of one (task, kernel, start)."""
    return {int(r['seed']): float(r[metric]) for r in rows
            if r.get('layout') == LAYOUT and r.get('task') == task and r.get('kernel') == kernel
            and r.get('start') == start and r.get('status') == 'ok' and r.get(metric) not in (None, '')}


def contrast(a: Dict[int, float], b: Dict[int, float]) -> Optional[dict]:
    """``a - b`` paired by seed: the interval over seeds and each seed left out (None: no seed in both)."""
    d = {s: a[s] - b[s] for s in sorted(set(a) & set(b))}
    if not d:
        return None
    return dict(interval=interval(d.values(), 'seeds'), seeds=sorted(d),
                drop_seed={s: interval([v for t, v in d.items() if t != s], 'seeds') for s in d})


def side(c: Optional[dict]) -> str:
    """'above' / 'below' where the interval and every leave-one-seed-out interval lie on that side of zero; else
    'neither' (also without a contrast)."""
    if c is None:
        return 'neither'
    every: List[Interval] = [c['interval'], *c['drop_seed'].values()]
    if all(i.half is not None and i.low > 0 for i in every):
        return 'above'
    if all(i.half is not None and i.high < 0 for i in every):
        return 'below'
    return 'neither'


def contrasts(rows: Sequence[dict], task: str, kernel: str, start: str, against: str) -> Dict[str, Optional[dict]]:
    """metric -> ``start`` minus ``against`` for each primary metric of the task."""
    return {m: contrast(scores(rows, task, kernel, start, m), scores(rows, task, kernel, against, m))
            for m in PRIMARY[task]}


def verdict(rows: Sequence[dict], task: str, kernel: str) -> Optional[str]:
    """The rule's decision on one kernel and task: 'task', 'imagenet', 'neither', or None (fewer than SEEDS seeds of
    both routes paired on a primary metric)."""
    got = contrasts(rows, task, kernel, TASK, IMAGENET)
    if any(c is None or len(c['seeds']) < SEEDS for c in got.values()):
        return None
    sides = {side(c) for c in got.values()}
    if sides == {'above'}:
        return 'task'
    if sides == {'below'}:
        return 'imagenet'
    return 'neither'


def at_floor(rows: Sequence[dict], kernel: str, start: str) -> Optional[tuple]:
    """(segmentors at the floor, segmentors finished) of one kernel and start (None: none finished)."""
    macc = scores(rows, 'seg', kernel, start, 'mAcc')
    return (sum(v <= COLLAPSE_MACC for v in macc.values()), len(macc)) if macc else None


def collapse_answer(rows: Sequence[dict], kernel: str = 'poly:degree=3') -> Optional[str]:
    """Does fitting the kernel at the segmentor's token count change the collapse? 'yes', 'no', 'inconclusive', or
    None (fewer than SEEDS seeds of both routes)."""
    task, imagenet = at_floor(rows, kernel, TASK), at_floor(rows, kernel, IMAGENET)
    c = contrasts(rows, 'seg', kernel, TASK, IMAGENET)['mIoU']
    if task is None or imagenet is None or c is None or len(c['seeds']) < SEEDS:
        return None
    if task[0] < imagenet[0] and side(c) == 'above':
        return 'yes'
    if task[0] >= imagenet[0] and side(c) != 'above':
        return 'no'
    return 'inconclusive'


SAID = {'task': 'the task route is better at equal images: a holder of a trained softmax model takes it',
        'imagenet': 'the ImageNet route is better at equal images: it stays the route also for a holder of a '
                    'trained softmax model',
        'neither': 'no difference established at equal images: the route is chosen by what the user holds and by '
                   'its cost',
        None: f'not decided yet (fewer than {SEEDS} seeds of both routes)'}
ANSWER = {'yes': 'yes: fitted at the segmentor\'s token count, x^3 collapses less',
          'no': 'no: the collapse does not depend on where the kernel was fitted',
          'inconclusive': 'inconclusive at this n', None: f'not decided yet (fewer than {SEEDS} seeds of both routes)'}


def _text(c: Optional[dict]) -> str:
    return 'no seed of both' if c is None else f"{c['interval'].text()}, {side(c)} throughout"


def lines(rows: Sequence[dict]) -> List[str]:
    """The generated section's lines (between the markers)."""
    out = ['Paired by seed, 95 % interval over seeds; "throughout": the interval and each seed left out; layout '
           f'`{LAYOUT}` of the task study.', '']
    for task in ('det', 'seg'):
        for kernel in KERNELS:
            if not any(scores(rows, task, kernel, TASK, m) for m in PRIMARY[task]):
                out.append(f'- {task} `{kernel}`: not run yet.')
                continue
            parts = []
            for start, against in ((TASK, IMAGENET), (TASK, SCRATCH), (IMAGENET, SCRATCH)):
                got = contrasts(rows, task, kernel, start, against)
                parts.append(f'{start} minus {against}: ' + '; '.join(f'{m} {_text(c)}' for m, c in got.items()))
            if task == 'seg':
                floors = {s: at_floor(rows, kernel, s) for s in (TASK, IMAGENET, SCRATCH)}
                parts.append('at the floor ' + ', '.join(f'{s} {f[0]} of {f[1]}' if f else f'{s} none finished'
                                                         for s, f in floors.items()))
            out.append(f'- {task} `{kernel}`: ' + '; '.join(parts) + f'. Verdict: {SAID[verdict(rows, task, kernel)]}.')
    out += ['', f'- The x^3 segmentor: {ANSWER[collapse_answer(rows)]}.']
    return out


def section(root: str) -> str:
    """The section, markers included, from the committed runs.csv."""
    from .committed_csv import read_csv
    path = osp.join(root, *RUNS)
    rows = read_csv(path) if osp.isfile(path) else []
    return '\n'.join([BEGIN, '', *lines(rows), '', END])
