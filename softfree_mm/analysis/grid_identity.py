"""The study grids' runs by their identities (:mod:`softfree_mm.engine.run_identity`): the kernel study, the task
study and the warm-start grid keep, start again or refuse a run folder by what the run *is*, not by its folder's
name.

A grid's run is ``tools/train.py`` (or ``tools/test.py``) on a child config text with ``--cfg-options``: its record
is :func:`run_identity.record` of that config as the tool reads it (:func:`resolved`), of its starts (a checkpoint
another run of the grid wrote: that run's record, read from its folder's ``run_identity.json``; any other file: its
content hash, :func:`start_of`), world size 1 and no train flags (the grids pass none). Before a run trains,
:func:`check` compares its folder's ``run_identity.json`` with that record: equal -> the folder's run (kept when it
finished, started again from nothing when it did not: the grids do not resume a run part way); unequal -> a
UsageError in one line naming the first differing resolved keys and the way out. A folder with a result but no
``run_identity.json`` was made before run identities: kept by its key, as before, and its row has no identity.

Rows kept from a grid's committed outputs (``--keep-from``, their work dirs gone) keep their grid's keys; which rows
a run with an identity made is told by :data:`SIDECAR` beside the outputs (:func:`write_identities`): one line per
such row, its key columns and its identity. The committed rows made before identities have none (and the committed
folders no sidecar), so the CSVs themselves never change.
"""
import csv
import os
import os.path as osp
import tempfile
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..engine import run_identity as ri
from ..engine.errors import UsageError

SIDECAR = 'identities.csv'
WORLD_SIZE = 1  # every grid run is one process


# ------------------------------------------------------------------------------------------------ records
def parse_options(options: Sequence[str]) -> Dict:
    """``--cfg-options`` items ('key=value') as tools/train.py's parser (mmengine's DictAction) reads them."""
    from softfree_mm.engine.cfg_options import parse_value
    out = {}
    for item in options:
        key, eq, value = str(item).partition('=')
        if not eq or not key:
            raise UsageError(f'--cfg-options {item!r}: expected KEY=VALUE')
        out[key] = parse_value(value)
    return out


def resolved(config_text: str, options: Sequence[str] = (), checkpoint: Optional[str] = None,
             name: str = 'run.py'):
    """The config a run of this child config text reads: the text as a file (``name``), ``options`` merged as
    tools/train.py merges them; with ``checkpoint``, tools/test.py's run of that checkpoint (``load_from``)."""
    from ..engine.config_checks import load_config
    with tempfile.TemporaryDirectory(prefix='grid_identity_') as d:
        path = osp.join(d, osp.basename(name) if name.endswith('.py') else 'run.py')
        with open(path, 'w') as f:
            f.write(config_text)
        cfg = load_config(path, parse_options(options))
    if checkpoint is not None:
        cfg.load_from, cfg.resume = checkpoint, False
    return cfg


def start_of(path: str) -> Dict:
    """What a checkpoint path a run starts from stands for: the record of the grid run that wrote it (its folder's
    run_identity.json), else the file's content hash (computed once, kept beside it), else its name alone."""
    held = ri.read(osp.dirname(osp.abspath(path)))
    if held is not None:
        return ri.run_start(held['record'])
    return ri.release_start(osp.basename(path), ri.sha256_of(path) if osp.isfile(path) else None)


def record(config_text: str, options: Sequence[str] = (), checkpoint: Optional[str] = None,
           name: str = 'run.py') -> Dict:
    """The record of a grid run (see the module's docstring); safe from a grid runner's threads (its config is
    read through config_checks.read_config, one read at a time)."""
    cfg = resolved(config_text, options, checkpoint, name)
    starts = {p: start_of(p) for p in ri.checkpoint_paths(cfg).values()}
    return ri.record(cfg, starts, WORLD_SIZE, ri.train_flags([]))


# ------------------------------------------------------------------------------------------------ folders
def refusal(folder: str, held: Dict, rec: Dict, what: str = 'the grid') -> str:
    """One line: the folder holds another run than ``rec``, its first differing keys (old -> new), the way out."""
    diffs = ri.differences(held['record'], rec)  # a start's keys named through the key that holds it
    changed = ri.version_changes(held.get('versions'))
    return (f'{folder}: holds another run than {what} would make there (its {ri.FILE} differs: '
            f'{ri.describe(diffs) or "the identity alone"})' + (f'; made with {changed}' if changed else '')
            + f'; move that folder away or give {what} another --work-dir')


def check(folder: str, rec: Dict, what: str = 'the grid') -> Optional[bool]:
    """Whether ``folder`` holds the run ``rec`` is: True (its run_identity.json has rec's identity), None (it has
    none: no folder, or one made before run identities); another run's: a UsageError (:func:`refusal`)."""
    held = ri.read(folder) if osp.isdir(folder) else None
    if held is None:
        return None
    if held['identity'] == ri.identity(rec) and held['record'] == rec:
        return True
    raise UsageError(refusal(folder, held, rec, what))


def begin(folder: str, rec: Dict) -> str:
    """Write the run's run_identity.json into its (fresh) folder before it trains; its identity."""
    ri.write(folder, rec)
    return ri.identity(rec)


# ------------------------------------------------------------------------------------------------ the sidecar
Table = Tuple[str, Iterable[Mapping], Sequence[str]]  # (the CSV's file name, its rows, its key columns)


def _key(row: Mapping, fields: Sequence[str]) -> Tuple[str, ...]:
    return tuple('' if row.get(k) is None else str(row.get(k)) for k in fields)


class Identities:
    """A results folder's identities.csv read back: the identity each of its rows made with one had (none for a
    folder without the file: rows made before run identities)."""

    def __init__(self, folder: str):
        self.path, self.rows = osp.join(folder, SIDECAR), []
        self._index: Dict[tuple, Dict[Tuple[str, ...], str]] = {}
        if not osp.isfile(self.path):
            return
        with open(self.path, newline='') as f:
            reader = csv.DictReader(f)
            self.rows = list(reader)
        if not {'file', 'identity'} <= set(reader.fieldnames or ()):
            raise UsageError(f"{self.path}: not a grid's {SIDECAR} (it needs the columns file and identity)")

    def __len__(self):
        return len(self.rows)

    def get(self, file: str, row: Mapping, fields: Sequence[str]) -> Optional[str]:
        """The identity of ``row`` (of the CSV ``file``, keyed by ``fields``), None where it had none."""
        at = (file, tuple(fields))
        if at not in self._index:
            self._index[at] = {_key(r, fields): r['identity'] for r in self.rows if r['file'] == file}
        return self._index[at].get(_key(row, fields)) or None


def write_identities(out: str, tables: Sequence[Table]) -> Optional[str]:
    """``out``/identities.csv: per row with an ``identity`` (a run made with one, or a kept row that had one), the
    CSV it is in, its key columns and its identity, in the CSVs' order; no file (an old one removed) where no row
    has one. Returns the path written, or None."""
    columns: List[str] = []
    for _, _, fields in tables:
        columns += [c for c in fields if c not in columns]
    lines = [dict(zip(fields, _key(r, fields)), file=name, identity=r['identity'])
             for name, rows, fields in tables for r in rows if r.get('identity')]
    path = osp.join(out, SIDECAR)
    if not lines:
        if osp.isfile(path):
            os.remove(path)
        return None
    from .tables import write_csv
    write_csv(path, lines, ['file', *columns, 'identity'])
    return path
