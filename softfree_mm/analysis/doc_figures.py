"""Every figure the README, docs/warm_start.md and docs/study.md quote from a grid, made from the committed CSVs.

Each generated section sits between its two marker lines on its page; :data:`SECTIONS` lists them all, with the
function that makes each from the CSVs under ``docs/results/``. ``tools/analysis/doc_figures.py`` writes them (after
a grid's CSVs change); ``--check`` and the tests regenerate them and diff them against the pages. Prose outside the
markers says what the figures mean and quotes none.
"""
import json
import os.path as osp
from typing import Callable, Dict, List, NamedTuple, Optional

from .committed_csv import RESULTS, read_csv  # noqa: F401  (the committed CSVs, read as numbers)


class Section(NamedTuple):
    page: str  # relative to the repository root
    begin: str
    end: str
    make: Callable[[str], str]  # root -> the section, markers included
    heading: str  # where a page without the markers gets it appended


# ------------------------------------------------------------------ the sections the grid tools already write
def warm_start_grid(root: str) -> str:
    """docs/warm_start.md's tables of the warm-start grid (tools/analysis/warm_start_grid.py)."""
    from . import warm_start_report as wr
    from .warm_start_rows import summarise
    out = osp.join(root, RESULTS, 'warm_start')
    rows = read_csv(osp.join(out, 'classifiers.csv'))
    for r in rows:
        r['groups'] = r.get('groups') or ''
    detectors = read_csv(osp.join(out, 'detectors.csv'))
    with open(osp.join(out, 'groups.json')) as f:
        groups = json.load(f)
    result = dict(rows=rows, detectors=detectors)
    table = wr.compute_line(result) + '\n\n' + wr.markdown(summarise(rows), detectors, groups)
    made = [osp.join(out, n) for n in ('accuracy.png', 'recipes.png', 'transfer_curves.png')
            if osp.isfile(osp.join(out, n))]
    return wr.docs_section(table, 'results/warm_start', made)


def recipe_rule(root: str) -> str:
    """docs/warm_start.md's verdicts of the recipe rule, version 2 (tools/analysis/recipe_rule.py)."""
    from . import recipe_rule as rr
    rows = read_csv(osp.join(root, RESULTS, 'warm_start', 'classifiers.csv'))
    rows = [{k: ('' if v is None else str(v)) for k, v in r.items()} for r in rows]
    from . import carry_over as co
    backbones = list(dict.fromkeys(r['backbone'] for r in rows if r.get('backbone')))
    return rr.section(rows, {bb: 'transfer' for bb in backbones}, co.decision(root))


def task_study(root: str) -> str:
    """docs/study.md's detection and segmentation tables (tools/analysis/task_study.py)."""
    from . import task_curves as tc
    from . import task_study as ts
    from . import task_study_report as tsr
    rows = ts.read_rows(osp.join(root, RESULTS, 'task_study', 'runs.csv'))
    summary = tsr.summarise(rows)
    curves = [c for recs in [[dict(zip(tc.IDENTITY, k), **r) for r in v] for k, v in
                             tc.read_curves(osp.join(root, RESULTS, 'task_study', 'curves.csv')).items()]
              for c in recs]
    return tsr.docs_section(summary, 'results/task_study', tc.seg_profiles(rows, curves, tsr.FLOOR_MACC))


def patch_oracle(root: str) -> str:
    """docs/study.md's table of the patch-majority oracle on the demo scenes (tools/analysis/patch_oracle.py)."""
    rows = read_csv(osp.join(root, RESULTS, 'task_study', 'patch_oracle.csv'))
    lines = ['| patch (px) | mIoU % | aAcc % | mAcc % | images |', '|---|---|---|---|---|']
    lines += [f"| {r['patch']} | {r['mIoU']:.1f} | {r['aAcc']:.1f} | {r['mAcc']:.1f} | {r['images']} |" for r in rows]
    return _wrap(PATCH_ORACLE, lines)


