"""The warm-start carry-over test (docs/warm_start.md, "What carries from digits to ImageNet"): the rule stated
before its runs, applied to its results folders and the committed grid.

* steps, which decides (``docs/results/carry_over/steps/``): on x^3, `transfer-half` minus `transfer` at 60 of 600
  iterations (10 %; 30 and 20 stage-1 steps), paired by seed, its 95 % interval and each seed left out: above zero
  throughout: the fraction carries, the defaults stay; holding zero or below with `transfer` leaving no x^3 seed at
  chance: the step count decided, token attention and windows go back to `transfer`; else inconclusive;
* fraction, which records (``docs/results/carry_over/fraction/``): on x^3, `transfer` at 45 of 300 (15 %, 15 steps)
  minus `transfer-half` at 30 of 300 (10 %, 15 steps): above zero, below, or no difference detectable;
* beside them: linear's intervals, version 2 on the two kernels, x^3's seeds at chance per condition.

A folder without rows: 'not run yet'.
"""
import csv
import os.path as osp
from typing import Dict, List, Optional, Tuple

from . import recipe_rule as rr
from .findings import CHANCE_TOP1

KERNELS = ('poly:degree=3', 'linear')
GRID = ('docs', 'results', 'warm_start', 'classifiers.csv')
STEPS = ('docs', 'results', 'carry_over', 'steps', 'classifiers.csv')
FRACTION = ('docs', 'results', 'carry_over', 'fraction', 'classifiers.csv')
# (label, folder, backbone, recipe, budget): the conditions, each its stage-1 steps and fraction in the label
CONDITIONS = (('`transfer` at 30 of 300 (10 %, 10 steps)', GRID, 'pvt', 'transfer', 30),
              ('`transfer-half` at 30 of 300 (10 %, 15 steps)', GRID, 'pvt', 'transfer-half', 30),
              ('`transfer` at 45 of 300 (15 %, 15 steps)', FRACTION, 'pvt', 'transfer', 45),
              ('`transfer` at 60 of 600 (10 %, 20 steps)', STEPS, 'pvt600', 'transfer', 60),
              ('`transfer-half` at 60 of 600 (10 %, 30 steps)', STEPS, 'pvt600', 'transfer-half', 60),
              # the fraction contrast's own 10 % (its teachers retrained: the committed grid's did not reproduce)
              ('`transfer-half` at 30 of 300 (10 %, 15 steps), the fraction runs\' teachers', FRACTION, 'pvt',
               'transfer-half', 30))


def _rows(root: str, path: Tuple[str, ...]) -> List[dict]:
    full = osp.join(root, *path)
    if not osp.isfile(full):
        return []
    with open(full, newline='') as f:
        return list(csv.DictReader(f))


def scores(root: str, path, backbone: str, recipe: str, budget: int) -> Dict[Tuple[str, int], float]:
    """(kernel, seed) -> top-1 of the carry-over kernels' finished warm starts of one condition."""
    got = rr.grid_scores(_rows(root, path), backbone, recipe, budget, 'transfer')
    return {key: v for key, v in got.items() if key[0] in KERNELS}


def _every(v: dict):
    return [v['interval'], *v['drop_seed'].values()]


def _side(v: dict) -> str:
    """'above' / 'below' when the interval and every leave-one-seed-out interval lie on that side of zero."""
    every = _every(v)
    if all(i.half is not None and i.low > 0 for i in every):
        return 'above'
    if all(i.half is not None and i.high < 0 for i in every):
        return 'below'
    return 'neither'


def _x3(root: str, cond) -> Dict[int, float]:
    return {s: v for (k, s), v in scores(root, *cond[1:]).items() if k == 'poly:degree=3'}


def _one_kernel(root: str, kernel: str, cand, base) -> Optional[dict]:
    c = {key: v for key, v in scores(root, *cand[1:]).items() if key[0] == kernel}
    b = {key: v for key, v in scores(root, *base[1:]).items() if key[0] == kernel}
    return rr.verdict(c, b) if c and b and set(c) & set(b) else None


