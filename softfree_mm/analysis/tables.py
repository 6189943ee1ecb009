"""Rows written out and read back: one CSV writer for every tool and analysis, and the reader of committed outputs."""
import csv
from typing import Dict, Iterable, List, Optional, Sequence


def write_csv(path: str, rows: Iterable[Dict], fields: Optional[Sequence[str]] = None) -> None:
    """``rows`` (dicts) as a CSV file with the columns ``fields`` (default: every key of the rows, in the order
    first met); a missing or None value is an empty cell, keys outside ``fields`` are left out."""
    rows = list(rows)
    if fields is None:
        cols: List[str] = []
        for r in rows:
            cols += [c for c in r if c not in cols]
        fields = cols
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction='ignore')
        w.writeheader()
        for r in rows:
            w.writerow({k: '' if r.get(k) is None else r[k] for k in fields})


def read_csv(path: str, needed: Sequence[str], where: str) -> List[Dict[str, str]]:
    """The rows of a committed CSV (strings) that must hold the columns ``needed``; else a UsageError starting with
    ``where`` that names the missing columns."""
    from ..engine.errors import UsageError
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    missing = [c for c in needed if c not in (reader.fieldnames or ())]
    if missing:
        raise UsageError(f'{where} has no column {", ".join(missing)}')
    return rows
