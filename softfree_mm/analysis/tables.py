"""Rows written out: one CSV writer for every tool and analysis."""
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
