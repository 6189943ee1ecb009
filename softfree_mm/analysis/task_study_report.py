"""The detection and segmentation study's report (softfree_mm/analysis/task_study.py runs it): the summary per
layout, task, kernel and start with paired differences to softmax, the tables, the lines comparing starts and set-ups,
the plot, the generated section of docs/study.md and the files under --out.
"""
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from .stats import interval, mean_std
from .study import error_cell
from .task_study import COLUMNS, KEY, LAYOUTS, METRICS, PRIMARY, REFERENCE, TASKS


def summarise(rows: List[dict], reference: str = REFERENCE) -> List[dict]:
    """One entry per (layout, task, kernel, start, recipe), in row order: n (seeds with a result), the failed and unfit
    seeds, each metric's mean and sample std, the classifier's mean top-1; per primary metric the paired difference to
    ``reference`` (its scratch row of the same layout and task), seed by seed over the seeds both have: mean, sample
    std, the 95 % t-interval of the mean, how many seeds are above, and whether the interval holds zero (within the
    seeds' spread)."""
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r['layout'], r['task'], r['kernel'], r['start'], r.get('recipe', '')), []).append(r)
    out = []
    for (layout, task, kernel, start, recipe), rs in groups.items():
        ok = [r for r in rs if r['status'] == 'ok']
        e = dict(layout=layout, task=task, kernel=kernel, start=start, recipe=recipe, n=len(ok),
                 failed=sum(r['status'] == 'failed' for r in rs), unfit=sum(r['status'] == 'unfit' for r in rs),
                 error=next((r['error'] for r in rs if r['status'] != 'ok'), ''))
        e['cls_top1'] = mean_std([r.get('cls_top1') for r in ok])[0]
        for m in METRICS[task]:
            e[m], e[m + '_std'], _ = mean_std([r.get(m) for r in ok])
        e['by_seed'] = {r['seed']: r for r in ok}
        out.append(e)
    for e in out:
        ref = next((r for r in out if (r['layout'], r['task'], r['kernel'], r['start']) ==
                    (e['layout'], e['task'], reference, 'scratch')), None)
        for m in PRIMARY[e['task']]:
            d = [] if ref is None or ref is e else [
                e['by_seed'][s][m] - ref['by_seed'][s][m] for s in sorted(e['by_seed'])
                if s in ref['by_seed'] and e['by_seed'][s].get(m) is not None and ref['by_seed'][s].get(m) is not None]
            i = interval(d, 'seeds')  # the seed is the unit: a seed's runs share its data order and start
            e[f'd_{m}'], e[f'd_{m}_std'], e[f'd_{m}_n'] = i.mean, mean_std(d)[1], i.n
            e[f'd_{m}_ci'] = None if i.half is None else (i.low, i.high)
            e[f'd_{m}_above'] = sum(x > 0 for x in d)
            e[f'd_{m}_within'] = i.holds_zero
    return out


def _pm(mean, std, digits):
    if mean is None:
        return ''
    return f'{mean:.{digits}f}' + ('' if std is None else f' ± {std:.{digits}f}')


def _paired_cell(e: dict, m: str, digits: int) -> str:
    if e[f'd_{m}'] is None:
        return ''
    ci = e[f'd_{m}_ci']
    text = f"{_pm(e[f'd_{m}'], e[f'd_{m}_std'], digits)}, {e[f'd_{m}_above']} of {e[f'd_{m}_n']} seeds above"
    if ci is not None:
        text += f"; 95 % [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]" + (
            f": no difference detectable at n = {e[f'd_{m}_n']}, half-width {(ci[1] - ci[0]) / 2:.{digits}f}"
            if e[f'd_{m}_within'] else ': excludes zero')
    return text


def floor_seeds(e: dict) -> int:
    """Seeds of a segmentation row at the background-only floor: mAcc within half a point of one class of eleven
    (the segmentor predicts background everywhere)."""
    return sum(r.get('mAcc') is not None and r['mAcc'] < FLOOR_MACC for r in e.get('by_seed', {}).values())


FLOOR_MACC = 100 / 11 + 0.5


