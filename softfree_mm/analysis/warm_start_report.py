"""The warm-start study's tables and figures (docs/warm_start.md) from its rows (softfree_mm.analysis.warm_start)."""
import csv
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

from .findings import GRID_TITLES
from .stats import mean_std, paired as paired_interval
from .stats import t_quantile as t95  # noqa: F401  (the name the grid's tests read)
from .sweep import json_records

SCRATCH_ITERS = 300  # the study's recipe


def transfer_curves(row: dict) -> List[dict]:
    """(iter, block, loss) of a stage-1 run's log: each block's transfer loss at every logged iteration."""
    out = []
    if not row.get('log') or not osp.isfile(row['log']):
        return out
    for rec in json_records(row['log']):
        for k, v in rec.items():
            if k.startswith('block_'):
                out.append(dict(iter=rec.get('step', rec.get('iter')), block=int(k[len('block_'):]), loss=v,
                                loss_transfer=rec.get('loss_transfer')))
    return out


DETECTOR_COLUMNS = ('kernel', 'start', 'seed', 'start_top1', 'status', 'error', 'wall_s', 'bbox_mAP', 'segm_mAP',
                    'bbox_mAP_50', 'segm_mAP_50')


def read_detectors(path: str) -> List[dict]:
    """The rows of an earlier grid's detectors.csv (numbers as floats, seeds as ints, blanks as None), marked as read
    from ``path`` with what made them (the file's ``source``, kept through every read): a grid that does not run its
    detectors again keeps them (--det-from)."""
    from softfree_mm.engine.errors import UsageError
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    missing = [c for c in DETECTOR_COLUMNS if c != 'error' and c not in (reader.fieldnames or ())]
    if missing:
        raise UsageError(f'{path}: not a detectors.csv of the warm-start grid: no column {", ".join(missing)} '
                         f'(it has {", ".join(reader.fieldnames or ()) or "none"})')
    from .grid_identity import Identities
    from .warm_start_keep import DETECTOR_KEY
    made = Identities(osp.dirname(osp.abspath(path)))  # the identities of the rows runs with one made
    out = []
    for r in rows:
        row = {k: r.get(k) or '' for k in ('kernel', 'start', 'status', 'error')}
        row['seed'] = int(r['seed'])
        row.update({k: float(r[k]) if r.get(k) not in (None, '') else None
                    for k in DETECTOR_COLUMNS[3:] if k not in ('status', 'error')})
        own = r.get('source') or ''  # what made the row: kept through every read
        row['source'] = own if own.startswith('read: ') else f'read: {osp.basename(path)}' + (f': {own}' if own else '')
        identity = made.get(osp.basename(path), row, DETECTOR_KEY)
        out.append(dict(row, identity=identity) if identity else row)
    return out


def _pm(m, s, digits=1):
    if m is None:
        return ''
    return f'{m:.{digits}f}' + ('' if s is None else f' ± {s:.{digits}f}')


def summarise(rows: List[dict]) -> List[dict]:
    """Per (backbone, kernel, start, iterations, groups): top-1 mean ± sample std over the seeds, and the paired
    difference to the same kernel from scratch (seed by seed, over the seeds both have)."""
    scratch = {(r['backbone'], r['kernel'], r['seed']): r['top1'] for r in rows if r['start'] == 'scratch'}
    groups: Dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r['backbone'], r['kernel'], r['start'], r['iters'], r['groups'], r.get('recipe') or ''),
                          []).append(r)
    out = []
    for (bb, k, start, iters, g, recipe), rs in groups.items():
        m, s, n = mean_std([r['top1'] for r in rs])
        diffs = [r['top1'] - scratch[(bb, k, r['seed'])] for r in rs
                 if r['top1'] is not None and scratch.get((bb, k, r['seed'])) is not None]
        dm, ds, dn = mean_std(diffs)
        out.append(dict(backbone=bb, kernel=k, start=start, iters=iters, groups=g, recipe=recipe, n=n, top1_mean=m,
                        top1_std=s,
                        vs_scratch_mean=dm if start != 'scratch' else None,
                        vs_scratch_std=ds if start != 'scratch' else None, paired_seeds=dn,
                        transfer_iters=rs[0].get('transfer_iters', 0),
                        source='+'.join(sorted({r.get('source', 'grid') for r in rs})),
                        failed=sum(r['status'] not in ('ok', 'not run') for r in rs),
                        not_run=sum(r['status'] == 'not run' for r in rs),
                        _top1=[r['top1'] for r in rs if r['top1'] is not None]))  # not a CSV column
    order = {'scratch': 0, 'swap': 1, 'transfer': 2}
    return sorted(out, key=lambda r: (r['backbone'], r['kernel'], order[r['start']], r['iters'], r['groups'],
                                      r['recipe']))


