"""The warm-start study's tables and docs section (docs/warm_start.md) and its files under --out, from its rows
(softfree_mm.analysis.warm_start; read and summarised in warm_start_rows.py, drawn in warm_start_plots.py)."""
import csv
import json
import os
import os.path as osp
from typing import List, Optional, Sequence

from .findings import GRID_TITLES
from .stats import mean_std
from .warm_start_plots import plots, recipes_plot
from .warm_start_rows import SCRATCH_ITERS, _pm, choose_default, own_groups, summarise

BEGIN = '<!-- warm_start_grid: made by tools/analysis/warm_start_grid.py, do not edit by hand -->'
END = '<!-- warm_start_grid: end -->'


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