def _line(what: str, v: Optional[dict], said: Dict[str, str]) -> str:
    if v is None:
        return f'- {what}: not run yet.'
    weakest = min(v['drop_seed'].items(), key=lambda x: x[1].low if x[1].low is not None else float('-inf'),
                  default=None)
    weak = f'; weakest with one seed left out: without seed {weakest[0]} {weakest[1].text()}' if weakest else ''
    return f"- {what}: {v['interval'].text()}{weak}: {said[_side(v)]}"


def decision(root: str) -> Optional[str]:
    """What carries, by the rule stated before the runs: 'fraction', 'steps', or None (not run, or inconclusive)."""
    v = _one_kernel(root, 'poly:degree=3', CONDITIONS[4], CONDITIONS[3])
    if v is None or len(v['seeds']) < 5:
        return None
    if _side(v) == 'above':
        return 'fraction'
    at_chance = sum(t <= CHANCE_TOP1 for t in _x3(root, CONDITIONS[3]).values())
    return 'steps' if at_chance == 0 else None


def steps_verdict(root: str) -> str:
    """The decision of the steps contrast, in words."""
    v = _one_kernel(root, 'poly:degree=3', CONDITIONS[4], CONDITIONS[3])
    if v is None or len(v['seeds']) < 5:
        return 'not decided yet (fewer than five seeds of x^3 finished at 60 of 600)'
    said = {'fraction': 'the 10 % gap holds at twice the stage-1 steps: the fraction carries; the shipped defaults stay',
            'steps': 'the step count decided the 10 % verdict: token attention and windows go back to `transfer`, the '
                     'verdict at the grid\'s largest budget (the rule stated before the runs)',
            None: 'inconclusive: the shipped defaults stay and the test stays open'}
    return said[decision(root)]


def lines(root: str) -> List[str]:
    out = ['x^3\'s seeds at chance (top-1 at or below 15 %) per condition, PVTv2-b0 without spatial reduction:', '']
    for label, path, bb, recipe, budget in CONDITIONS:
        x3 = _x3(root, (label, path, bb, recipe, budget))
        got = f'{sum(v <= CHANCE_TOP1 for v in x3.values())} of {len(x3)}' if x3 else 'not run yet'
        out.append(f'- {label}: {got}')
    steps = {'above': 'above zero throughout', 'below': 'below zero throughout', 'neither': 'no side throughout'}
    frac = {'above': 'the larger fraction gains at one step count', 'below': 'the larger fraction loses at one step '
            'count', 'neither': 'no difference detectable at n = 5 at one step count'}
    out += ['', 'Paired by seed, 95 % interval over seeds:', '']
    for kernel in KERNELS:
        out.append(_line(f'{kernel}, `transfer-half` minus `transfer` at 30 of 300 (the committed grid)',
                         _one_kernel(root, kernel, CONDITIONS[1], CONDITIONS[0]), steps))
        out.append(_line(f'{kernel}, `transfer-half` minus `transfer` at 60 of 600 (two step counts at one fraction)',
                         _one_kernel(root, kernel, CONDITIONS[4], CONDITIONS[3]), steps))
        out.append(_line(f'{kernel}, `transfer` at 45 minus `transfer-half` at 30 of 300 (two fractions at one step '
                         'count; both on the fraction runs\' teachers)',
                         _one_kernel(root, kernel, CONDITIONS[2], CONDITIONS[5]), frac))
    c, b = scores(root, *CONDITIONS[4][1:]), scores(root, *CONDITIONS[3][1:])
    v2 = rr.verdict(c, b) if c and b else None
    out += ['', '- Version 2 on both kernels at 60 of 600 (with two kernels its leave-one-kernel-out step judges each '
            'kernel alone): ' + ('not run yet' if v2 is None else
                                 f"{v2['interval'].text()}: {'replaces' if v2['replaces'] else 'does not replace'}"),
            f'- The decision (steps, x^3): {steps_verdict(root)}.', '']
    return out