def own_groups(r: dict, default: str) -> bool:
    """Whether a transfer row trained its recipe's own stage-1 groups (not one of the groups comparison's others)."""
    from ..engine.warm_start import RECIPES
    rec = RECIPES.get(r.get('recipe') or default)
    return rec is None or r.get('groups') in (None, '', '+'.join(rec.groups))


def paired(values: Dict[tuple, float], against: Dict[tuple, float]):
    """(mean, half-width of the 95 % t-interval, n) of values[key] - against[key] over the keys both hold, each key
    its own unit (rule version 1's convention; version 2, ``recipe_rule.py``, takes the seed as the unit)."""
    i = paired_interval(values, against, 'pairs')
    return i.mean, i.half, i.n


def choose_default(rows: List[dict], default: str, budget: int, target: float = 1.0) -> Dict[str, dict]:
    """Per backbone, the warm-start recipe the rule of docs/warm_start.md picks at ``budget`` iterations (stated
    before the grid ran): another recipe replaces ``default`` when, paired by (kernel, seed) against it, its mean
    difference is positive and its 95 % interval excludes zero; or when it meets the ``target`` (within ``target``
    points of scratch, paired mean) for kernels where the default does not, and loses nowhere (per kernel, its mean
    difference to the default is above minus that kernel's interval). Otherwise the default stays."""
    top = {}
    for r in rows:
        if r['start'] == 'transfer' and r['iters'] == budget and r.get('top1') is not None and \
                own_groups(r, default):
            top.setdefault((r['backbone'], r.get('recipe') or default), {})[(r['kernel'], r['seed'])] = r['top1']
    scratch = {(r['backbone'], r['kernel'], r['seed']): r['top1'] for r in rows if r['start'] == 'scratch'}
    out = {}
    for bb in dict.fromkeys(r['backbone'] for r in rows):
        base = top.get((bb, default), {})
        kernels = sorted({k for k, _ in base})
        vs_scratch = {}
        for (b, rec), vals in top.items():
            if b == bb:
                for k in kernels:
                    vs_scratch[(rec, k)] = paired({s: v for (kk, s), v in vals.items() if kk == k},
                                                  {s: scratch.get((bb, k, s)) for (kk, s) in vals if kk == k})[0]
        misses = [k for k in kernels if vs_scratch.get((default, k)) is not None and
                  vs_scratch[(default, k)] < -target]
        verdicts = {}
        for (b, rec), vals in top.items():
            if b != bb or rec == default:
                continue
            m, half, n = paired(vals, base)
            better = m is not None and half is not None and m > 0 and m - half > 0
            meets = [k for k in misses if vs_scratch.get((rec, k)) is not None and vs_scratch[(rec, k)] >= -target]
            worst = []
            for k in kernels:
                km, kh, _ = paired({kk: v for kk, v in vals.items() if kk[0] == k},
                                   {kk: v for kk, v in base.items() if kk[0] == k})
                if km is not None and kh is not None and km < -kh:
                    worst.append(k)
            verdicts[rec] = dict(mean=m, half=half, n=n, better=better, meets=meets, loses=worst,
                                 replaces=better or (bool(meets) and not worst))
        winners = sorted((v['mean'], rec) for rec, v in verdicts.items() if v['replaces'])
        out[bb] = dict(default=default, chosen=winners[-1][1] if winners else default, misses=misses,
                       verdicts=verdicts)
    return out


def _cell(r: Optional[dict]) -> str:
    """'mean ± std' of a start, with its paired difference to scratch; n where a seed is missing."""
    if r is None or r['top1_mean'] is None:
        return 'failed' if r and r['failed'] else 'not run yet' if r and r.get('not_run') else ''
    from .findings import CHANCE_TOP1, median
    low = sum(v <= CHANCE_TOP1 for v in r.get('_top1', []))
    if 0 < low < len(r['_top1']):  # some seeds at chance, some not: a mean and a spread describe neither
        return f"median {median(r['_top1']):.1f}, {low} of {len(r['_top1'])} at chance" + (
            f' n = {r["n"]}' if r['failed'] or r.get('not_run') else '')
    cell = _pm(r['top1_mean'], r['top1_std'])
    if r['vs_scratch_mean'] is not None:
        spread = '' if r['vs_scratch_std'] is None else f' ± {r["vs_scratch_std"]:.1f}'
        cell += f' ({r["vs_scratch_mean"]:+.1f}{spread})'
    return cell + (f' n = {r["n"]}' if r['failed'] or r.get('not_run') else '')