TITLES = {'det': 'demo Mask R-CNN, COCO mAP on the demo val set (100 images)',
          'seg': 'demo Semantic FPN, mIoU % over background and ten digits on the demo val scenes (50 images)'}


def markdown(summary: List[dict], titles: Optional[Dict[str, str]] = None, reference: str = REFERENCE) -> str:
    """One table per layout and task: each (kernel, start) row with the classifier's top-1, the task's metrics (mean
    ± sample std over seeds) and the paired difference to ``reference`` from scratch."""
    out = []
    for layout in dict.fromkeys(e['layout'] for e in summary):
        for task in dict.fromkeys(e['task'] for e in summary if e['layout'] == layout):
            head = (titles or {}).get(layout, LAYOUTS[layout].title if layout in LAYOUTS else layout)
            out.append(f'### {head}: {TITLES[task]}')
            out.append('')
            prim = PRIMARY[task]
            digits = 3 if task == 'det' else 1
            cols = ['kernel', 'start', 'recipe', 'n', 'classifier top-1 %', *prim, *(f'paired Δ {m} vs {reference}'
                                                                                     for m in prim)]
            if task == 'seg':
                cols.append('seeds at the background floor')
            out.append('| ' + ' | '.join(cols) + ' |')
            out.append('|' + '---|' * len(cols))
            for e in summary:
                if (e['layout'], e['task']) != (layout, task):
                    continue
                if not e['n']:
                    what = 'does not fit' if e['unfit'] else 'failed' if e['failed'] else 'not run yet'
                    err = error_cell(e['error'])
                    out.append(f"| `{e['kernel']}` | {e['start']} | {e['recipe']} | 0 | {what}"
                               f"{': ' + err if err else ''} |" + ' |' * (len(cols) - 5))
                    continue
                note = f" ({e['failed']} failed)" if e['failed'] else ''
                cells = [f"`{e['kernel']}`", e['start'], e['recipe'], f"{e['n']}{note}",
                         '' if e['cls_top1'] is None else f"{e['cls_top1']:.1f}",
                         *(_pm(e[m], e[m + '_std'], digits) for m in prim),
                         *('reference' if (e['kernel'], e['start']) == (reference, 'scratch') else
                           _paired_cell(e, m, digits) for m in prim)]
                if task == 'seg':
                    cells.append(f"{floor_seeds(e)} of {e['n']}")
                out.append('| ' + ' | '.join(cells) + ' |')
            out.append('')
    return '\n'.join(out).rstrip() + '\n'


def _start(e: dict) -> str:
    """A row's start, and its recipe where it is a warm start."""
    return e['start'] if e['start'] == 'scratch' else f"{e['start']}: {e['recipe']}"


def _signed(x: float) -> str:
    """A paired difference, 3 significant digits; a mean of differences that cancel to rounding error is +0."""
    return f'{0.0 if abs(x) < 5e-9 else x:+.3g}'


def within_and_extremes(summary: List[dict]) -> List[str]:
    """Per layout and task: which rows are within the seeds' spread of softmax (the paired 95 % interval holds zero),
    which have no interval yet (one seed), and the range of the paired differences (one line each, for the note and
    the docs)."""
    lines = []
    for layout in dict.fromkeys(e['layout'] for e in summary):
        for task in dict.fromkeys(e['task'] for e in summary if e['layout'] == layout):
            for m in PRIMARY[task]:
                rows = [e for e in summary if (e['layout'], e['task']) == (layout, task) and e.get(f'd_{m}') is not None]
                if not rows:
                    continue
                inside = [f"{e['kernel']} ({_start(e)})" for e in rows if e[f'd_{m}_within']]
                outside = [f"{e['kernel']} ({_start(e)}) {_signed(e[f'd_{m}'])}" for e in rows
                           if e[f'd_{m}_within'] is False]
                unjudged = [f"{e['kernel']} ({_start(e)})" for e in rows if e[f'd_{m}_within'] is None]
                hi = max(rows, key=lambda e: e[f'd_{m}'])
                lo = min(rows, key=lambda e: e[f'd_{m}'])
                line = (f"{layout} {task} {m}: no difference from softmax detectable (the interval holds zero): "
                        f"{', '.join(inside) or 'none'}; interval excludes zero: {', '.join(outside) or 'none'}")
                if unjudged:
                    line += f"; no interval (one seed): {', '.join(unjudged)}"
                if hi is lo:
                    line += f"; the paired difference {_signed(hi[f'd_{m}'])} ({hi['kernel']}, {_start(hi)})"
                else:
                    line += (f"; paired differences from {_signed(lo[f'd_{m}'])} ({lo['kernel']}, {_start(lo)}) to "
                             f"{_signed(hi[f'd_{m}'])} ({hi['kernel']}, {_start(hi)})")
                lines.append(line)
    return lines


