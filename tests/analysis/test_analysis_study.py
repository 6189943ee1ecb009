"""tools/analysis/study.py on a shortened study: a two-layer XCiT variant of the study's XCiT config (the study's
schedule, recipe and AttentionStatsHook) trained 4 iterations on 16 digit crops, kernels softmax and poly3 with one
seed, and soft, which XCA refuses (it needs a token grid).

Guards: every number of runs.csv, norm_curves.csv, summary.csv and table.md equals what the test reads itself from
each run's own vis_data/scalars.json and attention_stats.json (and the run's log names the seed); the refused
kernel is a failed row naming the refusal, not a crash; a second call trains nothing and a run without its
result.json is trained again from its start; mean ± sample std and the validation standard error follow the plain
formulas; bad input is one line and exit status 2.
"""
import csv
import glob
import itertools
import json
import math
import os
import os.path as osp
import random
import statistics

import pytest

from softfree_mm.engine.demo_data import make_demo

from tests.helpers import ROOT, load_tool, one_line_error
from tests.helpers.demo import shared_demo_root

STUDY_CFG = osp.join(ROOT, 'configs', 'demo', 'study_xcit_t12_digits.py')
VAL_IMAGES = 16


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    root = osp.dirname(shared_demo_root(tmp_path_factory))
    make_demo(root, 'imagenet')
    return root


def _tiny(folder, demo, hook=True):
    """The XCiT study config shrunk: embed 32, 2 layers, 2 heads (XCA over 16 channels); 16 training crops of all
    classes (the sets are sorted by class) in batches of 4, 4 iterations validated at 2 and 4 on 16 crops of all
    classes; the hook at the first and every 2nd iteration."""
    root = osp.join(demo, 'imagenet')
    text = f"""_base_ = {STUDY_CFG!r}
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=2), head=dict(in_channels=32))
train_dataloader = dict(batch_size=4, dataset=dict(data_root={root!r}, indices=list(range(0, 4500, 283)),
                                                       serialize_data=False))
val_dataloader = dict(batch_size=8, dataset=dict(data_root={root!r}, indices=list(range(0, 500, 32)),
                                                   serialize_data=False))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=4, val_interval=2)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=4))
custom_hooks = [{"dict(type='AttentionStatsHook', interval=2)" if hook else ''}]
"""
    path = osp.join(folder, 'tiny.py')
    with open(path, 'w') as f:
        f.write(text)
    return path


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _num(text):
    return None if text == '' else float(text)


