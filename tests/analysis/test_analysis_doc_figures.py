"""The figures the README, docs/warm_start.md and docs/study.md quote from the grids: regenerated from the committed
CSVs and diffed against the pages; a changed CSV row changes its sections; prose outside the markers quotes none."""
import csv
import os.path as osp
import re
import shutil

import pytest

from softfree_mm.analysis import doc_figures as df
from softfree_mm.analysis import findings as fd

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PAGES = ('README.md', 'docs/warm_start.md', 'docs/study.md')
FOREST = 'docs/results/glance/forest.csv: plot data'  # the forest plot's data (analysis/glance.py)


def test_every_generated_section_is_what_the_committed_csvs_make():
    """`tools/analysis/doc_figures.py --check`: a hand edit between markers, or a CSV committed without its pages
    regenerated, fails here, naming the section."""
    assert {s.page for s in df._sections()} == set(PAGES)
    assert df.stale(ROOT) == []


def _copy(tmp_path):
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(osp.join(ROOT, page), tmp_path / page)
    shutil.copytree(osp.join(ROOT, 'docs', 'results'), tmp_path / 'docs' / 'results')
    return str(tmp_path)


def _edit(path, match, column, value):
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        rows, fields = list(reader), reader.fieldnames
    hit = next(r for r in rows if all(r[k] == v for k, v in match.items()))
    hit[column] = value
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


@pytest.mark.parametrize('csv_path, match, column, value, sections', [
    ('study/runs.csv', dict(config='study_xcit_t12_digits', kernel='poly:degree=3', seed='1'), 'top1_final',
     '79.0',
     {'README.md: <!-- studies headline', 'docs/study.md: <!-- kernel study findings', FOREST}),
    ('warm_start/classifiers.csv', dict(backbone='pvt', kernel='linear', seed='3', start='transfer', iters='75',
                                        recipe='transfer-final'), 'top1', '90.0',
     {'docs/warm_start.md: <!-- recipe rule v2', 'docs/warm_start.md: <!-- warm-start findings',
      'docs/warm_start.md: <!-- warm_start_grid'}),
    ('task_study/runs.csv', dict(layout='pvt', task='seg', kernel='linear', start='scratch', seed='2'), 'mIoU', '1.0',
     {'docs/study.md: <!-- task_study', 'README.md: <!-- studies headline', FOREST}),
    # a segmentor at the background-only floor: the README and the tables count the collapses
    ('task_study/runs.csv', dict(layout='pvt', task='seg', kernel='linear', start='scratch', seed='2'), 'mAcc', '5.0',
     {'README.md: <!-- studies headline', 'docs/study.md: <!-- task_study'}),
    # a diagnostic set-up's segmentor (pvt_n64, the collapse's direct test) is docs/study.md's, not the README's
    ('task_study/runs.csv', dict(layout='pvt_n64', task='seg', kernel='softmax', start='scratch', seed='2'), 'mAcc',
     '5.0', {'docs/study.md: <!-- task_study'}),
    ('warm_start/cost_cpu.csv', dict(config='transfer_swin_t_poly3.py', recipe='transfer'), 'ratio', '3.5',
     {'docs/warm_start.md: <!-- stage-1 cost'}),
])
def test_a_changed_csv_row_makes_its_sections_stale(tmp_path, csv_path, match, column, value, sections):
    root = _copy(tmp_path)
    assert df.stale(root) == []
    _edit(osp.join(root, 'docs', 'results', csv_path), match, column, value)
    stale = {s.split(' made by')[0].split(':', 2)[0] + ': ' + s.split(': ', 1)[1].split(':')[0] for s in df.stale(root)}
    assert stale == sections, stale
    df.write(root)
    assert df.stale(root) == []


WORDS = r'(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|fifty|hundred|thousand)'
COUNT = rf'(?:\d+|{WORDS})'
FIGURE = re.compile(
    r'±|(?<![\w.])[+-]\d+\.\d|\b\d+\.\d+\s?(%|points?\b|mIoU|mAP)'  # a spread, a signed decimal, a decimal score
    r'|\b10\^\d|\b10[⁰¹²³⁴⁵⁶⁷⁸⁹]|(?<![\w.])\d+(?:\.\d+)?e\+?\d+\b'  # a power of ten: 10^5, 10⁵, 1e5, 7.9e5
    # a count of outcomes, k of n (not a schedule's 30 of 300 epochs, nor a batch's place in an epoch)
    rf'|(?<!batch )\b{COUNT} of {COUNT}\b(?!\s+(?:epochs|iterations|iters|blocks|layers|steps|images)\b)'
    rf'|\b{WORDS}\s+(?:points?|percent|times|-?fold)\b',  # a figure in words: two points, a hundred times
    re.I)