def starts_compared(summary: List[dict]) -> List[str]:
    """Per layout, task and kernel with a warm start: each warm start minus the same kernel from scratch, paired by
    seed, the 95 % interval over seeds (the starts compared with each other directly, not each against softmax)."""
    lines = []
    for e in summary:
        if e['start'] == 'scratch' or not e['n']:
            continue
        base = next((b for b in summary if (b['layout'], b['task'], b['kernel'], b['start']) ==
                     (e['layout'], e['task'], e['kernel'], 'scratch')), None)
        if base is None:
            continue
        parts = []
        for m in PRIMARY[e['task']]:
            d = [e['by_seed'][k][m] - base['by_seed'][k][m] for k in sorted(e['by_seed'])
                 if k in base['by_seed'] and e['by_seed'][k].get(m) is not None
                 and base['by_seed'][k].get(m) is not None]
            i = interval(d, 'seeds')
            if i.mean is not None:
                parts.append(f'{m} {i.text(3 if e["task"] == "det" else 1)}')
        if parts:
            lines.append(f"{e['layout']} {e['task']} {e['kernel']}: {_start(e)} minus scratch: " + '; '.join(parts))
    return lines


def _paired(e: dict, base: dict, m: str, minus: Optional[Tuple[dict, dict]] = None) -> List[float]:
    """Per seed both rows have ``m``: e - base, or with ``minus`` = (e's reference, base's reference)
    (e - e's reference) - (base - base's reference), over the seeds all four have."""
    rows = [e, base] + (list(minus) if minus else [])
    seeds = [k for k in sorted(e['by_seed']) if all(k in r['by_seed'] and r['by_seed'][k].get(m) is not None
                                                   for r in rows)]
    if minus:
        return [(e['by_seed'][k][m] - minus[0]['by_seed'][k][m]) - (base['by_seed'][k][m] - minus[1]['by_seed'][k][m])
                for k in seeds]
    return [e['by_seed'][k][m] - base['by_seed'][k][m] for k in seeds]


def layouts_compared(summary: List[dict]) -> List[str]:
    """Per row of a layout that starts from another layout's classifiers (pvt_n64 from pvt's: the same classifier
    per seed, another segmentor set-up), paired by seed: the row minus the same (task, kernel, start) in the other
    layout, and for a kernel other than the reference its difference to the reference in this layout minus that in
    the other (does the set-up move the kernel's gap to softmax?); the seeds at the floor in both."""
    lines = []
    for e in summary:
        other = LAYOUTS[e['layout']].classifiers if e['layout'] in LAYOUTS else None
        if not other or not e['n']:
            continue
        key = (e['task'], e['kernel'], e['start'])
        base = next((b for b in summary if b['layout'] == other and (b['task'], b['kernel'], b['start']) == key), None)
        if base is None or not base['n']:
            continue
        refs = [next((r for r in summary if (r['layout'], r['task'], r['kernel'], r['start']) ==
                      (x, e['task'], REFERENCE, 'scratch')), None) for x in (e['layout'], other)]
        digits = 3 if e['task'] == 'det' else 1
        parts = []
        for m in PRIMARY[e['task']]:
            i = interval(_paired(e, base, m), 'seeds')
            if i.mean is not None:
                parts.append(f'{m} {i.text(digits)}')
            if e['kernel'] != REFERENCE and all(r is not None and r['n'] for r in refs):
                j = interval(_paired(e, base, m, minus=tuple(refs)), 'seeds')
                if j.mean is not None:
                    parts.append(f'its paired Δ {m} vs {REFERENCE} minus that in {other} {j.text(digits)}')
        if e['task'] == 'seg':
            parts.append(f"seeds at the floor {floor_seeds(e)} of {e['n']} (in {other}: "
                         f"{floor_seeds(base)} of {base['n']})")
        if parts:
            lines.append(f"{e['layout']} {e['task']} {e['kernel']} ({_start(e)}) minus {other}: " + '; '.join(parts))
    return lines


