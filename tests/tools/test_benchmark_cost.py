"""tools/benchmark.py backbone --layouts: what each kernel costs as images grow (softfree_mm/analysis/benchmark/cost.py).

Guards: a case over its time limit and one over its memory limit each become a row saying so and the sweep goes
on; a kernel a layout does not take is a row with the fit error's line; a resumed sweep measures nothing it has; the
crossover with softmax and the largest size, by hand on a small CSV; limits that are not positive numbers and unknown
layouts are refused by name.
"""
import csv
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest

from softfree_mm.analysis.benchmark import cost, cost_layouts, cost_report

from tests.helpers import ROOT

TOOL = osp.join(ROOT, 'tools', 'benchmark.py')


def _sweep(tmp_path, *extra, csv_name='cost.csv'):
    return subprocess.run([sys.executable, TOOL, 'backbone', '--layouts', 'pvt_v2_b2', '--kernels', 'softmax',
                           'inline', '--short-sides', '64', '--large-side', '0', '--seg-size', '0', '--no-models',
                           '--repeats', '1', '--csv', str(tmp_path / csv_name), '--device', 'cpu', *extra],
                          capture_output=True, text=True, timeout=900)


def test_time_and_memory_limits_are_rows_and_the_sweep_goes_on_and_resumes_without_repeating(tmp_path):
    # a memory limit below what importing torch takes: every measured case is killed for memory, and goes on
    proc = _sweep(tmp_path, '--mem-limit', '0.2', '--time-limit', '300')
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / 'cost.csv')))
    assert [(r['kernel'], r['pass'], r['status']) for r in rows] == [
        ('softmax', 'fwd', 'over the memory limit'), ('softmax', 'fwdbwd', 'over the memory limit'),
        ('inline', 'fwd', 'does not fit'), ('inline', 'fwdbwd', 'does not fit')]
    assert rows[0]['error'] == 'over the memory limit (0.2 GiB resident: killed)'
    assert "attention kernel 'inline' cannot be used in stage 0 with spatial reduction" in rows[2]['error']
    # a time limit no case can meet, in another file: each a row, the sweep goes on
    proc = _sweep(tmp_path, '--time-limit', '0.5', csv_name='slow.csv')
    assert proc.returncode == 0, proc.stderr[-3000:]
    slow = list(csv.DictReader(open(tmp_path / 'slow.csv')))
    assert [r['status'] for r in slow[:2]] == ['over the time limit'] * 2
    assert slow[0]['error'] == 'over the time limit (0.5 s: killed)'
    # resumed: every case is in the file, nothing is measured (no limit could pass, none is hit)
    again = _sweep(tmp_path, '--time-limit', '0.5', csv_name='slow.csv')
    assert again.returncode == 0 and list(csv.DictReader(open(tmp_path / 'slow.csv'))) == slow
    assert 'status=' not in again.stderr  # no case measured again (each one measured logs a line)


def test_a_case_within_the_limits_is_measured(tmp_path):
    proc = _sweep(tmp_path, '--kernels', 'linear', '--mem-limit', '8', '--time-limit', '300')
    assert proc.returncode == 0, proc.stderr[-3000:]
    (fwd, back) = list(csv.DictReader(open(tmp_path / 'cost.csv')))
    assert (fwd['status'], back['status'], fwd['size'], back['pass']) == ('ok', 'ok', '64x128', 'fwdbwd')
    assert float(fwd['ms']) > 0 and float(back['rss_MiB']) > 100
    # the tensors' peak: backward holds the forward's saved tensors and their gradients, more than inference
    assert 0 < float(fwd['tensor_MiB']) < float(back['tensor_MiB'])
    assert '| linear | ' in proc.stdout


@pytest.mark.parametrize('task', ['maskrcnn', 'semfpn'])
def test_a_whole_model_point_is_measured(task):
    """The detector's and the segmentor's inference at a small size, in a process of its own (the spec crosses as
    JSON: the model config must come back as mmengine's ConfigDict, whose heads read test_cfg.rpn / test_cfg.mode)."""
    _, model = cost_layouts.model_config(task, 'swin_t', 'softmax')
    row = cost.run_case(dict(what=task, task=task, layout='swin_t', kernel='softmax', size=(64, 96), cfg=model,
                             repeats=1, device='cpu', dtype='fp32', **{'pass': 'fwd'}), 300, 8)
    assert row['status'] == 'ok', row
    assert row['ms'] > 0 and row['rss_MiB'] > 100


