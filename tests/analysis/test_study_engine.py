"""The one study engine (softfree_mm/analysis/study_engine.py): each of the three studies, as its tool runs it with
--report-only through the engine on the committed outputs (their rows kept, no work dir), writes the committed CSVs,
tables and docs page again byte for byte, the data each plot is drawn from included (the CSVs named beside each
plot below); the engine's own rules: a report leaves out the runs not finished, the options are checked at the edge,
a kernel is parsed once."""
import filecmp
import os
import os.path as osp
import shutil

import pytest

from softfree_mm.analysis import study_engine as engine
from softfree_mm.attention import Kernel
from softfree_mm.engine.errors import UsageError
from tests.helpers import ROOT, load_tool

RESULTS = osp.join(ROOT, 'docs', 'results')
# each plot and the committed CSVs it is drawn from (compared byte for byte; the PNGs themselves are not: their bytes
# depend on the font and image libraries, not on the engine)
PLOT_DATA = {'study': {'accuracy.png': ('runs.csv', 'summary.csv'),
                       'norms_study_pvt_v2_b0_digits.png': ('norm_curves.csv', ),
                       'norms_study_xcit_t12_digits.png': ('norm_curves.csv', )},
             'task_study': {'task_study.png': ('runs.csv', 'summary.csv'),
                            'seg_curves.png': ('curves.csv', 'runs.csv')},
             'warm_start': {'accuracy.png': ('summary.csv', ), 'recipes.png': ('classifiers.csv', ),
                            'transfer_curves.png': ('transfer_curves.csv', )}}