def interval_count(lines: Sequence[str]) -> int:
    """The 95 % intervals written in ``lines`` (each ends its text with '(95 %, n = ...)')."""
    return sum(line.count('(95 %, n = ') for line in lines)


# ---------------------------------------------------------------------------------------------- outputs
def plot(rows: List[dict], summary: List[dict], path: str) -> str:
    """One row of panels per layout, one panel per primary metric of each task: per (kernel, start) the seeds'
    values (dots) and their mean (bar), softmax's mean as a dashed line; kernels that do not fit named in grey."""
    import matplotlib.pyplot as plt

    from . import plots
    from .study_plots import _colours
    layouts = list(dict.fromkeys(e['layout'] for e in summary))
    panels = [(t, m) for t in TASKS for m in PRIMARY[t] if any(e['task'] == t for e in summary)]
    kernels = list(dict.fromkeys(e['kernel'] for e in summary))
    colours = _colours(kernels)
    width = max(5.0, 0.45 * max(sum(e['layout'] == x and e['task'] == panels[0][0] for e in summary)
                                for x in layouts) + 2.0)
    fig, axes = plt.subplots(len(layouts), len(panels), figsize=(width * len(panels), 4.2 * len(layouts)),
                             squeeze=False)
    for row, layout in enumerate(layouts):
        for col, (task, m) in enumerate(panels):
            ax = axes[row][col]
            entries = [e for e in summary if (e['layout'], e['task']) == (layout, task)]
            for i, e in enumerate(entries):
                if not e['n']:
                    ax.text(i, 0.02, 'does not fit' if e['unfit'] else 'failed', rotation=90, ha='center',
                            va='bottom', fontsize=7, color='grey', transform=ax.get_xaxis_transform())
                    continue
                ax.bar(i, e[m], 0.7, color=colours[e['kernel']], alpha=0.85 if e['start'] == 'scratch' else 0.45,
                       hatch=None if e['start'] == 'scratch' else '//')
                seeds = [r[m] for r in rows if (r['layout'], r['task'], r['kernel'], r['start'], r.get('recipe', '')) ==
                         (layout, task, e['kernel'], e['start'], e['recipe']) and r['status'] == 'ok'
                         and r.get(m) is not None]
                ax.scatter([i] * len(seeds), seeds, s=10, color='black', zorder=3)
                if (e['kernel'], e['start']) == (REFERENCE, 'scratch'):
                    ax.axhline(e[m], color='black', linestyle='--', linewidth=1)
            ax.set_xticks(range(len(entries)))
            ax.set_xticklabels([f"{e['kernel']}\n{_start(e)}" for e in entries], rotation=60, ha='right',
                               fontsize=7)
            ax.set_ylabel(m)
            ax.set_title(f"{LAYOUTS[layout].title if layout in LAYOUTS else layout}: {m}\nbar: mean over seeds "
                         '(hatched: warm start), dots: seeds, dashed: softmax', fontsize=8)
            ax.grid(True, axis='y', alpha=0.3)
    return plots.save(fig, path)


BEGIN, END = '<!-- task_study: made by tools/analysis/task_study.py, do not edit by hand -->', \
    '<!-- task_study: end -->'