def task_layer_stats(root: str) -> str:
    """docs/study.md's per-layer measurements of the task study's classifiers and segmentors
    (tools/analysis/task_layer_stats.py)."""
    from . import task_layer_stats as tl
    path = osp.join(root, RESULTS, 'task_study', 'layer_stats.csv')
    rows = read_csv(path) if osp.isfile(path) else []
    return _wrap(TASK_LAYER_STATS, tl.section_lines(rows))


def cost_headline(root: str) -> str:
    """The README's cost headline (tools/benchmark.py backbone --layouts --readme)."""
    from .benchmark import cost, cost_report
    return cost_report.headline(cost.read_rows(osp.join(root, RESULTS, 'cost', 'cost_cpu.csv')))


# ------------------------------------------------------------------ the sections this module writes
def _markers(name: str, source: str):
    return (f'<!-- {name}: made by tools/analysis/doc_figures.py from {source}, do not edit by hand -->',
            f'<!-- {name}: end -->')


STUDY_TABLES = _markers('kernel study tables', 'docs/results/study/summary.csv')
STUDY_FINDINGS = _markers('kernel study findings', 'docs/results/study/runs.csv')
STUDY_NORMS = _markers('kernel study norms', 'docs/results/study/norm_curves.csv')
WARM_FINDINGS = _markers('warm-start findings', 'docs/results/warm_start/')
WARM_COST = _markers('stage-1 cost', 'docs/results/warm_start/cost_cpu.csv')
CARRY_OVER = _markers('carry-over test', 'docs/results/carry_over/ and docs/results/warm_start/')
README_STUDIES = _markers('studies headline', 'docs/results/')
PATCH_ORACLE = _markers('patch oracle', 'docs/results/task_study/patch_oracle.csv')
TASK_LAYER_STATS = _markers('task study layer stats', 'docs/results/task_study/layer_stats.csv')


def _wrap(markers, lines: List[str]) -> str:
    return '\n'.join([markers[0], '', *[ln for ln in lines], '', markers[1]]).replace('\n\n\n', '\n\n')


def study_tables(root: str) -> str:
    from . import study as st
    summary = read_csv(osp.join(root, RESULTS, 'study', 'summary.csv'))
    for e in summary:
        e['error'] = e.get('error') or ''
    table = st.markdown(summary, {c: st.DIGITS_VAL_IMAGES for c in st.TITLES}, st.TITLES)
    return _wrap(STUDY_TABLES, table.rstrip().splitlines())


def study_findings(root: str) -> str:
    from . import findings as fd
    return _wrap(STUDY_FINDINGS, fd.study_lines(read_csv(osp.join(root, RESULTS, 'study', 'runs.csv'))))


def study_norms(root: str) -> str:
    from . import findings as fd
    return _wrap(STUDY_NORMS, fd.norm_lines(read_csv(osp.join(root, RESULTS, 'study', 'norm_curves.csv'))))


def warm_findings(root: str) -> str:
    from . import findings as fd
    out = osp.join(root, RESULTS, 'warm_start')
    rows = read_csv(osp.join(out, 'classifiers.csv'))
    lines = fd.warm_start_lines(rows) + fd.unbounded_lines(rows) + fd.recipe_lines(rows)
    lines += fd.detector_lines(read_csv(osp.join(out, 'detectors.csv')))
    return _wrap(WARM_FINDINGS, lines)


def carry_over(root: str) -> str:
    from . import carry_over as co
    return _wrap(CARRY_OVER, co.lines(root))


def task_route(root: str) -> str:
    from . import task_route_rule as trr
    return trr.section(root)


def warm_cost(root: str) -> str:
    from . import findings as fd
    return _wrap(WARM_COST, fd.cost_lines(read_csv(osp.join(root, RESULTS, 'warm_start', 'cost_cpu.csv'))))