def _same_as_committed(folder: str, out: str, skip=()):
    # versions.json names the libraries and the commit of the process that wrote it: this one's, not the committed
    committed = sorted(f for f in os.listdir(folder)
                       if not f.endswith('.png') and f not in skip and f != 'versions.json')
    assert committed, folder
    _, mismatch, errors = filecmp.cmpfiles(folder, out, committed, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    for png, data in PLOT_DATA[osp.basename(folder)].items():
        assert osp.isfile(osp.join(out, png)), png  # drawn again, from the data compared above
        assert set(data) <= set(committed)
    return committed


def _page(tmp_path, page: str, results: str):
    """A copy of docs/<page> whose results folder is ``results`` under it (the page's links then read the same)."""
    docs = tmp_path / 'docs'
    (docs / 'results').mkdir(parents=True)
    shutil.copy(osp.join(ROOT, 'docs', page), docs / page)
    return str(docs / page), str(docs / 'results' / results)


def test_the_kernel_study_reports_its_committed_outputs_again_byte_for_byte(tmp_path):
    out = str(tmp_path / 'study')
    assert load_tool('analysis/study').main(['--report-only', '--work-dir', str(tmp_path / 'none'), '--keep-from',
                                             osp.join(RESULTS, 'study'), '--out', out]) == 0
    _same_as_committed(osp.join(RESULTS, 'study'), out)


def test_the_task_study_reports_its_committed_outputs_and_section_again_byte_for_byte(tmp_path, capsys):
    page, out = _page(tmp_path, 'study.md', 'task_study')
    assert load_tool('analysis/task_study').main(
        ['--report-only', '--work-dir', str(tmp_path / 'none'), '--keep-from',
         osp.join(RESULTS, 'task_study', 'runs.csv'), '--out', out, '--docs', page]) == 0
    said = capsys.readouterr().out
    # runs declared (the task route's grid) but not run: said, and not in the outputs
    assert '[task-study] report only: ' in said and 'not run yet are left out of the outputs' in said
    _same_as_committed(osp.join(RESULTS, 'task_study'), out, skip=('patch_oracle.csv', 'layer_stats.csv'))
    assert filecmp.cmp(page, osp.join(ROOT, 'docs', 'study.md'), shallow=False)


def test_the_warm_start_grid_reports_its_committed_outputs_and_section_again_byte_for_byte(tmp_path):
    page, out = _page(tmp_path, 'warm_start.md', 'warm_start')
    committed = osp.join(RESULTS, 'warm_start')
    assert load_tool('analysis/warm_start_grid').main(
        ['--report-only', '--work-dir', str(tmp_path / 'none'), '--out', out, '--docs', page,
         '--seeds', '0', '1', '2', '3', '4', '--ablation-seeds', '0', '1', '2',
         '--det-from', osp.join(committed, 'detectors.csv'), '--keep-from', committed,
         '--recipes', 'transfer', 'transfer-blocks', 'transfer-final', 'transfer-half', 'transfer-attn',
         'transfer-newhead', '--backbones', 'xcit', 'pvt', 'swin']) == 0
    _same_as_committed(committed, out, skip=('cost_cpu.csv', ))
    assert filecmp.cmp(page, osp.join(ROOT, 'docs', 'warm_start.md'), shallow=False)


def _declaration(rows):
    seen = []
    decl = engine.Declaration(name='toy', axes=('kernel', 'seed'), metrics=('top1', ), pairing='seed',
                              rule='none', plan=lambda ctx: dict(rows=list(rows)),
                              write=lambda ctx, tables: seen.append(tables['rows']) or 'written')
    return decl, seen


def test_a_report_leaves_out_the_runs_not_finished_and_says_which(tmp_path):
    rows = [dict(kernel='linear', seed=0, status='ok'), dict(kernel='linear', seed=1, status='not run'),
            dict(kernel='relu', seed=0, status='failed')]
    said = []
    decl, seen = _declaration(rows)
    opts = engine.Options(work_dir=str(tmp_path / 'w'), out=str(tmp_path / 'o'), seeds=[0, 1], report_only=True)
    tables, written = engine.run(decl, opts, ROOT, echo=said.append)
    assert written == 'written' and seen == [[rows[0], rows[2]]] == [tables['rows']]
    assert said == ['[toy] report only: 2 of the 3 rows declared have finished; the 1 not run yet are left out of '
                    'the outputs (linear/1)']
    # a run (not a report) keeps every row: a 'not run' row there is the plan's to explain
    decl, seen = _declaration(rows)
    engine.run(decl, engine.Options(work_dir=str(tmp_path / 'w'), out=str(tmp_path / 'o')), ROOT, echo=said.append)
    assert seen == [rows]


def test_the_engine_crosses_the_declared_axes_and_trains_whole_pairing_units_first(tmp_path):
    """A declaration with ``one``: every point of the axes' cross once, the values from the options (configs from the
    study's own option), rows in the axes' order, runs with the pairing unit outermost, every point checked before
    anything runs, a kept point's row not run again."""
    calls = []

    def one(ctx, p):
        calls.append(('run', p['config'], str(p['kernel']), p['seed']))
        assert isinstance(p['kernel'], Kernel)  # the parsed kernel reaches the run
        return dict(status='ok', top1=float(p['seed']))

    decl = engine.Declaration(name='toy', axes=('config', 'kernel', 'seed'), metrics=('top1', ), pairing='seed',
                              rule='-', one=one, write=lambda ctx, tables: None)
    opts = engine.Options(work_dir=str(tmp_path / 'w'), out=str(tmp_path / 'o'), kernels=['softmax', 'linear'],
                          seeds=[1, 0], jobs=1, extra=dict(configs=['a', 'b']))
    tables, _ = engine.run(decl, opts, ROOT, echo=lambda m: None)
    names = [(r['config'], r['kernel'], r['seed']) for r in tables['rows']]
    assert names == [(c, k, s) for c in 'ab' for k in ('softmax', 'linear') for s in (1, 0)]
    assert [c[1:] for c in calls] == [(c, k, s) for s in (1, 0) for c in 'ab' for k in ('softmax', 'linear')]
    assert all(type(r['kernel']) is str for r in tables['rows'])  # a row holds the label
    # the study's kernel-study form: check on every point first (a refusal before anything runs), kept rows kept
    calls.clear()
    runner = engine.Runner(str(tmp_path / 'w'), 'tools', jobs=1, echo=lambda m: None)
    values = dict(kernel=[Kernel('linear')], seed=[0, 1, 2])

    def refuse(p):
        calls.append(('check', p['seed']))
        if p['seed'] == 2:
            raise UsageError('seed 2: another run')
    with pytest.raises(UsageError):
        engine.cross(runner, values, lambda p: one(None, dict(p, config='a')), 'seed', check=refuse)
    assert calls == [('check', 0), ('check', 1), ('check', 2)]
    calls.clear()
    rows = engine.cross(runner, values, lambda p: one(None, dict(p, config='a')), 'seed',
                        kept=lambda p: dict(kernel='linear', seed=1, status='ok', top1=9.0) if p['seed'] == 1 else None)
    assert [r['top1'] for r in rows] == [0.0, 9.0, 2.0] and [c[3] for c in calls] == [0, 2]
    # a value given twice (two runs of one folder at once); an axis the options give no values; a declaration with
    # both or neither of one and plan
    twice = engine.Options(work_dir=str(tmp_path / 'w'), out=str(tmp_path / 'o'), kernels=['linear', 'linear'],
                           extra=dict(configs=['a']))
    with pytest.raises(UsageError, match='--kernels: linear given twice'):
        engine.run(decl, twice, ROOT, echo=lambda m: None)
    bare = engine.Options(work_dir=str(tmp_path / 'w'), out=str(tmp_path / 'o'), kernels=['linear'])
    with pytest.raises(UsageError, match="axis 'config' has no values"):
        engine.run(decl, bare, ROOT, echo=lambda m: None)
    for both in (dict(), dict(one=one, plan=lambda ctx: {})):
        with pytest.raises(ValueError, match='one.*or plan'):
            engine.Declaration(name='x', axes=('seed', ), metrics=(), pairing='seed', rule='-',
                               write=lambda c, t: None, **both)


@pytest.mark.parametrize('bad, words', [(dict(seeds=[0, 0]), '--seeds 0 0: distinct ints >= 0'),
                                        (dict(seeds=[-1]), '--seeds -1'), (dict(seeds=[]), 'at least one'),
                                        (dict(jobs=0), '--jobs 0: an int >= 1'),
                                        (dict(threads=0), '--threads 0: an int >= 1'),
                                        (dict(kernels=['poly:degree']), "--kernels: kernel spec 'poly:degree'"),
                                        (dict(kernels=[':x=1']), "kernel ':x=1'"),
                                        (dict(kernels=[]), '--kernels: at least one')])
def test_bad_options_are_one_line_naming_the_value(bad, words):
    with pytest.raises(UsageError) as e:
        engine.Options(work_dir='w', out='o', **bad)
    assert words in str(e.value) and '\n' not in str(e.value)


def test_a_kernel_is_parsed_once_at_the_edge():
    opts = engine.Options(work_dir='w', out='o', kernels=['poly:degree=3,scale=1.0', 'linear'])
    k = opts.kernels[0]
    assert isinstance(k, Kernel) and k == 'poly:degree=3,scale=1.0' and k.cfg == dict(type='poly', degree=3, scale=1.0)
    assert Kernel(k) is k and opts.kernels[1].cfg == dict(type='linear')
    k.cfg['degree'] = 1  # a copy each time: a module that changes it changes nobody's
    assert k.cfg['degree'] == 3
    assert opts.kernels[1] in {'linear': 1} and str(k) == 'poly:degree=3,scale=1.0'


def test_the_contributing_guides_study_runs_through_the_engine(tmp_path):
    """docs/contributing.md's example study: its declaration through the engine (a report: nothing trains), its run
    rows 'not run' left out, and with one run finished (its folder's result) that run's row written."""
    import json
    import re
    page = open(osp.join(ROOT, 'docs', 'contributing.md')).read()
    code = re.search(r'## A study\n.*?```python\n(.*?)```', page, re.S).group(1)
    body, last = code.rstrip().rsplit('\n', 1)
    assert last.startswith('run(TWO, Options(') and len(code.splitlines()) <= 20
    scope = dict(ROOT=ROOT)
    exec(body, scope)
    opts = engine.Options(work_dir=str(tmp_path / 'w'), out=str(tmp_path / 'o'), kernels=['softmax', 'linear'],
                          seeds=[0, 1], report_only=True)
    done = tmp_path / 'w' / 'two' / 'linear' / 'seed1'
    done.mkdir(parents=True)
    (done / 'result.json').write_text(json.dumps(dict(status='ok', top1_final=71.5)))
    tables, _ = engine.run(scope['TWO'], opts, ROOT, echo=lambda m: None)
    assert tables['rows'] == [dict(kernel='linear', seed=1, status='ok', top1=71.5)]
    assert open(osp.join(opts.out, 'runs.csv')).read().splitlines() == ['kernel,seed,status,top1', 'linear,1,ok,71.5']