def test_study_tables_equal_the_runs_logs_and_a_refused_kernel_is_a_failed_row(demo, tmp_path, capsys):
    cfg = _tiny(str(tmp_path), demo)
    tool = load_tool('analysis/study')
    work, out = str(tmp_path / 'work'), str(tmp_path / 'out')
    argv = ['--configs', cfg, '--kernels', 'softmax', 'poly:degree=3', 'soft', '--seeds', '3', '--work-dir', work,
            '--out', out, '--in-process']
    assert tool.main(argv) == 0
    rows = {r['kernel']: r for r in _csv(osp.join(out, 'runs.csv'))}
    assert list(rows) == ['softmax', 'poly:degree=3', 'soft']

    refused = rows['soft']
    assert refused['status'] == 'failed' and refused['seed'] == '3'
    assert "attention kernel 'soft'" in refused['error'] and 'cross-covariance attention' in refused['error']
    assert refused['top1_final'] == refused['loss_final'] == refused['s_per_iter'] == ''

    logs = {}
    for kernel in ('softmax', 'poly:degree=3'):
        r = rows[kernel]
        run = osp.join(work, 'tiny', kernel.replace(':', '_'), 'seed3')
        log, = glob.glob(osp.join(run, '*', 'vis_data', 'scalars.json'))
        logs[kernel] = log
        assert r['log'] == osp.relpath(log, work)
        recs = _records(log)
        val = [(x['step'], x['accuracy/top1']) for x in recs if 'accuracy/top1' in x]
        train = [x for x in recs if 'loss' in x]
        assert [s for s, _ in val] == [2, 4]  # validated at its iterations
        assert r['status'] == 'ok' and r['error'] == '' and int(r['iters']) == 4 == train[-1]['step']
        assert float(r['top1_final']) == val[-1][1]
        best = max(v for _, v in val)
        assert float(r['top1_best']) == best and int(r['best_iter']) == next(s for s, v in val if v == best)
        assert float(r['loss_final']) == train[-1]['loss']
        times = [x['time'] for x in train]
        assert float(r['s_per_iter']) == pytest.approx(sum(times[1:]) / len(times[1:]), rel=1e-12)
        assert float(r['peak_mem_mib']) > 100 and r['mem_kind'] == 'peak RSS of the training process'
        assert float(r['cpu_s']) > 0 and float(r['wall_s']) > 0
        text_log, = glob.glob(osp.join(run, '*', '*.log'))
        assert 'seed: 3' in open(text_log).read()  # the run's own log names the seed the study gave it
        with open(glob.glob(osp.join(run, '*.py'))[0]) as f:
            assert f"type='{kernel.split(':')[0]}'" in f.read()

    # the norm curves: every record of each run's attention_stats.json, layer by layer
    curves = _csv(osp.join(out, 'norm_curves.csv'))
    for kernel, log in logs.items():
        want = []
        for rec in _records(osp.join(osp.dirname(log), 'attention_stats.json')):
            for key, val in rec.items():
                if key.startswith('attn/') and key.endswith('/fro'):
                    layer = key[len('attn/'):-len('/fro')]
                    n = rec[f'attn/{layer}/rows']
                    want.append((rec['step'], layer, n, val, rec[f'attn/{layer}/jac'], val / math.sqrt(n)))
        got = [(int(c['step']), c['layer'], float(c['rows']), float(c['fro']), float(c['jac']),
                float(c['fro_sqrt_n'])) for c in curves if c['kernel'] == kernel]
        assert got == want and {s for s, *_ in want} == {1, 2, 4}  # the first iteration, then every 2nd
        assert {layer for _, layer, *_ in want} == {'backbone.blocks.0.attn', 'backbone.blocks.1.attn'}
        assert all(n == 16 for _, _, n, *_ in want)  # XCA: a head's 16 channels are its tokens

    # summary and table: one seed, so the mean is the run's number and no std is claimed
    summary = {r['kernel']: r for r in _csv(osp.join(out, 'summary.csv'))}
    table = open(osp.join(out, 'table.md')).read()
    assert f'validation set {VAL_IMAGES} images' in table and 'Chance: 10.0 % top-1' in table
    for kernel, what in (('softmax', 'softmax'), ('poly:degree=3', 'poly x^3 / sqrt(N)')):
        r, s = rows[kernel], summary[kernel]
        assert s['n'] == '1' and s['top1_final'] == r['top1_final'] and s['top1_final_std'] == ''
        p = float(r['top1_final'])
        se = 100 * math.sqrt(p / 100 * (1 - p / 100) / VAL_IMAGES)
        d = p - float(rows['softmax']['top1_final'])
        diff = 'reference' if kernel == 'softmax' else f'{d:+.1f}'
        paired = '' if kernel == 'softmax' else f'{d:+.1f}, {int(d > 0)} of 1 above'  # one seed: no std
        line = (f"| {what} | `{kernel}` | 1 | {p:.1f} | {float(r['top1_best']):.1f} | {se:.1f} | {diff} | {paired} | "
                f"{float(r['loss_final']):.3f} | {float(r['s_per_iter']):.3f} | {float(r['peak_mem_mib']):.0f} |")
        assert line in table, (line, table)
    assert "| SOFT | `soft` | 0 | failed: SoftFreeXCiT: attention kernel 'soft'" in table
    assert summary['soft']['n'] == '0' and summary['soft']['failed'] == '1'
    for png in ('accuracy.png', 'norms_tiny.png'):
        assert 10_000 < osp.getsize(osp.join(out, png)) < 200_000

    # --report-only: the same files from the finished runs, nothing trained
    before = {name: open(osp.join(out, name)).read() for name in ('runs.csv', 'norm_curves.csv', 'table.md')}
    assert tool.main(argv + ['--report-only', '--out', str(tmp_path / 'report')]) == 0
    for name, text in before.items():
        assert open(osp.join(str(tmp_path / 'report'), name)).read() == text

    # resumable: a second call trains nothing; a run without result.json (killed) is emptied and trained again
    capsys.readouterr()
    assert tool.main(argv) == 0
    said = capsys.readouterr().out
    assert said.count('not trained again') == 3
    assert sorted(glob.glob(osp.join(work, 'tiny', '*', 'seed3', '*', 'vis_data', 'scalars.json'))) == \
        sorted(logs.values())  # no new run folder
    stamp = os.stat(logs['softmax']).st_mtime_ns
    os.remove(osp.join(work, 'tiny', 'poly_degree=3', 'seed3', 'result.json'))
    assert tool.main(argv) == 0
    assert os.stat(logs['softmax']).st_mtime_ns == stamp and not osp.exists(logs['poly:degree=3'])
    again, = glob.glob(osp.join(work, 'tiny', 'poly_degree=3', 'seed3', '*', 'vis_data', 'scalars.json'))
    assert _csv(osp.join(out, 'runs.csv'))[1]['log'] == osp.relpath(again, work)

    # --keep-from: the outputs kept without their work folders (another machine); one new kernel trained and added
    # in the study's order, the kept runs not trained again, their rows and curves as they were, a refused (failed)
    # kept row kept outside the selection
    kept_runs = {r['kernel']: r for r in _csv(osp.join(out, 'runs.csv'))}
    kept_curves = _csv(osp.join(out, 'norm_curves.csv'))
    work2, out2 = str(tmp_path / 'work2'), str(tmp_path / 'out2')
    assert tool.main(['--configs', cfg, '--kernels', 'softmax', 'relu', '--seeds', '3', '--work-dir', work2,
                      '--out', out2, '--in-process', '--keep-from', out]) == 0
    assert sorted(os.listdir(osp.join(work2, 'tiny'))) == ['relu']  # softmax was kept, not trained
    merged = _csv(osp.join(out2, 'runs.csv'))
    assert [r['kernel'] for r in merged] == ['softmax', 'poly:degree=3', 'soft', 'relu']
    assert merged[:3] == [kept_runs[k] for k in ('softmax', 'poly:degree=3', 'soft')]
    assert merged[3]['status'] == 'ok' and merged[3]['seed'] == '3'
    curves2 = _csv(osp.join(out2, 'norm_curves.csv'))
    assert [c for c in curves2 if c['kernel'] != 'relu'] == kept_curves
    assert {c['kernel'] for c in curves2} == {'softmax', 'poly:degree=3', 'relu'}
    assert '| relu(s) / N | `relu` | 1 |' in open(osp.join(out2, 'table.md')).read()


