"""The warm-start grid's rows read and summarised (softfree_mm.analysis.warm_start makes them): the stage-1 curves
of a run, the detectors' CSV, the summary per backbone, kernel, start and budget, and the recipe rule's version 1
choice of a default; warm_start_report.py and warm_start_plots.py write them out."""
import csv
import os.path as osp
from typing import Dict, List

from .stats import mean_std, paired as paired_interval
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
