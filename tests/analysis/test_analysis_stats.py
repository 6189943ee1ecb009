"""softfree_mm.analysis.stats (means, spreads, paired t-intervals with their unit) and the warm-start recipe rule,
version 2 (softfree_mm.analysis.recipe_rule), by hand on small tables, and the rule's verdict on the committed grid."""
import csv
import math
import os.path as osp

import pytest

from softfree_mm.analysis import recipe_rule as rr
from softfree_mm.analysis.stats import differences, interval, mean_std, paired, t_quantile, unit_means

from tests.helpers import ROOT


def test_mean_and_sample_std_by_hand_and_nothing_made_up_at_n_1():
    assert mean_std([1.0, 2.0, 6.0]) == (3.0, math.sqrt(7.0), 3)  # ((-2)^2 + (-1)^2 + 3^2) / 2 = 7
    assert mean_std([None, 4.0]) == (4.0, None, 1)  # one value: no spread, not 0
    assert mean_std([]) == (None, None, 0)


def test_t_quantiles_are_the_tables():
    for dof, t in ((1, 12.706), (2, 4.303), (4, 2.776), (24, 2.064)):
        assert t_quantile(dof) == pytest.approx(t, abs=5e-4)
    with pytest.raises(ValueError, match='degrees of freedom must be >= 1, got 0'):
        t_quantile(0)


def test_a_row_between_one_std_and_the_interval_holds_zero():
    """-1, -2, -3: |mean| 2 is beyond one standard deviation (1) but the 95 % interval, +-4.303 / sqrt(3), holds 0:
    "within the spread" is the interval's verdict, not the standard deviation's."""
    i = interval([-1.0, -2.0, -3.0], 'seeds')
    m, s, n = mean_std([-1.0, -2.0, -3.0])
    assert abs(m) > s
    assert i.half == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
    assert i.holds_zero and i.low < 0 < i.high
    assert i.text() == '-2.00 [-4.48, +0.48] (95 %, n = 3 seeds)'
    assert not interval([-1.0, -2.0, -3.0, -2.5, -1.5], 'seeds').holds_zero  # n = 5: [-2.98, -1.02]
    assert interval([1.0], 'seeds').holds_zero is None and interval([1.0], 'seeds').text() == \
        '+1.00 (n = 1 seeds: no interval)'


def test_paired_differences_over_the_keys_both_hold_and_by_unit():
    a = {('x', 0): 5.0, ('x', 1): 7.0, ('y', 0): 1.0, ('y', 1): None, ('z', 0): 2.0}
    b = {('x', 0): 4.0, ('x', 1): 4.0, ('y', 0): 2.0, ('y', 1): 3.0}
    assert differences(a, b) == {('x', 0): 1.0, ('x', 1): 3.0, ('y', 0): -1.0}
    assert unit_means(differences(a, b), lambda k: k[1]) == {0: 0.0, 1: 3.0}
    by_pair = paired(a, b, 'pairs')
    by_seed = paired(a, b, 'seeds', unit_of=lambda k: k[1])
    assert (by_pair.n, by_pair.mean) == (3, 1.0)
    assert (by_seed.n, by_seed.mean, by_seed.unit) == (2, 1.5, 'seeds')


def _grid(diffs):
    """(kernel, seed) -> candidate and base top-1 with the given differences."""
    base = {key: 50.0 for key in diffs}
    return {key: 50.0 + d for key, d in diffs.items()}, base


def test_the_seed_is_the_unit_pairs_that_share_a_seed_are_not_independent():
    """Three kernels move together within a seed: as 9 pairs the interval excludes zero, over 3 seeds it does not."""
    diffs = {(k, s): d + 0.01 * i for i, k in enumerate('abc') for s, d in enumerate((2.0, 1.5, -0.5))}
    cand, base = _grid(diffs)
    assert not paired(cand, base, 'pairs').holds_zero  # the v1 unit would take it
    v = rr.verdict(cand, base)
    assert v['interval'].n == 3 and v['interval'].holds_zero and not v['replaces']


def test_a_verdict_one_kernel_carries_does_not_replace_the_default():
    # kernel a gains 3 points in every seed, b and c move around zero: above zero over the seeds, but not without a
    diffs = {}
    for s, m in enumerate((0.5, -0.3, 0.2, -0.1, 0.4)):
        diffs.update({('a', s): 3.0 + 0.1 * s, ('b', s): m, ('c', s): m + 0.05})
    cand, base = _grid(diffs)
    v = rr.verdict(cand, base)
    assert v['interval'].low > 0
    assert v['drop_kernel']['a'].holds_zero
    assert not v['replaces']