def docs_section(summary: List[dict], out_rel: str, seg_profiles: Sequence[dict] = ()) -> str:
    """The generated part of docs/study.md's "Detection and segmentation" section: the tables, the plot, the
    lines saying what is within the seeds' spread; the segmentors' training losses where curves were kept."""
    lines = [BEGIN, '', markdown(summary).rstrip(), '',
             f'![detection and segmentation per kernel, seeds and means]({out_rel}/task_study.png)', '',
             'Against softmax, paired by seed (the 95 % interval over seeds; one that holds zero says no '
             'difference is detectable at that n, not parity), and the range of the paired differences:', '']
    lines += [f'- {line}' for line in within_and_extremes(summary)]
    compared = starts_compared(summary)
    if compared:
        lines += ['', 'The starts against each other: each warm start minus the same kernel from scratch, paired by '
                  'seed:', '', *[f'- {line}' for line in compared]]
    across = layouts_compared(summary)
    if across:
        lines += ['', 'The set-ups against each other: a layout that starts from another\'s classifiers (the same '
                  'classifier per seed) minus that layout, paired by seed:', '', *[f'- {line}' for line in across]]
    from . import collapse_arms
    arms = collapse_arms.lines(summary, floor_seeds, {x: lay.title for x, lay in LAYOUTS.items()})
    if arms:
        lines += ['', 'The collapse\'s arms, by the rule stated before their runs (the section "The collapse\'s arms '
                  'with controls that train" below):', '', *[f'- {line}' for line in arms]]
    count = sum(e.get(f'd_{m}_ci') is not None for e in summary for m in PRIMARY[e['task']])
    extra = interval_count(compared + across + arms)
    lines += ['', f'Multiplicity: these tables hold {count} paired intervals at 95 % each'
              + (f' and the lines above {extra} more' if extra else '') + f'; by chance alone about '
              f'{0.05 * (count + extra):.1f} of them would exclude zero where there is no difference.']
    if seg_profiles:
        from .task_curves import WINDOW, seg_markdown
        lines += ['', f'The segmentors\' training losses (each the mean of the logged losses over the {WINDOW} '
                  'iterations up to the one named; [curves.csv](' + out_rel + '/curves.csv) holds every record) for '
                  'the runs whose curves were kept (the rows made after the curves were; the earlier seeds\' logs '
                  'are gone):', '', seg_markdown(seg_profiles).rstrip(), '',
                  f'![segmentor training losses per seed]({out_rel}/seg_curves.png)']
    lines += ['', END]
    return '\n'.join(lines)


def write_docs(path: str, section: str) -> None:
    """Put ``section`` between the markers of ``path`` (appended with a heading when the page has none yet)."""
    from .docs_section import write_section
    write_section(path, section, BEGIN, END, 'Detection and segmentation')


def write_outputs(rows: List[dict], out: str, docs: Optional[str] = None, root: str = '',
                  curves: Optional[Sequence[dict]] = None, kept_from: Sequence[str] = ()) -> List[dict]:
    """runs.csv, summary.csv, table.md, versions.json (with the sets of the ``kept_from`` folders, whose rows it
    keeps) and task_study.png under ``out``; with ``curves`` (task_curves.merged's rows) also curves.csv and
    seg_curves.png; the section of ``docs``. Errors name the child configs under the work root, not this machine's
    path."""
    import os
    os.makedirs(out, exist_ok=True)
    prefix = osp.join(root, '') if root else None
    clean = [{k: (v.replace(prefix, '') if prefix and isinstance(v, str) else v) for k, v in r.items()} for r in rows]
    from .tables import write_csv
    write_csv(osp.join(out, 'runs.csv'), [{k: r.get(k) for k in COLUMNS} for r in clean], COLUMNS)
    from .grid_identity import write_identities
    write_identities(out, [('runs.csv', clean, KEY)])
    from ..engine.versions import write_versions
    write_versions(out, kept_from)
    summary = summarise(clean)
    flat = [{k: v for k, v in e.items() if k != 'by_seed'} for e in summary]
    write_csv(osp.join(out, 'summary.csv'), flat, list(dict.fromkeys(k for e in flat for k in e)))
    with open(osp.join(out, 'table.md'), 'w') as f:
        f.write(markdown(summary))
    if rows:
        plot(clean, summary, osp.join(out, 'task_study.png'))
    profiles = []
    if curves is not None:
        from . import task_curves as tc
        write_csv(osp.join(out, 'curves.csv'), list(curves), tc.CURVE_FIELDS)
        profiles = tc.seg_profiles(clean, curves, FLOOR_MACC)
        tc.plot_seg(profiles, curves, osp.join(out, 'seg_curves.png'))
    if docs:
        rel = osp.relpath(out, osp.dirname(docs))
        write_docs(docs, docs_section(summary, rel, profiles))
    return summary
