"""The studies' answer at a glance: is softmax needed here? One small table for the README (kernel x task, each
kernel trained from scratch: the paired difference to softmax with its 95 % interval over seeds and n, and the
collapses as k of n) and a forest plot of every paired difference the task study and the kernel study hold, with its
data as a CSV beside it (the regenerate-and-diff test compares the CSV, not the image).

Made from docs/results/study/runs.csv (top-1) and docs/results/task_study/runs.csv (bbox mAP, segm mAP, mIoU) by
``tools/analysis/doc_figures.py``.
"""
import csv
import io
import os.path as osp
from typing import Dict, List

from .findings import CHANCE_TOP1, COLLAPSE_MACC, STUDY_TITLES, _by_seed, name, seed_paired

LAYOUTS = {'pvt': ('study_pvt_v2_b0_digits', 'PVTv2-b0 (tokens)'),
           'xcit': ('study_xcit_t12_digits', 'XCiT-T12 (channels)')}
METRICS = (('top1', 'top-1', 1), ('bbox_mAP', 'bbox mAP', 3), ('segm_mAP', 'segm mAP', 3), ('mIoU', 'mIoU', 1))
FOREST = ('docs', 'results', 'glance', 'forest.csv')  # the plot's data; forest.png beside it
COLUMNS = ('layout', 'kernel', 'start', 'metric', 'mean', 'low', 'high', 'n', 'excludes_zero')


def _top1_rows(study_runs: List[dict]) -> List[dict]:
    """The kernel study's final top-1 minus softmax's, paired by seed, per layout and kernel (from scratch)."""
    out = []
    for layout, (config, _) in LAYOUTS.items():
        rows = [r for r in study_runs if r['config'] == config]
        ref = _by_seed([r for r in rows if r['kernel'] == 'softmax'], 'top1_final')
        for k in dict.fromkeys(r['kernel'] for r in rows):
            vals = _by_seed([r for r in rows if r['kernel'] == k], 'top1_final')
            if k == 'softmax' or not vals:
                continue
            i, _ = seed_paired(vals, ref)
            out.append(dict(layout=layout, kernel=k, start='scratch', metric='top1', mean=i.mean, low=i.low,
                            high=i.high, n=i.n))
    return out


def _task_rows(task_summary: List[dict]) -> List[dict]:
    """The task study's paired differences to softmax, per layout, kernel, start and metric."""
    out = []
    for e in task_summary:
        if e['layout'] not in LAYOUTS or e['kernel'] == 'softmax':
            continue
        for m, _, _ in METRICS[1:]:
            if e.get(f'd_{m}') is None or not e.get(f'd_{m}_n'):
                continue
            lo, hi = e.get(f'd_{m}_ci') or (None, None)
            out.append(dict(layout=e['layout'], kernel=e['kernel'], start=e['start'], metric=m, mean=e[f'd_{m}'],
                            low=lo, high=hi, n=e[f'd_{m}_n']))
    return out


def forest_rows(study_runs: List[dict], task_summary: List[dict]) -> List[dict]:
    rows = _top1_rows(study_runs) + _task_rows(task_summary)
    for r in rows:
        r['excludes_zero'] = r['low'] is not None and not r['low'] <= 0 <= r['high']
    return rows


def forest_csv(rows: List[dict]) -> str:
    """The plot's data as CSV text (numbers rounded as the table shows them, so the text is stable)."""
    digits = {m: d + 1 for m, _, d in METRICS}
    f = io.StringIO()
    w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator='\n')
    w.writeheader()
    for r in rows:
        fmt = (lambda v: '' if v is None else f'{v:.{digits[r["metric"]]}f}')  # noqa: E731
        w.writerow(dict(r, mean=fmt(r['mean']), low=fmt(r['low']), high=fmt(r['high'])))
    return f.getvalue()


def _cell(r: dict, digits: int) -> str:
    if r is None or r['mean'] is None:
        return ''
    if r['low'] is None:
        return f"{r['mean']:+.{digits}f} (n = {r['n']}, no interval)"
    text = f"{r['mean']:+.{digits}f} [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}] ({r['n']})"
    return f'**{text}**' if r['excludes_zero'] else text


