"""The study grids' runs by their identities (softfree_mm/analysis/grid_identity.py) and their committed outputs.

Guards: each grid's report over its committed results (nothing left to run, no work dir) writes the committed CSVs
byte for byte (the kernel study, the task study, the warm-start grid); a run folder whose run_identity.json is
another run's is refused in one line naming the key that differs (the kernel study and the runner the other two
grids share, a change in a teacher's run named through the run that starts from it), before anything trains, and
no run starts after a refusal; an equal one is kept without training; a new run's folder gets its run_identity.json
before it trains; a changed base config (the digits config's lr or data root) changes the identity; identities.csv
tells the rows runs with an identity made from the kept ones, and a kept row keeps its identity through --keep-from.
"""
import csv
import json
import os
import os.path as osp
import shutil

import pytest

from softfree_mm.attention import Kernel
from softfree_mm.analysis import grid_identity as gi
from softfree_mm.analysis import grid_runner
from softfree_mm.analysis import study as st
from softfree_mm.engine import run_identity as ri
from softfree_mm.engine.errors import UsageError

from tests.helpers import ROOT, load_tool, one_line_error

RESULTS = osp.join(ROOT, 'docs', 'results')
XCIT = osp.join(ROOT, 'configs', 'demo', 'study_xcit_t12_digits.py')


def _same_bytes(out, committed, names):
    for name in names:
        with open(osp.join(committed, name), 'rb') as a, open(osp.join(out, name), 'rb') as b:
            assert a.read() == b.read(), f'{name}: the report does not reproduce the committed file'
    # the identities of the rows that have one (the rows made before run identities have none)
    sidecar = osp.join(committed, gi.SIDECAR)
    if osp.exists(sidecar):
        with open(sidecar, 'rb') as a, open(osp.join(out, gi.SIDECAR), 'rb') as b:
            assert a.read() == b.read(), f'{gi.SIDECAR}: the report does not reproduce the committed file'
    else:
        assert not osp.exists(osp.join(out, gi.SIDECAR))
    # the libraries beside the CSVs, not in them (the committed folders record none: no earlier sets)
    from softfree_mm.engine.versions import FILE, versions
    with open(osp.join(out, FILE)) as f:
        assert json.load(f) == versions()


def _no_plots(monkeypatch):
    """The plots are drawn from the CSVs compared here; drawing them is left out (time)."""
    from softfree_mm.analysis import study_plots, task_curves, task_study_report, warm_start_report
    for module, name, value in ((study_plots, 'plot_accuracy', None), (study_plots, 'plot_norms', None),
                                (task_study_report, 'plot', None), (task_curves, 'plot_seg', None),
                                (warm_start_report, 'plots', []), (warm_start_report, 'recipes_plot', None)):
        monkeypatch.setattr(module, name, lambda *a, _v=value, **k: _v)


# ------------------------------------------------------------------------------------ the committed outputs
def test_the_kernel_studys_report_from_its_committed_runs_writes_its_committed_csvs(tmp_path, monkeypatch, capsys):
    _no_plots(monkeypatch)
    out = str(tmp_path / 'out')
    tool = load_tool('analysis/study')
    assert tool.main(['--report-only', '--keep-from', osp.join(RESULTS, 'study'), '--out', out,
                      '--work-dir', str(tmp_path / 'runs')]) == 0
    # (its table.md states the validation set's standard error only where the data set is here: not compared)
    _same_bytes(out, osp.join(RESULTS, 'study'), ('runs.csv', 'norm_curves.csv', 'summary.csv'))


def test_the_task_studys_report_from_its_committed_runs_writes_its_committed_csvs(tmp_path, monkeypatch, capsys):
    """The selection (pvt_n64, seeds 0-2) has nothing left to run; every other committed row is kept, in the committed
    order."""
    _no_plots(monkeypatch)
    out = str(tmp_path / 'out')
    tool = load_tool('analysis/task_study')
    assert tool.main(['--report-only', '--layouts', 'pvt_n64', '--out', out, '--work-dir', str(tmp_path / 'runs'),
                      '--keep-from', osp.join(RESULTS, 'task_study', 'runs.csv'), '--docs', '']) == 0
    _same_bytes(out, osp.join(RESULTS, 'task_study'), ('runs.csv', 'summary.csv', 'curves.csv', 'table.md'))