def readme_studies(root: str) -> str:
    """The README's answer at a glance (analysis/glance.py) and its line on the warm start."""
    import textwrap

    from . import findings as fd
    from . import glance
    from . import recipe_rule as rr
    grid = read_csv(osp.join(root, RESULTS, 'warm_start', 'classifiers.csv'))
    text = [{k: ('' if v is None else str(v)) for k, v in r.items()} for r in grid]
    defaults = {bb: 'transfer' for bb in dict.fromkeys(r['backbone'] for r in grid)}
    rules = {b: rr.choose(text, b, defaults) for b in rr.budgets(text)}
    study, task = glance.inputs(root)
    head = ('- **Is softmax needed?** From scratch minus softmax, by seed: mean [95 % interval] (n), bold if it '
            'excludes 0; all: [forest plot](docs/results/glance/forest.png), [docs/study.md](docs/study.md).')
    from . import carry_over as co
    warm = fd.readme_warm_start_line(grid, rules, rr.default_budget(text, co.decision(root)))
    lines = [textwrap.fill(ln, 116, subsequent_indent='  ', break_long_words=False, break_on_hyphens=False)
             for ln in (head, warm)]  # as the README's other bullets
    return '\n'.join([README_STUDIES[0], lines[0], '', *glance.table_lines(study, task), '', lines[1],
                      README_STUDIES[1]])


def _sections() -> List[Section]:
    from . import recipe_rule as rr
    from . import task_route_rule as trr
    from . import task_study_report as tsr
    from . import warm_start_report as wr
    from .benchmark import cost_report as cr
    return [
        Section('README.md', cr.HEADLINE_BEGIN, cr.HEADLINE_END, cost_headline, 'Headline figures'),
        Section('docs/warm_start.md', rr.BEGIN, rr.END, recipe_rule, 'The recipe rule, version 2'),
        Section('docs/warm_start.md', wr.BEGIN, wr.END, warm_start_grid, 'The evidence at small scale'),
        Section('docs/study.md', tsr.BEGIN, tsr.END, task_study, 'Detection and segmentation'),
        Section('docs/study.md', *TASK_LAYER_STATS, task_layer_stats,
                'Why x^3 / sqrt(N) collapses in segmentation'),
        Section('docs/study.md', *PATCH_ORACLE, patch_oracle, "XCiT's weak segmentation"),
        Section('README.md', *README_STUDIES, readme_studies, 'Headline figures'),
        Section('docs/warm_start.md', *WARM_FINDINGS, warm_findings, 'What holds'),
        Section('docs/warm_start.md', *WARM_COST, warm_cost, 'What stage 1 costs'),
        Section('docs/warm_start.md', *CARRY_OVER, carry_over, 'What carries from digits to ImageNet'),
        Section('docs/warm_start.md', trr.BEGIN, trr.END, task_route, 'The task route at small scale'),
        Section('docs/study.md', *STUDY_TABLES, study_tables, 'Accuracy'),
        Section('docs/study.md', *STUDY_NORMS, study_norms, 'The norms during training'),
        Section('docs/study.md', *STUDY_FINDINGS, study_findings, 'What holds at this scale'),
    ]


def current(root: str, s: Section) -> Optional[str]:
    """The section as the page holds it now (None when the page has no such markers)."""
    with open(osp.join(root, s.page)) as f:
        text = f.read()
    if s.begin not in text or s.end not in text:
        return None
    return text[text.index(s.begin):text.index(s.end) + len(s.end)]


def stale(root: str) -> List[str]:
    """'page: first marker' of each section whose page differs from what the CSVs make, and the forest plot's data
    (analysis/glance.py) where it differs."""
    from . import glance
    out = [f'{s.page}: {s.begin}' for s in _sections() if current(root, s) != s.make(root)]
    return out + (['/'.join(glance.FOREST) + ': plot data'] if glance.forest_stale(root) else [])


def write(root: str) -> List[str]:
    """Write every section into its page, and the forest plot with its data; returns the pages changed."""
    from . import glance
    from .docs_section import write_section
    changed = []
    if glance.forest_stale(root):
        glance.write_forest(root)
        changed.append('/'.join(glance.FOREST))
    for s in _sections():
        made = s.make(root)
        if current(root, s) != made:
            write_section(osp.join(root, s.page), made, s.begin, s.end, s.heading)
            changed.append(s.page)
    return sorted(set(changed))
