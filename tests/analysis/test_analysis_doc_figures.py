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
    ('study/runs.csv', dict(config='study_xcit_t12_digits', kernel='poly:degree=3,scale=1.0', seed='1'), 'top1_final',
     '79.0',
     {'README.md: <!-- studies headline', 'docs/study.md: <!-- kernel study findings'}),
    ('warm_start/classifiers.csv', dict(backbone='pvt', kernel='linear', seed='3', start='transfer', iters='75',
                                        recipe='transfer-final'), 'top1', '90.0',
     {'docs/warm_start.md: <!-- recipe rule v2', 'docs/warm_start.md: <!-- warm-start findings',
      'docs/warm_start.md: <!-- warm_start_grid'}),
    ('task_study/runs.csv', dict(layout='pvt', task='seg', kernel='linear', start='scratch', seed='2'), 'mIoU', '1.0',
     {'docs/study.md: <!-- task_study'}),
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


def test_prose_outside_the_markers_quotes_no_grid_figure():
    """Outside the generated sections and code blocks, no measured figure: no '±', no signed decimal, no decimal
    followed by %, points, mIoU or mAP (the demo's own line in the README is the demo's, not a grid's)."""
    figure = re.compile(r'±|(?<![\w.])[+-]\d+\.\d|\b\d+\.\d+\s?(%|points?\b|mIoU|mAP)')
    found = []
    for page in PAGES:
        with open(osp.join(ROOT, page)) as f:
            text = f.read()
        for s in df._sections():
            if s.page == page:
                text = text[:text.index(s.begin)] + text[text.index(s.end) + len(s.end):]
        text = re.sub(r'```.*?```', '', text, flags=re.S)
        found += [f'{page}: {ln}' for ln in text.splitlines()
                  if figure.search(ln) and not ln.startswith('- **`make demo`**')]
    assert found == []


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
    per kernel, the mean over seeds of transfer-75 minus scratch-300; 'keeps' where the rule keeps the default,
    'takes' where it takes another."""
    def row(bb, kernel, seed, start, iters, top1, recipe=''):
        return dict(backbone=bb, kernel=kernel, seed=str(seed), start=start, iters=str(iters), top1=str(top1),
                    status='ok', recipe=recipe, groups='kernel+qkv' if start == 'transfer' else '')
    grid = []
    for s in range(3):
        grid += [row('pvt', 'linear', s, 'scratch', 300, 60 + s), row('pvt', 'linear', s, 'transfer', 75, 62 + s,
                                                                        'transfer')]
    line = fd.readme_lines([], grid, [], {'pvt': dict(chosen='transfer', default='transfer')})[-1]
    assert 'PVTv2-b0 without spatial reduction: transfer + fine-tune minus scratch, per kernel +2.0 to +2.0; the ' \
           'recipe rule (version 2) keeps `transfer`' in line and 'Swin' not in line
    for s in range(3):  # two kernels on the windowed backbone: +1 and -3 on average
        grid += [row('swin', 'relu', s, 'scratch', 300, 50), row('swin', 'relu', s, 'transfer', 75, 50 + s, 'transfer'),
                 row('swin', 'linear', s, 'scratch', 300, 40 + s), row('swin', 'linear', s, 'transfer', 75, 37 + s,
                                                                       'transfer')]
    line = fd.readme_lines([], grid, [], {'pvt': dict(chosen='transfer', default='transfer'),
                                          'swin': dict(chosen='transfer-final', default='transfer')})[-1]
    assert 'tiny Swin: transfer + fine-tune minus scratch, per kernel -3.0 to +1.0; the recipe rule (version 2) ' \
           'takes `transfer-final`' in line, line