def test_the_warm_start_grids_report_from_its_committed_rows_writes_its_committed_csvs(tmp_path, monkeypatch, capsys):
    """The command of docs/warm_start.md's evidence section, --report-only, into another folder."""
    _no_plots(monkeypatch)
    out = str(tmp_path / 'out')
    committed = osp.join(RESULTS, 'warm_start')
    tool = load_tool('analysis/warm_start_grid')
    assert tool.main(['--report-only', '--out', out, '--docs', '', '--work-dir', str(tmp_path / 'runs'),
                      '--seeds', '0', '1', '2', '3', '4', '--ablation-seeds', '0', '1', '2',
                      '--det-from', osp.join(committed, 'detectors.csv'), '--recipes', 'transfer', 'transfer-blocks',
                      'transfer-final', 'transfer-half', 'transfer-attn', 'transfer-newhead',
                      '--backbones', 'xcit', 'pvt', 'swin', '--keep-from', committed]) == 0
    assert '1002 of 1002 runs kept' in capsys.readouterr().out
    _same_bytes(out, committed, ('classifiers.csv', 'detectors.csv', 'transfer_curves.csv', 'summary.csv',
                                 'table.md', 'groups.json'))


# ------------------------------------------------------------------------------------ what identifies a run
def test_a_changed_base_config_changes_the_identity_and_the_refusal_names_its_key(tmp_path):
    """The study's XCiT config inherits the digits config (configs/demo/cls_xcit_s12_poly3_demo.py): its lr or data
    root changed in place (same file names, same command) is another run."""
    shutil.copytree(osp.join(ROOT, 'configs'), tmp_path / 'configs')
    config = str(tmp_path / 'configs' / 'demo' / 'study_xcit_t12_digits.py')
    digits = tmp_path / 'configs' / 'demo' / 'cls_xcit_s12_poly3_demo.py'
    spec = dict(type='poly', degree=3)
    before = st.run_record(config, spec, 0)
    assert st.run_record(config, spec, 0) == before  # the same config: the same record
    wd = st.run_dir(str(tmp_path / 'runs'), config, spec, 0)
    gi.begin(wd, before)
    text = digits.read_text()
    digits.write_text(text.replace('optimizer=dict(lr=1e-3)', 'optimizer=dict(lr=2e-3)'))
    lr = st.run_record(config, spec, 0)
    assert ri.identity(lr) != ri.identity(before)
    assert [k for k, _, _ in ri.differences(before, lr)] == ['optim_wrapper.optimizer.lr']
    with pytest.raises(UsageError) as e:
        st.held(config, spec, 0, str(tmp_path / 'runs'))
    assert 'optim_wrapper.optimizer.lr: 0.001 -> 0.002' in str(e.value) and '\n' not in str(e.value)
    digits.write_text(text.replace("data_root = 'data/demo/imagenet'", "data_root = 'data/other/imagenet'"))
    root = st.run_record(config, spec, 0)
    assert ri.identity(root) != ri.identity(before)
    assert 'data_root' in [k for k, _, _ in ri.differences(before, root)]