def test_refusals_in_two_parallel_training_processes_are_failed_rows(demo, tmp_path):
    """The study's own way (one tools/train.py process per run, two at a time, one torch thread each): the refusal
    is read from the child's stderr; each seed is its own row."""
    cfg = _tiny(str(tmp_path), demo)
    out = str(tmp_path / 'out')
    assert load_tool('analysis/study').main(['--configs', cfg, '--kernels', 'soft', '--seeds', '0', '1',
                                             '--work-dir', str(tmp_path / 'work'), '--out', out,
                                             '--jobs', '2', '--threads', '1']) == 1  # nothing trained
    rows = _csv(osp.join(out, 'runs.csv'))
    assert [(r['seed'], r['status'], r['threads']) for r in rows] == [('0', 'failed', '1'), ('1', 'failed', '1')]
    for r in rows:
        assert r['error'].startswith('error: ') and "attention kernel 'soft'" in r['error']
        with open(osp.join(str(tmp_path / 'work'), 'tiny', 'soft', f"seed{r['seed']}", 'train.log.stderr')) as f:
            assert r['error'] in f.read()


def test_summary_is_mean_and_sample_std_over_seeds_and_failed_seeds_are_counted():
    from softfree_mm.analysis.study import markdown, standard_error, summarise
    rows = [dict(config='c', kernel='poly', seed=s, status='ok', error='', top1_final=f, top1_best=b,
                 loss_final=l, s_per_iter=t, peak_mem_mib=m)
            for s, f, b, l, t, m in ((0, 61.2, 64.0, 1.5, 0.5, 900.0), (1, 70.4, 70.4, 1.3, 0.7, 910.0),
                                     (2, 55.0, 58.6, 1.7, 0.6, 920.0))]
    rows.append(dict(config='c', kernel='poly', seed=3, status='failed', error='error: x.py: NaN loss',
                     top1_final=None, top1_best=None, loss_final=None, s_per_iter=None, peak_mem_mib=None))
    rows += [dict(config='c', kernel='softmax', seed=s, status='ok', error='', top1_final=f, top1_best=f,
                  loss_final=1.0, s_per_iter=0.5, peak_mem_mib=900.0) for s, f in ((0, 66.0), (1, 69.0))]
    e, ref = summarise(rows, {'poly': 'poly x^3'})
    assert ref['kernel'] == 'softmax' and ref['what'] == 'softmax' and ref['n'] == 2
    finals = [61.2, 70.4, 55.0]
    mean = sum(finals) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in finals) / 2)  # n - 1
    assert e['n'] == 3 and e['failed'] == 1 and e['error'] == 'error: x.py: NaN loss'
    assert e['top1_final'] == pytest.approx(mean) and e['top1_final_std'] == pytest.approx(std)
    assert e['top1_best_std'] == pytest.approx(statistics.stdev([64.0, 70.4, 58.6]))
    assert e['s_per_iter'] == pytest.approx(0.6) and e['peak_mem_mib'] == pytest.approx(910.0)
    assert standard_error(mean, 500) == pytest.approx(100 * math.sqrt(mean / 100 * (1 - mean / 100) / 500))
    table = markdown([e, ref], {'c': 500})
    d_se = math.sqrt(std ** 2 / 3 + statistics.stdev([66.0, 69.0]) ** 2 / 2)
    # paired: the seeds both trained (0 and 1), 61.2 - 66.0 and 70.4 - 69.0
    pairs = [61.2 - 66.0, 70.4 - 69.0]
    assert e['delta_paired'] == pytest.approx(sum(pairs) / 2) and e['seeds_paired'] == 2 and e['seeds_above'] == 1
    assert e['delta_paired_std'] == pytest.approx(statistics.stdev(pairs))
    assert (f'| poly x^3 | `poly` | 3 (1 failed) | {mean:.1f} ± {std:.1f} | 64.3 ± 5.9 | '
            f'{standard_error(mean, 500):.1f} | {mean - 67.5:+.1f} ± {d_se:.1f} | -1.7 ± 4.4, 1 of 2 above | '
            '1.500 ± 0.200 | 0.600 | 910 |') in table
    assert '| softmax | `softmax` | 2 | 67.5 ± 2.1 | 67.5 ± 2.1 | 2.1 | reference |  |' in table
    assert 'validation set 500 images' in table and '2.2 points at p = 50 %' in table


