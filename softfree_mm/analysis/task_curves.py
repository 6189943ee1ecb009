"""The training-loss curves of the detection and segmentation study's runs (tools/analysis/task_study.py): every
logged training record of a run (iteration, loss and, for a segmentor, its pixel accuracy on the training crops)
under the run's identity (layout, task, kernel, start, recipe, seed), kept in curves.csv beside runs.csv so that
they outlive the work dir; per segmentor the loss at fixed iterations (the mean of the records over the 100
iterations up to each) and where it was lowest, to see whether a segmentor at the all-background floor never left
it or left it and came back.
"""
import csv
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

CURVE_FIELDS = ('layout', 'task', 'kernel', 'start', 'recipe', 'seed', 'iter', 'loss', 'acc_seg')
IDENTITY = CURVE_FIELDS[:6]
WINDOW = 100  # iterations a loss point averages over
AT = (250, 500, 1000, 1500, 2000, 2500, 3000)

Key = Tuple[str, str, str, str, str, int]


def identity(row: dict) -> Key:
    return tuple(row.get(k, '') if k != 'seed' else int(row[k]) for k in IDENTITY)


def read_log(path: str) -> List[dict]:
    """A run's scalars.json -> its training records: iter, loss, acc_seg (None where the task logs none)."""
    from .sweep import json_records
    out = []
    for rec in json_records(path):
        if 'loss' in rec:
            out.append(dict(iter=int(rec.get('iter', rec.get('step'))), loss=float(rec['loss']),
                            acc_seg=None if rec.get('decode.acc_seg') is None else float(rec['decode.acc_seg'])))
    return out


def curve_rows(key: Key, records: Sequence[dict]) -> List[dict]:
    base = dict(zip(IDENTITY, key))
    return [dict(base, **{k: r.get(k) for k in ('iter', 'loss', 'acc_seg')}) for r in records]


def read_curves(path: str) -> Dict[Key, List[dict]]:
    """curves.csv back, grouped by run identity (missing file: nothing). A file without the columns: ValueError."""
    if not osp.isfile(path):
        return {}
    out: Dict[Key, List[dict]] = {}
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        missing = [c for c in CURVE_FIELDS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f'{path}: not a curves.csv of the task study (no column {", ".join(missing)})')
        for r in reader:
            rec = dict(iter=int(r['iter']), loss=float(r['loss']),
                       acc_seg=float(r['acc_seg']) if r['acc_seg'] not in ('', None) else None)
            out.setdefault(identity(r), []).append(rec)
    return out


def merged(rows: Sequence[dict], new: Dict[Key, List[dict]], kept: Dict[Key, List[dict]]) -> List[dict]:
    """curves.csv's rows in the rows' order: a run's curve from its log where this run read one, else the kept one
    (the committed outputs, when the work dir is gone)."""
    out = []
    for r in rows:
        if r.get('status') != 'ok':
            continue
        key = identity(r)
        records = new.get(key) or kept.get(key)
        if records:
            out += curve_rows(key, records)
    return out


def loss_at(records: Sequence[dict], it: int, window: int = WINDOW) -> Optional[float]:
    """The mean loss of the records in (it - window, it]; None where there are none."""
    xs = [r['loss'] for r in records if it - window < r['iter'] <= it]
    return sum(xs) / len(xs) if xs else None


def profile(records: Sequence[dict], at: Sequence[int] = AT, window: int = WINDOW) -> dict:
    """loss_<i> at each of ``at``; the lowest windowed loss (``low``) and its iteration (``low_iter``, the end of its
    window, the first where tied); ``rise``: the final windowed loss minus the lowest (0 where the run ends at its
    lowest; > 0: it went back up); ``acc_final``: the mean pixel accuracy of the last window."""
    out = {f'loss_{i}': loss_at(records, i, window) for i in at}
    ends = sorted({r['iter'] for r in records})
    points = [(i, loss_at(records, i, window)) for i in ends if i >= min(ends) + window - 1 or i == ends[-1]] \
        if ends else []
    points = [(i, v) for i, v in points if v is not None]
    if points:
        low_iter, low = min(points, key=lambda p: (p[1], p[0]))
        out.update(low=low, low_iter=low_iter, rise=points[-1][1] - low, final=points[-1][1])
    else:
        out.update(low=None, low_iter=None, rise=None, final=None)
    accs = [r['acc_seg'] for r in records if r.get('acc_seg') is not None and ends and r['iter'] > ends[-1] - window]
    out['acc_final'] = sum(accs) / len(accs) if accs else None
    return out