def test_the_kernel_study_refuses_another_runs_folder_before_training_and_keeps_its_own(tmp_path, monkeypatch,
                                                                                        capsys):
    def boom(*a, **k):
        raise AssertionError('trained')
    monkeypatch.setattr(grid_runner, 'train_one', boom)
    work, spec = str(tmp_path / 'runs'), dict(type='linear')
    wd = st.run_dir(work, XCIT, spec, 0)
    gi.begin(wd, st.run_record(XCIT, spec, 0, ['optim_wrapper.optimizer.lr=0.002']))
    row = dict(config='study_xcit_t12_digits', kernel='linear', seed=0, status='ok', top1_final=50.0)
    with open(osp.join(wd, st.RESULT), 'w') as f:
        json.dump(row, f)
    with pytest.raises(UsageError) as e:  # before any run of the grid trains (seed 1's would come first)
        st.study([XCIT], [spec], [1, 0], grid_runner.Runner(work, 'tools', jobs=1), in_process=True)
    message = str(e.value)
    assert '\n' not in message and message.startswith(wd) and 'optim_wrapper.optimizer.lr: 0.002 -> 0.001' in message
    assert 'another --work-dir' in message
    assert not osp.exists(st.run_dir(work, XCIT, spec, 1))
    one_line_error(capsys, 'analysis/study', ['--report-only', '--work-dir', work, '--configs', XCIT, '--kernels',
                                              'linear', '--seeds', '0', '--out', str(tmp_path / 'out')],
                   'optim_wrapper.optimizer.lr: 0.002 -> 0.001')
    # the same run's folder (its run_identity.json equal): kept, not trained
    gi.begin(wd, st.run_record(XCIT, spec, 0))
    said = []
    runner = grid_runner.Runner(work, 'tools', jobs=1, echo=said.append)
    assert st.study([XCIT], [spec], [0], runner, in_process=True) == [row]
    assert said == ['[grid] study_xcit_t12_digits/linear/seed0: finished before (ok), not trained again']
    # a folder made before run identities (no run_identity.json): kept by its key, as before, and said so
    os.remove(osp.join(wd, ri.FILE))
    assert st.study([XCIT], [spec], [0], runner, in_process=True) == [row]
    assert any(m.startswith(f'[grid] {wd}: made before run identities') and 'kept by its key' in m for m in said)


def _runner(tmp_path, monkeypatch, trained):
    def fake_train(train_py, config, work_dir, options, in_process=False, log_path=None, env=None):
        trained.append((work_dir, ri.read(work_dir)))  # its identity is written before it trains
        return dict(returncode=1, seconds=0.0, cpu_s=0.0, error='fake: not trained')
    monkeypatch.setattr(grid_runner, 'train_one', fake_train)
    return grid_runner.Runner(str(tmp_path / 'runs'), osp.join(ROOT, 'tools'), jobs=1, echo=lambda m: None)


def test_the_grids_runner_writes_identities_keeps_equal_refuses_other_runs_and_their_starts(tmp_path, monkeypatch):
    """The runner of the warm-start grid and the task study: a new run's folder gets its run_identity.json before it
    trains and its result the identity; equal -> kept without training; another seed -> refused naming it, and no
    run starts after; a run that starts from a teacher whose folder now holds another teacher -> refused naming
    the teacher's key."""
    from softfree_mm.analysis.warm_start import transfer_config
    trained = []
    runner = _runner(tmp_path, monkeypatch, trained)
    text = grid_runner.kernel_config(XCIT, Kernel('softmax').cfg)
    teacher = runner.train('scratch/xcit/softmax/seed0', text, ['randomness.seed=0'])
    (wd, held), = trained
    assert wd == runner.folder('scratch/xcit/softmax/seed0') and held is not None
    assert teacher['status'] == 'failed' and teacher['identity'] == held['identity']
    with open(osp.join(wd, grid_runner.RESULT), 'w') as f:  # as if it had trained
        json.dump(dict(teacher, status='ok', checkpoint=osp.join(wd, 'iter_300.pth')), f)
    open(osp.join(wd, 'iter_300.pth'), 'wb').close()
    assert runner.train('scratch/xcit/softmax/seed0', text, ['randomness.seed=0'])['status'] == 'ok'
    assert len(trained) == 1  # kept, not trained
    # a run that starts from the teacher: its record holds the teacher's
    key = 'transfer/xcit/linear/kernel+qkv/75/seed0'
    stage1 = transfer_config(XCIT, Kernel('linear').cfg, 75, osp.join(wd, 'iter_300.pth'))
    runner.train(key, stage1, ['randomness.seed=0'])
    assert trained[-1][1]['record']['config']['model']['teacher']['init_cfg']['checkpoint'] == \
        ri.run_start(held['record'])
    with open(osp.join(runner.folder(key), grid_runner.RESULT), 'w') as f:
        json.dump(dict(status='ok', identity=trained[-1][1]['identity']), f)
    # the teacher's folder now holds the teacher of another seed: the run from it is another run
    gi.begin(wd, gi.record(text, ['randomness.seed=1'], name='scratch_xcit_softmax_seed0.py'))
    with pytest.raises(UsageError) as e:
        runner.train(key, stage1, ['randomness.seed=0'])
    assert "model.teacher.init_cfg.checkpoint -> the run's randomness.seed: 0 -> 1" in str(e.value)
    assert '\n' not in str(e.value)
    with pytest.raises(UsageError):  # after a refusal no run starts
        runner.train('scratch/xcit/linear/seed0', text, ['randomness.seed=0'])
    assert len(trained) == 2
    # the teacher itself, asked for with seed 0, is refused naming the seed
    runner.refused = None
    with pytest.raises(UsageError, match=r'differs: randomness.seed: 1 -> 0\); move that folder away or give the grid '
                                         r'another --work-dir$'):
        runner.train('scratch/xcit/softmax/seed0', text, ['randomness.seed=0'])