def _row(layout, kernel, side, status='ok', ms=None):
    h, w = cost.coco_size(side)
    return dict(what='backbone', layout=layout, kernel=kernel, **{'pass': 'fwd'}, size=f'{h}x{w}', short_side=side,
                status=status, ms=ms, peak_MiB=1, error='')


def test_the_crossover_and_the_largest_size_by_hand():
    rows = [_row('L', 'softmax', 512, ms=100), _row('L', 'softmax', 800, ms=300),
            _row('L', 'softmax', 1024, 'over the memory limit'),
            _row('L', 'linear', 512, ms=150), _row('L', 'linear', 800, ms=250), _row('L', 'linear', 1024, ms=400),
            _row('L', 'poly3', 512, ms=120), _row('L', 'poly3', 800, ms=350),
            _row('L', 'poly3', 1024, 'over the time limit'),
            _row('L', 'soft', 512, ms=90), _row('L', 'soft', 800, ms=310), _row('L', 'soft', 1024, ms=500),
            _row('L', 'relu', 512, ms=90), _row('L', 'relu', 800, 'over the time limit')]
    got = {e['kernel']: e for e in cost_report.crossovers(rows)}
    # soft: faster at 512 (90 < 100), slower at 800 (310 > 300): not cheaper from 512; it runs at 1024 where softmax
    # does not, so from 1024; relu: faster at 512, then over a limit where softmax ran: never
    assert got['soft']['cheaper_from'] == 1024 and got['soft']['softmax_over_from'] == 1024
    assert got['relu']['cheaper_from'] is None and got['relu']['largest'] == 512
    # linear: slower at 512, faster at 800 (250 < 300); at 1024 softmax is over its limit and linear is not
    assert got['linear']['cheaper_from'] == 800 and got['linear']['softmax_over_from'] == 1024
    assert got['linear']['largest'] == 1024 and got['linear']['ratio_at'] == {512: 1.5, 800: 250 / 300}
    assert got['poly3']['cheaper_from'] is None and got['poly3']['largest'] == 800
    assert got['softmax']['largest'] == 800
    table = cost_report.markdown(rows)
    assert '| linear | 150 ms, 1 MiB | 250 ms, 1 MiB | 400 ms, 1 MiB | 800 | 1024 |' in table, table
    assert '| poly3 | 120 ms, 1 MiB | 350 ms, 1 MiB | over the time limit | not in the sizes run | 800 |' in table


def test_a_csv_of_an_older_sweep_takes_the_new_column_and_keeps_its_rows(tmp_path):
    path = tmp_path / 'old.csv'
    old = [c for c in cost.COLUMNS if c != 'tensor_MiB']
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=old)
        w.writeheader()
        w.writerow(dict(_row('L', 'softmax', 512, ms=100), config='c.py', rss_MiB=900))
    cost._append(str(path), dict(_row('L', 'linear', 512, ms=50), config='c.py', rss_MiB=800, tensor_MiB=12.5))
    rows = cost.read_rows(str(path))
    assert tuple(rows[0]) == cost.COLUMNS and [r['kernel'] for r in rows] == ['softmax', 'linear']
    assert rows[0]['ms'] == '100' and rows[0]['tensor_MiB'] == '' and rows[1]['tensor_MiB'] == '12.5'


def test_memory_is_compared_by_one_instrument():
    a = dict(_row('L', 'linear', 512, ms=1), peak_MiB=300, tensor_MiB=100)
    b = dict(_row('L', 'softmax', 512, ms=1), peak_MiB=100, tensor_MiB=100)
    assert cost_report._memory_ratio(a, b) == 1.0  # both have the tensors' peak: that one
    assert cost_report._memory_ratio(a, dict(b, tensor_MiB='')) == 3.0  # else the resident set's, for both


