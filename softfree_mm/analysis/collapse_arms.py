"""The collapse's arms with controls that train (docs/study.md): the rule stated before their runs, applied as written
to the task study's summary (softfree_mm.analysis.task_study_report.summarise).

Per arm and start of x^3: the arm's softmax control trains when its mIoU minus the baseline softmax's (layout
``pvt``), paired by seed, has a 95 % interval that holds zero or lies above; otherwise the arm cannot show a rescue
(inconclusive). With a control that trains, the arm rescues x^3 when no x^3 seed ends at the floor and x^3's mIoU
minus the arm's softmax, paired by seed, has an interval that holds zero or lies above; it does not rescue when x^3
reaches the floor in at least as many seeds as in the baseline from the same start; anything else is inconclusive.
The rule is stated for n = 5: with fewer seeds finished a line says so and gives no verdict.
"""
from typing import Dict, List, Optional

from .stats import interval

BASELINE = 'pvt'
ARMS = ('pvt_lowlr', 'pvt_fixn', 'pvt_long')
KERNEL = 'poly:degree=3'
REFERENCE = 'softmax'
SEEDS = 5  # the n the rule is stated for


def _paired(a: dict, b: dict) -> List[float]:
    return [a['by_seed'][s]['mIoU'] - b['by_seed'][s]['mIoU'] for s in sorted(a['by_seed'])
            if s in b['by_seed'] and a['by_seed'][s].get('mIoU') is not None
            and b['by_seed'][s].get('mIoU') is not None]


def verdict(arm_softmax: dict, base_softmax: dict, arm_x3: dict, base_x3: Optional[dict],
            floor_seeds) -> Dict[str, object]:
    """The rule on one arm and start: dict(control, diff, floor, base_floor, n, verdict); ``floor_seeds(entry)``
    counts an entry's seeds at the floor. verdict: 'rescues', 'does not rescue', 'inconclusive' or None (fewer than
    five seeds paired)."""
    control = interval(_paired(arm_softmax, base_softmax), 'seeds')
    diff = interval(_paired(arm_x3, arm_softmax), 'seeds')
    floor, base_floor = floor_seeds(arm_x3), (floor_seeds(base_x3) if base_x3 else None)
    out = dict(control=control, diff=diff, floor=floor, base_floor=base_floor, n=arm_x3['n'], verdict=None)
    if min(control.n, diff.n, arm_x3['n']) < SEEDS:
        return out
    if control.high is None or control.high < 0:
        out['verdict'] = 'inconclusive'  # the control does not train: the arm cannot show a rescue
    elif floor == 0 and diff.high is not None and diff.high >= 0:
        out['verdict'] = 'rescues'
    elif base_floor is not None and floor >= base_floor:
        out['verdict'] = 'does not rescue'
    else:
        out['verdict'] = 'inconclusive'
    return out


def lines(summary: List[dict], floor_seeds, titles: Dict[str, str]) -> List[str]:
    """One line per arm and start of x^3 with rows in ``summary``."""
    seg = {(e['layout'], e['kernel'], e['start']): e for e in summary if e['task'] == 'seg' and e['n']}
    base_softmax = seg.get((BASELINE, REFERENCE, 'scratch'))
    out = []
    for arm in ARMS:
        soft = seg.get((arm, REFERENCE, 'scratch'))
        for (layout, kernel, start), x3 in seg.items():
            if layout != arm or kernel != KERNEL:
                continue
            if soft is None or base_softmax is None:
                out.append(f'{arm} ({titles.get(arm, arm)}), x^3 from {start}: no softmax control yet')
                continue
            v = verdict(soft, base_softmax, x3, seg.get((BASELINE, KERNEL, start)), floor_seeds)
            high = v['control'].high
            trains = ('not judged: one seed gives no interval' if high is None else
                      'trains' if high >= 0 else 'does not train')
            base = '' if v['base_floor'] is None else f" (baseline from {start}: {v['base_floor']})"
            said = (v['verdict'] if v['verdict'] else
                    f'no verdict yet: the rule is stated for {SEEDS} seeds, {v["n"]} finished')
            out.append(f"{arm} ({titles.get(arm, arm)}), x^3 from {start}: the arm's softmax minus the baseline's "
                       f"{v['control'].text(1)} ({trains}); x^3 at the floor in {v['floor']} of {v['n']}{base}; x^3 "
                       f"minus the arm's softmax {v['diff'].text(1)}: {said}")
    return out