def markdown(summary: List[dict], detectors: List[dict], groups: dict) -> str:
    """One table per backbone: a row per kernel, a column per start and budget, top-1 % mean ± std over the seeds
    and, in brackets, the paired difference to the same kernel from scratch; then the groups and the detectors."""
    lines = ['Top-1 % on the digits validation set, mean ± sample std over the seeds (where some seeds are at chance '
             'and some not, the median and how many at chance instead); in brackets the paired '
             'difference to the same kernel from scratch, seed by seed. A column is a start and its iterations '
             f'against the {SCRATCH_ITERS} from scratch (in brackets: of them stage 1). *: the from-scratch runs are '
             'the kernel study\'s (all seeds); **: some seeds\' are (the others the grid\'s).', '']
    chosen = '+'.join(groups.get('chosen', []))
    default = groups.get('recipe', '')
    for bb in dict.fromkeys(r['backbone'] for r in summary):
        mine = [r for r in summary if r['backbone'] == bb and (r['start'] != 'transfer' or (
            r['groups'] == chosen and r['recipe'] in ('', default)))]
        soft = next((r for r in mine if r['kernel'] == 'softmax'), None)
        cols = list(dict.fromkeys((r['start'], r['iters'], r['transfer_iters']) for r in mine
                                  if r['kernel'] != 'softmax'))
        names = {'scratch': 'scratch', 'swap': 'swap', 'transfer': 'transfer'}
        head = [f'{names[st]}, {it}' + (f' ({tr})' if tr else '') + (' (as it is)' if st == 'swap' and not it else '')
                for st, it, tr in cols]
        lines += [f'### {GRID_TITLES.get(bb, bb)}', '',
                  f'Softmax from scratch (the teacher): {_pm(soft["top1_mean"], soft["top1_std"])} % top-1, '
                  f'n = {soft["n"]}.' if soft else '', '',
                  '| kernel | ' + ' | '.join(head) + ' |', '|---' * (len(cols) + 1) + '|']
        for k in dict.fromkeys(r['kernel'] for r in mine if r['kernel'] != 'softmax'):
            by = {(r['start'], r['iters'], r['transfer_iters']): r for r in mine if r['kernel'] == k}
            src = by.get(('scratch', SCRATCH_ITERS, 0), {}).get('source')
            mark = ' *' if src == 'study' else ' **' if 'study' in (src or '').split('+') else ''
            lines.append(f'| {k}{mark} | ' + ' | '.join(_cell(by.get(c)) for c in cols)
                         + ' |')
        lines.append('')
    others = [r for r in summary if r['start'] == 'transfer' and r['recipe'] not in ('', default)]
    if others:
        lines += ['### The recipes', '', f'Transfer + fine-tune top-1 % per recipe (measured against `{default}`), '
                  'mean ± sample std over the seeds, in brackets the paired difference to scratch.', '']
        for bb in dict.fromkeys(r['backbone'] for r in others):
            recs = [default, *dict.fromkeys(r['recipe'] for r in others if r['backbone'] == bb)]
            budgets = sorted({r['iters'] for r in others if r['backbone'] == bb})
            cols = [(rec, b) for rec in recs for b in budgets]
            lines += [f'#### {GRID_TITLES.get(bb, bb)}', '',
                      '| kernel | ' + ' | '.join(f'{rec}, {b}' for rec, b in cols) + ' |',
                      '|---' * (len(cols) + 1) + '|']
            for k in dict.fromkeys(r['kernel'] for r in others if r['backbone'] == bb):
                by = {(r['recipe'] or default, r['iters']): r for r in summary if r['backbone'] == bb and
                      r['kernel'] == k and r['start'] == 'transfer' and own_groups(r, default)}
                lines.append(f'| {k} | ' + ' | '.join(_cell(by.get(c)) for c in cols) + ' |')
            lines.append('')
        verdict = groups.get('default_choice') or {}
        for bb, v in verdict.items():
            parts = []
            for rec, x in v['verdicts'].items():
                if x['mean'] is None:
                    continue
                ci = '' if x['half'] is None else f' [{x["mean"] - x["half"]:+.1f}, {x["mean"] + x["half"]:+.1f}]'
                parts.append(f'{rec} {x["mean"]:+.1f}{ci} (n = {x["n"]})' + (', meets the target where the default '
                             f'misses: {", ".join(x["meets"])}' if x['meets'] else '') +
                             (f', loses on {", ".join(x["loses"])}' if x['loses'] else ''))
            lines.append(f'{GRID_TITLES.get(bb, bb)}, by the rule\'s version 1 (superseded: it counts the (kernel, '
                         f'seed) pairs as independent units; version 2 above): paired against `{v["default"]}` at the '
                         'larger budget, 95 % interval over pairs: ' + ('; '.join(parts) or 'no pairs yet')
                         + f'. Version 1 would take `{v["chosen"]}`.')
            lines.append('')
    if groups.get('scores'):
        lines += ['### What stage 1 trains', '', '| groups | top-1 % after the fine-tune (both backbones, all seeds) |',
                  '|---|---|']
        for g, v in groups['scores'].items():
            m, s, n = mean_std(v)
            lines.append(f'| {g} | {_pm(m, s)} (n = {n}) |')
        lines += ['', f'The recipe trains {"+".join(groups["chosen"])} (its definition: this comparison, on x^3 '
                  'alone, does not choose; `transfer-blocks` is measured on every kernel by the rule).', '']
    if detectors:
        lines += ['### The demo Mask R-CNN from each start', '',
                  '| kernel | backbone start | n | the start\'s top-1 % | bbox mAP | segm mAP |',
                  '|---|---|---|---|---|---|']
        keys = dict.fromkeys((d['kernel'], d['start']) for d in detectors)
        for k, start in keys:
            rs = [d for d in detectors if d['kernel'] == k and d['start'] == start]
            bm, bs, n = mean_std([d['bbox_mAP'] for d in rs])
            sm, ss, _ = mean_std([d['segm_mAP'] for d in rs])
            tm, ts, _ = mean_std([d.get('start_top1') for d in rs])
            lines.append(f'| {k} | {start} | {n} | {_pm(tm, ts)} | {_pm(bm, bs, 3)} | {_pm(sm, ss, 3)} |')
        lines.append('')
    return '\n'.join(lines)