def test_the_tie_rule_by_hand():
    assert [cost_report.verdict(r) for r in (0.5, 0.9, 0.91, 1.0, 1.1, 1.11, 3)] == [
        'cheaper', 'cheaper', 'a tie', 'a tie', 'a tie', 'dearer', 'dearer']
    # 95 ms against 100: a tie, so not "cheaper from 512" although faster; 85 ms at 800 against 100: cheaper
    rows = [_row('L', 'softmax', 512, ms=100), _row('L', 'softmax', 800, ms=100),
            _row('L', 'linear', 512, ms=95), _row('L', 'linear', 800, ms=85)]
    got = {e['kernel']: e for e in cost_report.crossovers(rows)}
    assert got['linear']['cheaper_from'] == 800


def test_the_findings_are_made_from_the_rows_alone():
    rows = [_row('L', 'softmax', 512, ms=100), _row('L', 'softmax', 800, ms=300),
            _row('L', 'softmax', 1024, 'over the time limit'),
            _row('L', 'linear', 512, ms=105), _row('L', 'linear', 800, ms=150), _row('L', 'linear', 1024, ms=400),
            _row('L', 'poly3', 512, ms=150), _row('L', 'poly3', 800, 'over the memory limit'),
            _row('L', 'soft', 512, 'does not fit')]
    text = cost_report.findings(rows)
    assert text.splitlines() == [  # in the sweep's kernel order, whatever the rows' order
        "- **L**, `poly3`: 1.50x softmax's inference time (dearer at 512), memory 1.00x; over the memory limit at 800 "
        '(softmax ran).',
        "- **L**, `linear`: 0.50-1.05x softmax's inference time (cheaper at 800; a tie at 512), memory 1.00x; "
        'runs at 1024 where softmax is over the time limit.',
        '- **L**: `soft` do not fit this layout.',
        "- **Growth**: no kernel grows faster in pixels than its declared class allows beside softmax (memory "
        'exponents; the rule above).']


def _grown(layout, kernel, cls, mems, ms=(100, 250, 400)):
    """Rows at 512, 800, 1024 with the tensors' peak ``mems`` (MiB) and the class the sweep records."""
    return [dict(_row(layout, kernel, side, ms=t), tensor_MiB=m, **{'class': cls})
            for side, t, m in zip((512, 800, 1024), ms, mems)]


def test_a_linear_set_up_growing_faster_than_softmax_in_memory_is_flagged_by_hand():
    """Exponents by hand: pixels 512x864 -> 800x1344 -> 1024x1728 (x 2.43, x 1.65); memory x pixels^e. A linear
    set-up may grow as max(1, softmax's) + 0.1: e = 1.0 passes, e = 1.5 (CSwin's padded stripes before key masks)
    is flagged; a quadratic one (softmax kept in a stage) is never bounded; a row without a class has no bound."""
    px = [h * w for h, w in (cost.coco_size(s) for s in (512, 800, 1024))]

    def mem(e):
        return [10 * (p / px[0]) ** e for p in px]
    rows = (_grown('L', 'softmax', 'quadratic', mem(1.2)) + _grown('L', 'linear', 'linear', mem(1.5))
            + _grown('L', 'inline', 'quadratic', mem(1.8)) + _grown('L', 'agent', 'linear', mem(1.0))
            + [dict(r, **{'class': ''}) for r in _grown('L', 'soft-l64', '', mem(1.9))])
    got = {g['kernel']: g for g in cost_report.growth(rows)}
    assert got['linear']['memory'] == pytest.approx(1.5) and got['linear']['bound'] == pytest.approx(1.3)
    assert got['linear']['beyond'] and not got['agent']['beyond']
    assert got['inline']['bound'] is None and got['soft-l64']['bound'] is None and got['softmax']['bound'] is None
    text = cost_report.findings(rows)
    assert ("- **L**, `linear` (declared linear): **grows faster than its class allows**, memory^1.50 in pixels "
            "against softmax's memory^1.20 (bound 1.30)") in text
    assert 'growth in pixels time^' in text and '`agent` (declared' not in text