def _run_row(kernel, seed, top1):
    """One run of config 'c'; ``top1`` None: the run failed."""
    ok = top1 is not None
    return dict(config='c', kernel=kernel, seed=seed, status='ok' if ok else 'failed',
                error='' if ok else 'error: x.py: NaN loss', top1_final=top1, top1_best=top1,
                loss_final=1.0 if ok else None, s_per_iter=0.5 if ok else None, peak_mem_mib=900.0 if ok else None)


@pytest.mark.parametrize('order', ['seed_order', 'shuffled'])
def test_paired_deltas_pair_runs_by_seed_whichever_seeds_failed_on_either_side(order):
    """Every pattern of failed seeds on both sides (and seeds one side never ran): the paired differences are
    those of the seeds both trained, seed with seed, however the rows are ordered."""
    from softfree_mm.analysis.study import summarise
    poly = {0: 60.0, 1: 71.5, 2: 55.25, 3: 64.0, 5: 50.0}  # seed 5: softmax never ran it
    soft = {0: 66.0, 1: 69.0, 2: 58.0, 3: 61.5, 4: 70.0}  # seed 4: poly never ran it
    rng = random.Random(0)
    for failed in itertools.product([False, True], repeat=8):
        poly_failed = {s for s, f in zip((0, 1, 2, 3), failed[:4]) if f}
        soft_failed = {s for s, f in zip((0, 1, 2, 3), failed[4:]) if f}
        rows = [_run_row('poly', s, None if s in poly_failed else v) for s, v in poly.items()]
        rows += [_run_row('softmax', s, None if s in soft_failed else v) for s, v in reversed(soft.items())]
        if order == 'shuffled':
            rng.shuffle(rows)
        entries = {e['kernel']: e for e in summarise(rows)}
        both = [s for s in poly if s in soft and s not in poly_failed | soft_failed]
        d = [poly[s] - soft[s] for s in both]  # by hand: seed with seed
        e, what = entries['poly'], f'failed: poly {sorted(poly_failed)}, softmax {sorted(soft_failed)}'
        assert e['seeds_paired'] == len(d) and e['seeds_above'] == sum(x > 0 for x in d), what
        if d:
            assert e['delta_paired'] == pytest.approx(statistics.fmean(d)), what
        else:
            assert e['delta_paired'] is None, what
        if len(d) > 1:
            assert e['delta_paired_std'] == pytest.approx(statistics.stdev(d)), what
        else:
            assert e['delta_paired_std'] is None, what
        assert entries['softmax']['delta_paired'] is None and entries['softmax']['seeds_paired'] == 0


def test_study_refuses_bad_input_with_one_line(demo, tmp_path, capsys):
    cfg = _tiny(str(tmp_path), demo, hook=False)
    name = 'analysis/study'
    one_line_error(capsys, name, ['--configs', cfg, '--seeds', '1', '1'], '--seeds')
    one_line_error(capsys, name, ['--configs', cfg, '--kernels', 'poly:degre=3'], 'degre')
    one_line_error(capsys, name, ['--configs', cfg, '--cfg-options', 'randomness.seed=4'], '--seeds')
    one_line_error(capsys, name, ['--configs', cfg, '--jobs', '0'], '--jobs')
    one_line_error(capsys, name, ['--configs', cfg], 'no AttentionStatsHook')


def test_study_answers_help(capsys):
    with pytest.raises(SystemExit) as e:
        load_tool('analysis/study').main(['--help'])
    out = capsys.readouterr().out
    assert e.value.code == 0 and 'usage' in out and 'result.json' in out