def seg_profiles(rows: Sequence[dict], curves: Sequence[dict], floor_macc: float) -> List[dict]:
    """Per segmentor row with a curve, in the rows' order: its identity, mIoU, mAcc, whether it is at the
    all-background floor (mAcc below ``floor_macc``) and its :func:`profile`."""
    by_key: Dict[Key, List[dict]] = {}
    for c in curves:
        by_key.setdefault(identity(c), []).append(c)
    out = []
    for r in rows:
        recs = by_key.get(identity(r))
        if r.get('task') != 'seg' or r.get('status') != 'ok' or not recs:
            continue
        out.append(dict({k: r.get(k) for k in IDENTITY}, mIoU=r.get('mIoU'), mAcc=r.get('mAcc'),
                        floor=r.get('mAcc') is not None and r['mAcc'] < floor_macc, **profile(recs)))
    return out


def _f(v, digits=3):
    return '' if v is None else f'{v:.{digits}f}'


def seg_markdown(profiles: Sequence[dict], at: Sequence[int] = (500, 1000, 2000, 3000)) -> str:
    """The segmentors' training-loss table: one line per run."""
    head = ['layout', 'kernel', 'start', 'seed', 'mIoU', 'at the floor'] + [f'loss at {i}' for i in at] + \
        ['lowest (iteration)', 'final minus lowest', 'pixel acc. last 100 it.']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for p in profiles:
        cells = [p['layout'], f"`{p['kernel']}`", p['start'], str(p['seed']), _f(p['mIoU'], 1),
                 'yes' if p['floor'] else 'no'] + [_f(p.get(f'loss_{i}')) for i in at] + \
            [f"{_f(p['low'])} ({p['low_iter']})" if p['low'] is not None else '', _f(p['rise']),
             _f(p['acc_final'], 1)]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def plot_seg(profiles: Sequence[dict], curves: Sequence[dict], path: str, window: int = WINDOW) -> Optional[str]:
    """One panel per (layout, kernel, start) with segmentor curves: each seed's loss (mean over ``window``
    iterations) against the iteration; seeds at the floor in red, dashed."""
    if not profiles:
        return None
    import matplotlib.pyplot as plt

    from . import plots
    by_key: Dict[Key, List[dict]] = {}
    for c in curves:
        by_key.setdefault(identity(c), []).append(c)
    panels = list(dict.fromkeys((p['layout'], p['kernel'], p['start']) for p in profiles))
    cols = min(4, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, (layout, kernel, start) in zip([a for r in axes for a in r], panels):
        for p in profiles:
            if (p['layout'], p['kernel'], p['start']) != (layout, kernel, start):
                continue
            recs = sorted(by_key[identity(p)], key=lambda r: r['iter'])
            xs = [r['iter'] for r in recs if r['iter'] >= recs[0]['iter'] + window - 1]
            ys = [loss_at(recs, i, window) for i in xs]
            ax.plot(xs, ys, color='tab:red' if p['floor'] else 'tab:blue', linestyle='--' if p['floor'] else '-',
                    linewidth=1, label=f"seed {p['seed']}" + (' (floor)' if p['floor'] else ''))
        ax.set_title(f'{layout} {kernel} ({start})', fontsize=8)
        ax.set_xlabel('iteration', fontsize=7)
        ax.set_ylabel(f'training loss, mean over {window} it.', fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in [a for r in axes for a in r][len(panels):]:
        ax.axis('off')
    return plots.save(fig, path)