def test_the_docs_section_is_what_the_committed_csv_makes():
    """docs/benchmarks.md between the cost markers, and the README's headline between its own, are regenerated from
    docs/results/cost/cost_cpu.csv: a changed row, or a hand edit between the markers, fails here."""
    rows = cost.read_rows(osp.join(ROOT, 'docs', 'results', 'cost', 'cost_cpu.csv'))
    want = cost_report.section(rows, 'results/cost/cost_cpu.png')
    page = open(osp.join(ROOT, 'docs', 'benchmarks.md')).read()
    got = page[page.index(cost_report.BEGIN):page.index(cost_report.END) + len(cost_report.END)]
    assert got == want
    readme = open(osp.join(ROOT, 'README.md')).read()
    got = readme[readme.index(cost_report.HEADLINE_BEGIN):readme.index(cost_report.HEADLINE_END)
                 + len(cost_report.HEADLINE_END)]
    assert got == cost_report.headline(rows)
    above = page[:page.index(cost_report.BEGIN)]
    above = above[above.index('## What each kernel costs as images grow'):]
    prose = [ln for ln in above.splitlines() if ln and not ln.startswith(('```', 'python ', '#'))]
    # the prose above the markers quotes no measured figure: no ratio, no cell (sizes and limits of the method are
    # not findings)
    import re
    assert not [ln for ln in prose if re.search(r'\d\.\d+ ?x|\d+ ms,|\d+ MiB,|\d+ ?%', ln)], prose


@pytest.mark.parametrize('args,message', [
    (['--time-limit', '0'], "--time-limit must be a positive number, got '0'"),
    (['--mem-limit', '-2'], "--mem-limit must be a positive number, got '-2'"),
    (['--mem-limit', 'lots'], "--mem-limit must be a positive number, got 'lots'"),
])
def test_limits_that_are_not_positive_numbers_are_refused_by_name(args, message, tmp_path):
    proc = _sweep(tmp_path, *args)
    assert proc.returncode == 2 and proc.stderr.strip() == f'error: {message}', proc.stderr


def test_unknown_layouts_and_kernels_list_the_known_ones(tmp_path):
    proc = subprocess.run([sys.executable, TOOL, 'backbone', '--layouts', 'vit_b', '--csv', str(tmp_path / 'c.csv')],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --layouts: unknown layout(s) ['vit_b']; valid: xcit_s12, pvt_v2_b2, pvt_v2_b2_nosr, swin_t, cswin_t")
    proc = subprocess.run([sys.executable, TOOL, 'backbone', '--layouts', 'swin_t', '--kernels', 'poly',
                           '--csv', str(tmp_path / 'c.csv')], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and 'valid: softmax, poly3, linear, inline, soft, soft-l64, soft-l256' in proc.stderr


def _children(pid):
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _cases(pid):
    """The sweep's case processes (its other children, like a short `uname` at import, come and go)."""
    def cmdline(child):
        try:
            with open(f'/proc/{child}/cmdline') as f:
                return f.read()
        except OSError:
            return ''
    return [c for c in _children(pid) if 'softfree_mm.analysis.benchmark.cost' in cmdline(c)]


def _alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[1][0] not in 'ZX'
    except OSError:
        return False


@pytest.mark.skipif(not osp.exists(f'/proc/{os.getpid()}/task/{os.getpid()}/children'),
                    reason='reads the process tree from Linux /proc')
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_sweep_leaves_no_case_running(sig, tmp_path):
    """The case's process goes with the sweep (it runs in a session of its own, so a plain kill of the sweep left it
    running on, measuring on an unowned CPU): SIGTERM via the sweep's clean-up, SIGKILL via the kernel."""
    sweep = subprocess.Popen([sys.executable, TOOL, 'backbone', '--layouts', 'pvt_v2_b2', '--kernels', 'softmax',
                              '--short-sides', '4096', '--large-side', '0', '--seg-size', '0', '--no-models',
                              '--time-limit', '300', '--csv', str(tmp_path / 'c.csv'), '--device', 'cpu'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, case = time.time() + 120, []
    while not case and time.time() < deadline and sweep.poll() is None:
        time.sleep(0.2)
        case = _cases(sweep.pid)
    assert case, 'the sweep started no case'
    time.sleep(1.0)  # the case is importing torch / measuring
    assert _alive(case[0])
    sweep.send_signal(sig)
    sweep.wait(timeout=60)
    deadline = time.time() + 30
    while _alive(case[0]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(case[0]), f'the case {case[0]} runs on after the sweep got {sig!r}'
    assert not (tmp_path / 'c.csv').exists() or len(list(csv.DictReader(open(tmp_path / 'c.csv')))) == 0
