"""The kernel study's committed runs kept instead of trained again (``tools/analysis/study.py --keep-from``): a new
kernel or seed is added to the study without its other runs, whose work folders are gone on another machine.

A kept run is identified by its config, kernel and seed (the row's own columns); a finished row (status 'ok') is
not trained again, a failed one (a kernel the backbone refuses) stays in the outputs unless the selection runs it
again. The merged rows are in the study's order (configs, then kernels, in the order first met, then seeds), the
kept rows' norm curves read from the folder's norm_curves.csv. A kept row that a run with an identity made keeps it
(``identity``, from the folder's identities.csv: :mod:`.grid_identity`); the committed rows made before identities
have none.
"""
import os.path as osp
from typing import Dict, List, Tuple

from ..engine.errors import UsageError
from .study import CURVE_FIELDS, KEY, RUN_FIELDS
from .kept import read_kept

INTS = ('seed', 'best_iter', 'iters', 'threads', 'step')
TEXT = ('config', 'kernel', 'status', 'mem_kind', 'error', 'log', 'layer')


def _typed(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if k in TEXT:
            out[k] = v or ''
        elif v in (None, ''):
            out[k] = None
        else:
            out[k] = int(float(v)) if k in INTS else float(v)
    return out


def _read(path: str, fields, what: str) -> List[dict]:
    where = f'--keep-from {osp.dirname(path)}: its {what} (not the kernel study\'s outputs?)'
    return read_kept(path, KEY, fields, where, _typed)


class KeptStudy:
    """The finished runs of an earlier study's --out folder (runs.csv, norm_curves.csv)."""

    def __init__(self, folder: str):
        runs = osp.join(folder, 'runs.csv')
        if not osp.isfile(runs):
            raise UsageError(f'--keep-from {folder}: no runs.csv there (an earlier study\'s --out folder)')
        self.rows: Dict[Tuple[str, str, int], dict] = {
            (r['config'], r['kernel'], r['seed']): r for r in _read(runs, RUN_FIELDS, 'runs.csv')}
        self.curves: Dict[Tuple[str, str, int], List[dict]] = {}
        path = osp.join(folder, 'norm_curves.csv')
        if osp.isfile(path):
            for c in _read(path, CURVE_FIELDS, 'norm_curves.csv'):
                c.pop('identity', None)  # a curve is its run's (the run's row holds the identity)
                self.curves.setdefault((c['config'], c['kernel'], c['seed']), []).append(c)

    def get(self, config: str, kernel: str, seed: int):
        """The finished row of a run (None: train it)."""
        r = self.rows.get((config, kernel, seed))
        return r if r is not None and r['status'] == 'ok' else None

    def merged(self, new_rows: List[dict], new_curves: List[dict]) -> Tuple[List[dict], List[dict]]:
        """(rows, curves): every kept row with the new ones (a new row of a kept run replaces it), in the study's
        order; the kept rows' curves with the new runs'."""
        rows = dict(self.rows)
        for r in new_rows:
            rows[(r['config'], r['kernel'], int(r['seed']))] = r
        configs: Dict[str, int] = {}
        kernels: Dict[str, int] = {}
        for c, k, _ in list(self.rows) + [(r['config'], r['kernel'], r['seed']) for r in new_rows]:
            configs.setdefault(c, len(configs))
            kernels.setdefault(k, len(kernels))
        order = sorted(rows, key=lambda t: (configs[t[0]], kernels[t[1]], t[2]))
        fresh = {(c['config'], c['kernel'], int(c['seed'])) for c in new_curves}
        curves = [c for t in order if t not in fresh for c in self.curves.get(t, [])] + list(new_curves)
        return [rows[t] for t in order], curves