def test_a_robust_gain_replaces_and_one_seed_can_veto():
    diffs = {(k, s): 1.0 + 0.1 * s + 0.05 * i for i, k in enumerate('abc') for s in range(5)}
    cand, base = _grid(diffs)
    assert rr.verdict(cand, base)['replaces']
    # one seed far below: the interval over all seeds may still lie above zero, but not without seed 0
    diffs.update({(k, 4): -6.0 for k in 'abc'})
    v = rr.verdict(*_grid(diffs))
    assert not v['replaces']


def test_version_2_on_the_committed_recipes_grid():
    """The committed grid as it is, from the default its runs were made beside (`transfer`): the token layout's
    transfer-final gains +0.97 top-1 over 5 seeds, a 95 % interval [-0.01, +1.94] that holds zero (version 1, over
    25 (kernel, seed) pairs: [+0.20, +1.74]); in XCiT nothing gains; version 2 keeps `transfer` for both."""
    with open(osp.join(ROOT, 'docs', 'results', 'warm_start', 'classifiers.csv'), newline='') as f:
        rows = list(csv.DictReader(f))
    res = rr.choose(rows, 75, {'pvt': 'transfer', 'xcit': 'transfer'})
    final = res['pvt']['verdicts']['transfer-final']
    assert final['interval'].n == 5 and final['interval'].mean == pytest.approx(0.97, abs=0.005)
    assert final['interval'].half == pytest.approx(0.98, abs=0.01) and final['interval'].holds_zero
    assert [k for k, i in final['per_kernel'].items() if not i.holds_zero] == ['poly:degree=3']
    assert (res['pvt']['chosen'], res['xcit']['chosen']) == ('transfer', 'transfer')
    text = '\n'.join(rr.lines(res))
    assert '`transfer-final` against `transfer` at 75 iterations: +0.97 [-0.01, +1.94] (95 %, n = 5 seeds)' in text


def test_the_docs_verdict_is_what_the_committed_grid_makes_and_the_tool_says_it():
    """docs/warm_start.md between the v2 markers is the rule's verdict on docs/results/warm_start/classifiers.csv
    (a changed row or a hand edit fails here); tools/analysis/recipe_rule.py prints it and refuses a missing file."""
    import subprocess
    import sys
    path = osp.join(ROOT, 'docs', 'results', 'warm_start', 'classifiers.csv')
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    from softfree_mm.analysis import carry_over as co
    want = rr.section(rows, {bb: 'transfer' for bb in dict.fromkeys(r['backbone'] for r in rows)}, co.decision(ROOT))
    page = open(osp.join(ROOT, 'docs', 'warm_start.md')).read()
    assert page[page.index(rr.BEGIN):page.index(rr.END) + len(rr.END)] == want
    tool = osp.join(ROOT, 'tools', 'analysis', 'recipe_rule.py')
    proc = subprocess.run([sys.executable, tool], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and "the rule (version 2) keeps `transfer`" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, tool, '--csv', 'nope.csv'], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == 'error: --csv nope.csv: no such file'


def test_a_backbone_without_recipe_rows_is_said_to_be_unjudged_not_kept():
    """A grid backbone with from-scratch rows only (the windowed Swin before its recipes ran): its line and the
    layout table say nothing was judged, instead of a verdict; one with recipe rows gets its verdict."""
    rows = [dict(backbone='swin', kernel='relu', seed=str(s), start='scratch', iters='300', top1='60', status='ok',
                 recipe='', groups='') for s in range(3)]
    rows += [dict(backbone='pvt', kernel='relu', seed=str(s), start='transfer', iters='75', top1=str(60 + s),
                  status='ok', recipe=rec, groups='kernel+qkv')
             for s in range(3) for rec in ('transfer', 'transfer-half')]
    res = rr.choose(rows, 75, {'pvt': 'transfer', 'swin': 'transfer'})
    text = rr.lines(res, rr.NAMES)
    assert text[-1] == ('- the tiny Swin, 4x4 windows, shifted (windowed token attention): no recipe against '
                        '`transfer` in this grid yet: nothing to judge.')
    assert any('`transfer-half` against `transfer`' in t for t in text)
    table = rr.layout_table({75: res}, 30, 300)
    assert table[0].endswith('| version 2 at 75 (25 %) |'), table[0]
    swin = next(t for t in table if t.startswith('| Swin-T'))
    assert 'not measured yet' in swin and swin.endswith('| none |'), swin
    assert next(t for t in table if t.startswith('| PVTv2-b2 without')).endswith('| `transfer` |')