def prose_figures(text: str, page: str) -> list:
    """The lines of ``page``'s text, outside its generated sections, code blocks and inline code, that quote a
    figure."""
    for s in df._sections():
        if s.page == page and s.begin in text:
            text = text[:text.index(s.begin)] + text[text.index(s.end) + len(s.end):]
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    return [ln for ln in text.splitlines()
            if FIGURE.search(re.sub(r'`[^`]*`', '', ln)) and not ln.startswith('- **`make demo`**')]


def test_prose_outside_the_markers_quotes_no_grid_figure():
    """Outside the generated sections, code blocks and inline code, no measured figure: no '±', no signed decimal,
    no decimal followed by %, points, mIoU or mAP, no power of ten, no k-of-n count, no figure in words (the demo's
    own line in the README is the demo's, not a grid's)."""
    found = []
    for page in PAGES:
        with open(osp.join(ROOT, page)) as f:
            found += [f'{page}: {ln}' for ln in prose_figures(f.read(), page)]
    assert found == []


@pytest.mark.parametrize('line', [
    'the gain grows about 10^4-fold', 'a gain of 7.9e5 at the end', 'x^3 collapses in 4 of 5 seeds',
    'unstable from scratch (two of five seeds far below)', 'about a hundred times below', 'gains two points',
    '+0.97 [-0.01, +1.94]', '57.1 ± 27.0', 'reaches 64.6 %'])
def test_the_prose_check_catches_each_kind_of_figure(line):
    assert prose_figures(line, 'nowhere.md') == [line]


@pytest.mark.parametrize('line', [
    'ships 30 of 300 epochs', 'goes on at batch 1201 of 7330', 'a learning rate of `1e-3`', '2 of Swin-T\'s 12 blocks',
    'five seeds, the recipe users run'])
def test_the_prose_check_leaves_set_ups_alone(line):
    assert prose_figures(line, 'nowhere.md') == []


def test_the_engine_quotes_the_measured_stage1_cost():
    """STAGE1_STEP_COST (what tools/train.py's missing-start line projects) is the default recipe's ratio in the
    committed cost CSV, per backbone."""
    from softfree_mm.engine.layout_defaults import STAGE1_STEP_COST
    rows = df.read_csv(osp.join(ROOT, 'docs', 'results', 'warm_start', 'cost_cpu.csv'))
    assert fd.measured_cost(rows) == STAGE1_STEP_COST


def test_seed_paired_intervals_by_hand():
    """Differences +1, +2, +3 over three seeds: mean 2, half-width t(0.975, 2) x 1 / sqrt(3) = 2.484; 3 of 3 above.
    Differences -1, -2, -3: the interval [-4.48, +0.48] holds zero although |mean| is twice the standard
    deviation."""
    i, above = fd.seed_paired({0: 11.0, 1: 12.0, 2: 13.0}, {0: 10.0, 1: 10.0, 2: 10.0})
    assert (round(i.mean, 6), round(i.half, 3), i.n, above) == (2.0, 2.484, 3, 3)
    assert fd.cell(i) == '+2.0 [-0.5, +4.5]' and not fd.excludes_zero(i)
    i, above = fd.seed_paired({0: 9.0, 1: 8.0, 2: 7.0, 3: 5.0}, {0: 10.0, 1: 10.0, 2: 10.0})  # seed 3 unpaired
    assert (i.n, above, fd.cell(i)) == (3, 0, '-2.0 [-4.5, +0.5]')


def test_the_readme_warm_start_line_names_each_grid_backbone_with_rows_and_the_rules_verb():
    """By hand on a small grid: a backbone's part appears only with its rows (the windowed Swin's once it has them);
    'keeps' where the rule keeps the default, 'takes' where it takes another, at each budget, the shipped one named."""
    def row(bb, kernel, seed, start, iters, top1, recipe=''):
        return dict(backbone=bb, kernel=kernel, seed=str(seed), start=start, iters=str(iters), top1=str(top1),
                    status='ok', recipe=recipe, groups='kernel+qkv' if start == 'transfer' else '')
    grid = []
    for s in range(3):
        grid += [row('pvt', 'linear', s, 'scratch', 300, 60 + s), row('pvt', 'linear', s, 'transfer', 75, 62 + s,
                                                                        'transfer')]
    line = fd.readme_warm_start_line(grid, {75: {'pvt': dict(chosen='transfer', default='transfer')}}, 75)
    assert 'PVTv2-b0 without spatial reduction keeps `transfer` at 75 iterations (shipped).' in line and 'Swin' not in line
    for s in range(3):  # two kernels on the windowed backbone: +1 and -3 on average
        grid += [row('swin', 'relu', s, 'scratch', 300, 50), row('swin', 'relu', s, 'transfer', 75, 50 + s, 'transfer'),
                 row('swin', 'linear', s, 'scratch', 300, 40 + s), row('swin', 'linear', s, 'transfer', 75, 37 + s,
                                                                       'transfer')]
    rules = {30: {'pvt': dict(chosen='transfer', default='transfer'),
                  'swin': dict(chosen='transfer-final', default='transfer')},
             75: {'pvt': dict(chosen='transfer', default='transfer'), 'swin': dict(chosen='transfer', default='transfer')}}
    line = fd.readme_warm_start_line(grid, rules, 30)
    assert 'tiny Swin takes `transfer-final` at 30 iterations (shipped), keeps `transfer` at 75 iterations.' in line, line


