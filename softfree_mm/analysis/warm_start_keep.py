"""The rows an earlier warm-start grid committed, kept instead of run again (``warm_start_grid.py --keep-from``).

A kept run is identified by what made it: backbone, kernel, seed, start, iterations, recipe and stage-1 groups (the
row's own columns), never by a folder's name. Its teacher is identified by its from-scratch softmax row of the same
backbone and seed: a row is kept only with its teacher's, and a teacher the grid trains again for new runs must give
that row's top-1 exactly (``check_teacher``), else the new runs would not share the kept ones' teacher and the
seed-paired comparisons would pair runs of two different teachers. A kept row that a run with an identity made keeps
that identity (the folder's identities.csv, :mod:`.grid_identity`); the committed rows made before identities have
none.
"""
import csv
import os.path as osp
from typing import Dict, List, Optional, Tuple

from ..engine.errors import UsageError
from .kept import read_kept

Key = Tuple[str, str, int, str, int, str, str]  # backbone, kernel, seed, start, iters, recipe, groups
CLASSIFIER_KEY = ('backbone', 'kernel', 'seed', 'start', 'iters', 'recipe', 'groups')  # a classifiers.csv row's key
DETECTOR_KEY = ('kernel', 'start', 'seed')  # a detectors.csv row's key
NEEDED = (*CLASSIFIER_KEY, 'status', 'top1', 'source')


def row_key(backbone: str, kernel: str, seed: int, start: str, iters: int, recipe: str = '', groups: str = '') -> Key:
    return (backbone, kernel, int(seed), start, int(iters), recipe or '', groups or '')


def _num(v) -> Optional[float]:
    return float(v) if v not in (None, '') else None


class Kept:
    """The finished rows of an earlier grid's classifiers.csv, and the stage-1 curves of its transfer_curves.csv, in
    the run form the grid's phases return (``None`` where nothing is kept). A finished run is one that ended: 'ok' with
    its top-1, or 'failed' with its error (a refusal such as stage-1 groups that select nothing fails the same way
    every time, and retrying it would train its teacher again for nothing: drop the row to run it again); rows 'not
    run' are not kept."""

    def __init__(self, folder: str):
        path = osp.join(folder, 'classifiers.csv')
        if not osp.isfile(path):
            raise UsageError(f'--keep-from {folder}: no classifiers.csv there (an earlier grid\'s --out folder)')
        # each with the identity a run made it with (none before identities)
        rows = read_kept(path, CLASSIFIER_KEY, NEEDED,
                         f'--keep-from {folder}: its classifiers.csv (not a warm-start grid\'s?)')
        self.folder = folder
        ok = [r for r in rows if r['status'] == 'ok' and r['top1'] not in (None, '')]
        failed = [r for r in rows if r['status'] == 'failed']
        teachers = {(r['backbone'], int(r['seed'])) for r in ok if r['kernel'] == 'softmax' and r['start'] == 'scratch'}
        # a row without its teacher's row cannot be checked to share it: not kept
        self.rows: Dict[Key, dict] = {
            row_key(r['backbone'], r['kernel'], r['seed'], r['start'], r['iters'], r.get('recipe'), r.get('groups')): r
            for r in ok + failed if (r['backbone'], int(r['seed'])) in teachers}
        self.curves: Dict[tuple, List[dict]] = {}
        cpath = osp.join(folder, 'transfer_curves.csv')
        if osp.isfile(cpath):
            with open(cpath, newline='') as f:
                for c in csv.DictReader(f):
                    k = (c['backbone'], c['kernel'], int(c['seed']), int(c['iters']), c['groups'])
                    self.curves.setdefault(k, []).append(dict(
                        iter=int(c['iter']), block=int(c['block']), loss=_num(c['loss']),
                        loss_transfer=_num(c.get('loss_transfer'))))

    def __len__(self):
        return len(self.rows)

    def run(self, key: Key) -> Optional[dict]:
        """A kept row as the run the grid's rows are made from (its source kept: 'grid', 'study')."""
        r = self.rows.get(key)
        if r is None:
            return None
        made = {'identity': r['identity']} if r.get('identity') else {}
        if r['status'] == 'failed':
            return dict(status='failed', error=r.get('error') or '', source=r.get('source') or 'grid', kept=True,
                        key='kept: ' + '/'.join(map(str, key)), **made)
        return dict(status='ok', error='', top1_final=float(r['top1']), wall_s=_num(r.get('wall_s')),
                    cpu_s=_num(r.get('cpu_s')), s_per_iter=_num(r.get('finetune_s_per_iter')),
                    source=r.get('source') or 'grid', kept=True, key='kept: ' + '/'.join(map(str, key)), **made)

    def stage1(self, key: Key) -> Optional[dict]:
        """The stage 1 of a kept warm start (its loss, time and curves as the row recorded them)."""
        r = self.rows.get(key)
        if r is None:
            return None
        bb, kernel, seed, _, iters, _, groups = key
        if r['status'] == 'failed' and (r.get('error') or '').startswith('stage 1 failed'):
            return dict(status='failed', error=r['error'], kept=True, curves=[], wall_s=_num(r.get('transfer_wall_s')))
        return dict(status='ok', error='', loss_final=_num(r.get('transfer_loss')),
                    s_per_iter=_num(r.get('transfer_s_per_iter')), wall_s=_num(r.get('transfer_wall_s')), kept=True,
                    curves=list(self.curves.get((bb, kernel, seed, iters, groups), [])))

    def check_teacher(self, backbone: str, seed: int, trained: dict) -> None:
        """A teacher trained again where kept rows of its seed exist: its top-1 must be the kept row's."""
        r = self.rows.get(row_key(backbone, 'softmax', seed, 'scratch', 300))
        if r is None or trained.get('status') != 'ok':
            return
        got, kept = trained.get('top1_final'), float(r['top1'])
        if got is None or abs(got - kept) > 1e-4:
            raise UsageError(
                f'--keep-from {self.folder}: the {backbone} teacher of seed {seed} trained again reaches top-1 {got} '
                f'where the kept rows\' teacher reached {kept}: new runs would not share the kept runs\' teacher '
                '(another machine or code); run the grid without --keep-from')