# ------------------------------------------------------------------------------------ kept rows and new runs
def test_identities_csv_names_the_rows_runs_with_an_identity_made_and_kept_rows_keep_theirs(tmp_path):
    from softfree_mm.analysis.study_keep import KeptStudy
    from softfree_mm.analysis.warm_start_keep import CLASSIFIER_KEY, Kept, row_key
    kept = tmp_path / 'study'
    shutil.copytree(osp.join(RESULTS, 'study'), kept)
    rows = [dict(config='study_xcit_t12_digits', kernel='softmax', seed=0, identity='a' * 64),
            dict(config='study_xcit_t12_digits', kernel='softmax', seed=1)]  # kept, made before identities
    assert gi.write_identities(str(kept), [('runs.csv', rows, st.KEY)]) == str(kept / gi.SIDECAR)
    with open(kept / gi.SIDECAR) as f:
        assert list(csv.reader(f)) == [['file', 'config', 'kernel', 'seed', 'identity'],
                                       ['runs.csv', 'study_xcit_t12_digits', 'softmax', '0', 'a' * 64]]
    got = KeptStudy(str(kept))
    assert got.get('study_xcit_t12_digits', 'softmax', 0)['identity'] == 'a' * 64
    assert got.get('study_xcit_t12_digits', 'softmax', 1)['identity'] is None
    assert gi.write_identities(str(kept), [('runs.csv', rows[1:], st.KEY)]) is None  # none: no file, an old removed
    assert not osp.exists(kept / gi.SIDECAR)
    # the warm-start grid: a kept classifiers.csv row keeps its identity (its key columns as the CSV spells them)
    ws = tmp_path / 'ws'
    ws.mkdir()
    shutil.copy(osp.join(RESULTS, 'warm_start', 'classifiers.csv'), ws)
    with open(ws / 'classifiers.csv') as f:
        first = next(csv.DictReader(f))
    gi.write_identities(str(ws), [('classifiers.csv', [dict(first, identity='b' * 64)], CLASSIFIER_KEY)])
    key = row_key(*(first[k] for k in CLASSIFIER_KEY))
    assert Kept(str(ws)).run(key)['identity'] == 'b' * 64


def test_configs_read_from_several_threads_at_once_in_a_fresh_process():
    """A grid's runner reads configs from its threads (--jobs 2: run records, the task route's budget); mmengine
    reloads pkg_resources on each read of an ``mmdet::`` base, and a read in another thread at that moment failed
    ('Expected str, Requirement, or Distribution') before config_checks.read_config read one config at a time."""
    import subprocess
    import sys
    code = ('from concurrent.futures import ThreadPoolExecutor\n'
            'from softfree_mm.analysis import grid_identity as gi, grid_runner\n'
            'from softfree_mm.engine.config_checks import read_config\n'
            f'path = {osp.join(ROOT, "configs/demo/semfpn_pvt_v2_b0_digits.py")!r}\n'
            "text = grid_runner.kernel_config(path, {'type': 'softmax'})\n"
            'def one(i):\n'
            "    return gi.record(text, [f'randomness.seed={i}'])['config']['randomness']['seed'] if i % 2 else \\\n"
            "        read_config(path).model.backbone.type\n"
            'with ThreadPoolExecutor(6) as pool:\n'
            '    got = list(pool.map(one, range(24)))\n'
            "print(len(set(got)))\n")
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ['13'], proc.stderr[-2000:]