def test_the_warm_start_target_is_decided_by_the_interval_never_the_mean():
    """+13.1 [-21.0, +47.2] has a mean far above the target but an interval that reaches below -1: undecided, not
    'yes' (issue 64); [+0.3, +4.2] shows it, [-69.4, -8.0] misses it, a single seed gives no verdict."""
    from softfree_mm.analysis.stats import Interval
    assert fd.target(Interval(13.1, 34.1, 5, 'seeds')) == 'undecided'
    assert fd.target(Interval(2.25, 1.95, 5, 'seeds')) == 'shown'
    assert fd.target(Interval(-0.95, 0.05, 5, 'seeds')) == 'shown'  # lower bound -1.0: within 1 point
    assert fd.target(Interval(-38.7, 30.7, 5, 'seeds')) == 'missed'
    assert fd.target(Interval(3.0, None, 1, 'seeds')) == 'no interval (n = 1)'


def test_a_start_with_seeds_at_chance_and_seeds_that_train_shows_the_median_and_the_count():
    """Scratch 65.5, 63.7, 11.8, 37.4, 68.0 (one seed at chance): the median 63.7 and '1 of 5 at chance', not
    49.3 ± 24.4; a start where no seed or every seed is at chance keeps its mean ± std."""
    from softfree_mm.analysis.warm_start_report import markdown
    from softfree_mm.analysis.warm_start_rows import summarise
    def row(s, start, top1):
        return dict(backbone='pvt', kernel='poly', seed=s, start=start, iters=300 if start == 'scratch' else 0,
                    transfer_iters=0, groups='', top1=top1, status='ok', source='grid')
    rows = [row(s, 'scratch', t) for s, t in enumerate((65.5, 63.7, 11.8, 37.4, 68.0))]
    rows += [row(s, 'swap', t) for s, t in enumerate((10.0, 11.0, 12.0, 10.0, 12.0))]
    table = markdown(summarise(rows), [], dict(chosen=['kernel', 'qkv']))
    assert '| poly | median 63.7, 1 of 5 at chance | 11.0 ± 1.0 (' in table, table
    lines = fd.unbounded_lines([dict(r, kernel='poly:degree=3', iters=str(r['iters'])) for r in rows],
                               backbones=('pvt', ), budgets=(0, ))
    assert any(ln.endswith('| 63.7 | 1 of 5 |') and 'scratch (300)' in ln for ln in lines), lines
    assert any(ln.endswith('| 11.0 | 5 of 5 |') and 'swap + fine-tune, 0' in ln for ln in lines), lines


def test_the_glance_table_bolds_only_intervals_that_exclude_zero_and_counts_collapses():
    """By hand: top-1 differences +1, +2, +3 over three seeds: +2.0 [-0.5, +4.5] (3), not bold; a kernel 5 points
    below softmax in every seed but one at chance: bold where its interval excludes zero, its classifiers at chance
    counted as k of n; no det / seg rows: empty cells."""
    from softfree_mm.analysis import glance
    runs = [dict(config='study_pvt_v2_b0_digits', kernel=k, seed=s, top1_final=t, status='ok')
            for k, ts in (('softmax', (60.0, 62.0, 64.0)), ('linear', (61.0, 64.0, 67.0)),
                          ('relu', (55.0, 57.0, 58.0)), ('poly:degree=3', (61.0, 10.0, 66.0)),
                          ('poly:degree=3,scale=1.0', (50.0, 51.0, 52.0)))
            for s, t in enumerate(ts)]
    seg = [dict(layout='pvt', task='seg', kernel=k, start='scratch', d_mIoU=1.0, d_mIoU_ci=(-1.0, 3.0), d_mIoU_n=3,
                by_seed={s: dict(mAcc=50.0) for s in range(3)}) for k in ('linear', 'relu', 'poly:degree=3')]
    table = glance.table_lines(runs, seg)
    assert len(table) == 5 and all('| x^3 unscaled' not in t for t in table)  # a kernel without task rows: not here
    assert '| PVTv2-b0 (tokens) | linear | +2.0 [-0.5, +4.5] (3) |  |  | +1.0 [-1.0, +3.0] (3) | none |' in table, table
    relu = next(t for t in table if '| ReLU / N |' in t)
    assert relu.split(' | ')[2].startswith('**-5.3 [') and relu.endswith('| none |'), relu
    poly = next(t for t in table if '| x^3 / sqrt(N) |' in t)
    assert poly.endswith('| classifiers at chance 1 of 3 |') and '**' not in poly, poly
    assert 'layout,kernel,start,metric,mean,low,high,n,excludes_zero\npvt,linear,scratch,top1,2.00,-0.48,4.48,3,False' \
        in glance.forest_csv(glance.forest_rows(runs, []))