def _collapses(layout: str, kernel: str, study_runs: List[dict], task_summary: List[dict]) -> str:
    config = LAYOUTS[layout][0]
    top1 = _by_seed([r for r in study_runs if r['config'] == config and r['kernel'] == kernel], 'top1_final')
    parts = []
    low = sum(v <= CHANCE_TOP1 for v in top1.values())
    if low:
        parts.append(f'classifiers at chance {low} of {len(top1)}')
    seg = next((e for e in task_summary if (e['layout'], e['task'], e['kernel'], e['start']) ==
                (layout, 'seg', kernel, 'scratch')), None)
    if seg:
        floor = sum(r.get('mAcc') is not None and r['mAcc'] < COLLAPSE_MACC for r in seg['by_seed'].values())
        if floor:
            parts.append(f"segmentors at the floor {floor} of {len(seg['by_seed'])}")
    return '; '.join(parts) or 'none'


def table_lines(study_runs: List[dict], task_summary: List[dict]) -> List[str]:
    """The README's table: per layout and kernel from scratch, each task's paired difference to softmax."""
    rows = forest_rows(study_runs, task_summary)
    by = {(r['layout'], r['kernel'], r['start'], r['metric']): r for r in rows}
    out = ['| layout | kernel | ' + ' | '.join(label for _, label, _ in METRICS) + ' | collapses |',
           '|---|---|' + '---|' * (len(METRICS) + 1)]
    for layout, (_, title) in LAYOUTS.items():
        # the kernels both studies ran (the kernel study's others, top-1 alone, are in the forest plot; a diagnostic
        # set-up of the task study alone stays in docs/study.md)
        mine = [r for r in rows if r['layout'] == layout]
        tasks = {r['kernel'] for r in mine if r['start'] == 'scratch' and r['metric'] != 'top1'}
        kernels = [k for k in dict.fromkeys(r['kernel'] for r in mine if r['metric'] == 'top1') if k in tasks]
        for k in kernels:
            cells = [_cell(by.get((layout, k, 'scratch', m)), d) for m, _, d in METRICS]
            out.append(f'| {title} | {name(k)} | ' + ' | '.join(cells)
                       + f' | {_collapses(layout, k, study_runs, task_summary)} |')
    return out


def plot(rows: List[dict], path: str) -> None:
    """One panel per metric: each (layout, kernel, start)'s paired difference to softmax with its interval."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    labels = list(dict.fromkeys((r['layout'], r['kernel'], r['start']) for r in rows))
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 0.28 * len(labels) + 1.2), sharey=True)
    for ax, (m, title, _) in zip(axes, METRICS):
        for y, key in enumerate(labels):
            r = next((r for r in rows if (r['layout'], r['kernel'], r['start']) == key and r['metric'] == m), None)
            if r is None or r['mean'] is None:
                continue
            color = 'tab:red' if r['excludes_zero'] else 'tab:blue'
            if r['low'] is not None:
                ax.plot([r['low'], r['high']], [y, y], color=color, lw=1.5)
            ax.plot([r['mean']], [y], 'o', color=color, ms=4)
        ax.axvline(0, color='grey', lw=0.8)
        ax.set_title(f'{title} minus softmax', fontsize=9)
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels([f'{LAYOUTS[lay][1].split(" ")[0]} {name(k)} ({s})' for lay, k, s in labels], fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle('Paired by seed, 95 % interval over seeds; red: the interval excludes zero', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def inputs(root: str):
    from . import task_study as ts
    from . import task_study_report as tsr
    from .committed_csv import RESULTS, read_csv
    study = read_csv(osp.join(root, RESULTS, 'study', 'runs.csv'))
    return study, tsr.summarise(ts.read_rows(osp.join(root, RESULTS, 'task_study', 'runs.csv')))


def forest_stale(root: str) -> bool:
    path = osp.join(root, *FOREST)
    if not osp.isfile(path):
        return True
    with open(path) as f:
        return f.read() != forest_csv(forest_rows(*inputs(root)))


def write_forest(root: str) -> Dict[str, str]:
    """The forest plot's CSV and png under docs/results/glance/ (only when the CSV's text changes)."""
    import os
    rows = forest_rows(*inputs(root))
    path = osp.join(root, *FOREST)
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(forest_csv(rows))
    plot(rows, path[:-len('.csv')] + '.png')
    return dict(csv=path)


assert set(LAYOUTS[k][0] for k in LAYOUTS) <= set(STUDY_TITLES)  # the kernel study's configs
