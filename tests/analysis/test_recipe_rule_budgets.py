"""The recipe rule, version 2, at the budget that ships: the package's layout defaults are the rule's verdict there on
the committed grid; the rule's steps that no other test would miss (the leave-one-seed-out veto, the largest mean
among several winners); the layout class that decides which default a Swin or CSWin takes."""
import csv
import os.path as osp

import pytest

from softfree_mm.analysis import recipe_rule as rr
from softfree_mm.engine import layout_defaults as ld

from tests.helpers import ROOT

GRID = osp.join(ROOT, 'docs', 'results', 'warm_start', 'classifiers.csv')


def _committed():
    with open(GRID, newline='') as f:
        return list(csv.DictReader(f))


def test_layout_defaults_are_the_rules_verdict_at_the_budget_that_ships():
    """For every layout class the grid measured, LAYOUT_DEFAULTS is what version 2 chooses on the committed CSV at
    the grid budget of the ImageNet scale's fraction (30 of 300 epochs: 10 %, the grid's 30 of 300 iterations), or,
    where the committed carry-over test found the stage-1 step count deciding, at the grid's largest budget; against
    the recipe the grid's runs were made beside."""
    from softfree_mm.analysis import carry_over as co
    rows = _committed()
    assert rr.shipped_fraction() == pytest.approx(0.1) and rr.shipped_budget(rows) == 30
    budget = rr.default_budget(rows, co.decision(ROOT))
    assert budget == (75 if co.decision(ROOT) == 'steps' else 30)
    result = rr.choose(rows, budget, {bb: 'transfer' for bb in {r['backbone'] for r in rows}})
    verdicts = rr.layout_verdicts(result)
    assert set(verdicts) == set(ld.LAYOUT_DEFAULTS) == set(ld.MEASURED_ON)
    assert verdicts == ld.LAYOUT_DEFAULTS


def test_a_grid_without_the_shipped_budget_is_an_error_not_another_budget():
    rows = [r for r in _committed() if r['iters'] != '30']
    with pytest.raises(ValueError, match=r'ran no warm start of 30 iterations .*it ran \[75\]'):
        rr.shipped_budget(rows)


def _rows(diffs, recipe):
    """Grid rows of backbone 'pvt' at 30 iterations: (kernel, seed) -> top-1 50 + diff under ``recipe``."""
    return [dict(backbone='pvt', kernel=k, seed=str(s), start='transfer', iters='30', recipe=recipe,
                 groups='kernel+qkv', status='ok', top1=str(50.0 + d)) for (k, s), d in diffs.items()]


def test_one_seed_that_carries_the_gain_vetoes_it_although_no_kernel_does():
    """Seed means +2.0, +2.1, +2.2, +0.8, every kernel alike: over the 4 seeds +1.775, sd 0.655, half-width
    3.182 x 0.655 / 2 = 1.04, [+0.73, +2.82]; any kernel left out changes nothing; without seed 0 (+2.1, +2.2,
    +0.8): +1.70, sd 0.781, half-width 4.303 x 0.781 / sqrt(3) = 1.94, [-0.24, +3.64] holds zero: not taken."""
    gain = {0: 2.0, 1: 2.1, 2: 2.2, 3: 0.8}
    diffs = {(k, s): d for k in 'abc' for s, d in gain.items()}
    v = rr.verdict({key: 50.0 + d for key, d in diffs.items()}, {key: 50.0 for key in diffs})
    assert (round(v['interval'].low, 2), round(v['interval'].high, 2)) == (0.73, 2.82)
    assert all(i.low > 0 for i in v['drop_kernel'].values())
    dropped = v['drop_seed'][0]
    assert (round(dropped.mean, 3), round(dropped.low, 2), round(dropped.high, 2)) == (1.7, -0.24, 3.64)
    assert not v['replaces']
    rows = _rows({key: 0.0 for key in diffs}, 'transfer') + _rows(diffs, 'transfer-half')
    assert rr.choose(rows, 30, {'pvt': 'transfer'})['pvt']['chosen'] == 'transfer'


def test_of_several_recipes_that_replace_the_default_the_largest_mean_is_taken():
    """`transfer-final` gains about +1 in every seed and kernel, `transfer-half` about +3: both replace `transfer`;
    the rule takes `transfer-half`, whatever order the recipes come in."""
    small = {(k, s): 1.0 + 0.1 * s + 0.05 * i for i, k in enumerate('abc') for s in range(5)}
    large = {key: d + 2.0 for key, d in small.items()}
    rows = (_rows({key: 0.0 for key in small}, 'transfer') + _rows(small, 'transfer-final')
            + _rows(large, 'transfer-half'))
    for order in (rows, rows[::-1]):
        res = rr.choose(order, 30, {'pvt': 'transfer'})['pvt']
        assert res['verdicts']['transfer-final']['replaces'] and res['verdicts']['transfer-half']['replaces']
        assert res['chosen'] == 'transfer-half'


@pytest.mark.parametrize('family', ['SoftFreeSwin', 'SoftFreeCSWin'])
def test_windows_in_any_of_stages_1_to_3_are_windows_and_the_last_stage_alone_does_not_count(family):
    """Global attention in stages 1-3 with the last stage windowed (the SOFT and InLine set-ups; at 224 Swin's last
    7 x 7 grid is one window, CSWin's last stage is global anyway) is token attention; a window in any of stages 1-3
    is the windows' class, global everywhere is token attention."""
    cases = [((True, True, True, False), 'tokens'), ((True, True, True, True), 'tokens'),
             ((True, True, False, False), 'windows'), ((False, True, True, True), 'windows'),
             ((False, False, False, False), 'windows'), (True, 'tokens'), (False, 'windows')]
    got = [(g, ld.layout_class(dict(type=family, global_window=g))) for g, _ in cases]
    assert got == cases


def test_swin_per_block_global_window_counts_every_block_of_stages_1_to_3():
    """Swin takes global_window per block as well (a stage's entry one value per block): a window in one block of
    stages 1-3 is the windows' class (a non-empty tuple of False is not a global stage)."""
    cases = [(((True, True), (True, True), (True, ) * 6, (False, False)), 'tokens'),
             (((True, True), (True, False), True, True), 'windows'),
             (((False, False), (False, False), (False, ) * 6, False), 'windows'),
             ((True, True, (True, True, True, True, True, False), True), 'windows')]
    got = [(g, ld.layout_class(dict(type='SoftFreeSwin', global_window=g))) for g, _ in cases]
    assert got == cases
