"""The committed CSVs under ``docs/results/`` as the generated sections read them: numbers as numbers, blanks as None
(:mod:`softfree_mm.analysis.doc_figures` and :mod:`softfree_mm.analysis.glance`)."""
import csv
import os.path as osp
from typing import List

RESULTS = osp.join('docs', 'results')


def _typed(v: str):
    if v in (None, ''):
        return None
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and '.' not in v and 'e' not in v.lower() else f


def read_csv(path: str) -> List[dict]:
    """A committed CSV's rows, numbers as numbers and blanks as None."""
    with open(path, newline='') as f:
        return [{k: _typed(v) for k, v in r.items()} for r in csv.DictReader(f)]