def plots(summary: List[dict], curves: List[dict], out: str, groups: str = '') -> List[str]:
    """accuracy.png (top-1 against the iterations of each start, per backbone and kernel) and
    transfer_curves.png (each block's stage-1 loss over its iterations, mean over seeds, of the runs that train
    ``groups``)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    made = []
    bbs = list(dict.fromkeys(r['backbone'] for r in summary))
    if bbs:
        fig, axes = plt.subplots(1, len(bbs), figsize=(6 * len(bbs), 4.2), squeeze=False)
        for ax, bb in zip(axes[0], bbs):
            kernels = [k for k in dict.fromkeys(r['kernel'] for r in summary if r['backbone'] == bb) if k != 'softmax']
            for i, k in enumerate(kernels):
                color = f'C{i}'
                for start, style in (('swap', '--'), ('transfer', '-')):
                    pts = sorted((r['iters'], r['top1_mean']) for r in summary if r['backbone'] == bb and
                                 r['kernel'] == k and r['start'] == start and r['top1_mean'] is not None)
                    if pts:
                        ax.plot(*zip(*pts), style, marker='o', color=color, label=f'{k} {start}')
                sc = [r for r in summary if r['backbone'] == bb and r['kernel'] == k and r['start'] == 'scratch']
                if sc and sc[0]['top1_mean'] is not None:
                    ax.plot([sc[0]['iters']], [sc[0]['top1_mean']], marker='*', markersize=12, color=color,
                            linestyle='none')
            ax.set_title(f'{bb}: swap (--), transfer (-), scratch (*)')
            ax.set_xlabel('iterations (transfer included)')
            ax.set_ylabel('top-1 %')
            ax.legend(fontsize=6)
        fig.tight_layout()
        path = osp.join(out, 'accuracy.png')
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    if groups:  # the main runs' stage 1 (the groups comparison's other runs left out)
        curves = [c for c in curves if c['groups'] == groups]
    if curves:
        rows = list(dict.fromkeys(c['backbone'] for c in curves))
        cols = max(len({c['kernel'] for c in curves if c['backbone'] == bb}) for bb in rows)
        fig, axes = plt.subplots(len(rows), cols, figsize=(3.2 * cols, 3.0 * len(rows)), squeeze=False)
        big = max(c['iters'] for c in curves)
        for i, bb in enumerate(rows):
            kernels = list(dict.fromkeys(c['kernel'] for c in curves if c['backbone'] == bb))
            for ax in axes[i][len(kernels):]:
                ax.axis('off')
            for ax, k in zip(axes[i], kernels):
                sel = [c for c in curves if c['backbone'] == bb and c['kernel'] == k and c['iters'] == big]
                for b in sorted({c['block'] for c in sel}):
                    pts: Dict[int, list] = {}
                    for c in sel:
                        if c['block'] == b and c['iter'] is not None:
                            pts.setdefault(c['iter'], []).append(c['loss'])
                    xs = sorted(pts)
                    ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], color=matplotlib.cm.viridis(b / 12),
                            lw=1)
                ax.set_yscale('log')
                ax.set_title(f'{bb} {k} (block 0 dark .. last light)', fontsize=7)
                ax.set_xlabel('stage-1 iteration', fontsize=7)
            axes[i][0].set_ylabel('block loss (relative error)', fontsize=8)
        fig.tight_layout()
        path = osp.join(out, 'transfer_curves.png')
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def recipes_plot(rows: List[dict], default: str, out: str) -> Optional[str]:
    """recipes.png: per backbone (columns) and budget (rows), each recipe's paired difference to scratch per kernel
    (bar: mean over seeds, line: its 95 % interval), the 1-point target dashed; None without a second recipe."""
    recs = list(dict.fromkeys([default] + [r.get('recipe') or default for r in rows if r['start'] == 'transfer'
                                           and own_groups(r, default)]))
    if len(recs) < 2:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    scratch = {(r['backbone'], r['kernel'], r['seed']): r['top1'] for r in rows if r['start'] == 'scratch'}
    bbs = list(dict.fromkeys(r['backbone'] for r in rows if r['start'] == 'transfer' and (r.get('recipe') or default)
                             != default))
    budgets = sorted({r['iters'] for r in rows if r['start'] == 'transfer'})
    fig, axes = plt.subplots(len(budgets), len(bbs), figsize=(5.5 * len(bbs), 3.4 * len(budgets)), squeeze=False)
    width = 0.8 / len(recs)
    for i, b in enumerate(budgets):
        for j, bb in enumerate(bbs):
            ax = axes[i][j]
            kernels = list(dict.fromkeys(r['kernel'] for r in rows if r['backbone'] == bb and r['start'] == 'transfer'
                                         and (r.get('recipe') or default) != default))
            for n, rec in enumerate(recs):
                for x, k in enumerate(kernels):
                    vals = {r['seed']: r['top1'] for r in rows if (r['backbone'], r['kernel'], r['iters']) == (bb, k, b)
                            and r['start'] == 'transfer' and (r.get('recipe') or default) == rec
                            and own_groups(r, default)}
                    m, half, _ = paired(vals, {s: scratch.get((bb, k, s)) for s in vals})
                    if m is None:
                        continue
                    pos = x - 0.4 + width * (n + 0.5)
                    ax.bar(pos, m, width, color=f'C{n}', label=rec if x == 0 else None)
                    if half is not None:
                        ax.plot([pos, pos], [m - half, m + half], color='black', lw=0.8)
            ax.axhline(0, color='black', lw=0.6)
            ax.axhline(-1, color='grey', lw=0.8, linestyle='--')
            ax.set_xticks(range(len(kernels)))
            ax.set_xticklabels(kernels, fontsize=7, rotation=20)
            ax.set_title(f'{bb}, {b} of {SCRATCH_ITERS} iterations: top-1 minus scratch (paired by seed)', fontsize=8)
            ax.set_ylabel('points')
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
    fig.tight_layout()
    path = osp.join(out, 'recipes.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


BEGIN = '<!-- warm_start_grid: made by tools/analysis/warm_start_grid.py, do not edit by hand -->'
END = '<!-- warm_start_grid: end -->'


def docs_section(table: str, out_rel: str, made: List[str]) -> str:
    """The generated part of docs/warm_start.md's evidence: the grid's table.md and its plots."""
    names = {'accuracy.png': 'top-1 against iterations', 'recipes.png': 'each recipe against scratch, paired by seed',
             'transfer_curves.png': 'stage-1 loss per block'}
    lines = [BEGIN, '', table.rstrip(), '']
    for path in made:
        name = osp.basename(path)
        lines += [f'![{names.get(name, name)}]({out_rel}/{name})', '']
    return '\n'.join(lines + [END])


def compute_line(result: dict) -> str:
    """What the grid's own runs took: their count and wall-clock seconds added up (the study's rows not counted)."""
    own = [r for r in result['rows'] if r.get('source', 'grid') == 'grid' and r.get('wall_s')]
    stage1 = [r for r in result['rows'] if r.get('transfer_wall_s')]
    dets = [d for d in result['detectors'] if d.get('wall_s') and d.get('source', 'grid') == 'grid']
    total = sum(r['wall_s'] for r in own) + sum(r['transfer_wall_s'] for r in stage1) + sum(d['wall_s'] for d in dets)
    studied = sum(r.get('source') == 'study' for r in result['rows'])
    return (f'The grid\'s runs: {len(own)} classifier runs and evaluations, {len(stage1)} stage-1 runs, {len(dets)} '
            f'detectors (train + test); their wall-clock times add up to {total / 3600:.1f} h (two run at a time). '
            f'{studied} from-scratch rows are the kernel study\'s runs, read, not run again.'
            + (f' The {len(result["detectors"]) - len(dets)} detector rows are read from an earlier grid\'s '
               f'{result["detectors"][0]["source"][len("read: "):]} (--det-from), not run again.'
               if len(dets) < len(result['detectors']) else ''))


def write_outputs(result: dict, out: str, plan, docs: Optional[str] = None, kept_from: Sequence[str] = ()) -> None:
    """The CSVs, versions.json (with the sets of the ``kept_from`` folders, whose rows it reads), table.md and the
    plots under ``out``; the section of ``docs`` between its markers."""
    os.makedirs(out, exist_ok=True)
    root = osp.join(plan.r.root, '')

    def cell(v):  # a run's error names its child config: under the work dir, not this machine's path
        return '' if v is None else v.replace(root, '') if isinstance(v, str) else v

    for name, rows in (('classifiers', result['rows']), ('detectors', result['detectors']),
                       ('transfer_curves', result['curves'])):
        fields = list(dict.fromkeys(k for r in rows for k in r if k not in ('key', 'error', 'identity'))) + ['error']
        fields = [f for f in fields if any(f in r for r in rows)] or ['status']
        with open(osp.join(out, f'{name}.csv'), 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction='ignore')
            w.writeheader()
            for r in rows:
                w.writerow({k: cell(r.get(k)) for k in fields})
    # which rows runs with an identity made (the kept rows made before identities have none): beside the CSVs
    from .grid_identity import write_identities
    from .warm_start_keep import CLASSIFIER_KEY, DETECTOR_KEY
    write_identities(out, [('classifiers.csv', result['rows'], CLASSIFIER_KEY),
                           ('detectors.csv', result['detectors'], DETECTOR_KEY)])
    from ..engine.versions import write_versions
    write_versions(out, kept_from)
    groups = dict(chosen=list(result['groups']), scores={'+'.join(g): v for g, v in result['scores'].items()},
                  budgets=plan.budgets, recipe=plan.recipe.name, recipes=[r.name for r in plan.recipes])
    if plan.recipes:
        groups['default_choice'] = choose_default(result['rows'], plan.recipe.name, plan.budgets[-1])
    with open(osp.join(out, 'groups.json'), 'w') as f:
        json.dump(groups, f, indent=1)
    summary = summarise(result['rows'])
    fields = [k for k in summary[0] if not k.startswith('_')] if summary else ['backbone']
    with open(osp.join(out, 'summary.csv'), 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction='ignore')
        w.writeheader()
        for r in summary:
            w.writerow({k: ('' if r.get(k) is None else r[k]) for k in fields})
    table = compute_line(result) + '\n\n' + markdown(summary, result['detectors'], groups)
    with open(osp.join(out, 'table.md'), 'w') as f:
        f.write(table)
    made = plots(summary, result['curves'], out, '+'.join(result['groups']))
    rec = recipes_plot(result['rows'], plan.recipe.name, out)
    made[1:1] = [rec] if rec else []
    if docs:
        from .docs_section import write_section
        write_section(docs, docs_section(table, osp.relpath(out, osp.dirname(docs)), made), BEGIN, END,
                      'The evidence at small scale')
