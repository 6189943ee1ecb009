"""Every study's ``--keep-from``: the rows an earlier run of the study committed, read back to be kept instead of run
again. A committed CSV that must hold the columns a study needs (else one line naming the missing ones), each row
typed by the study and given the identity the folder's identities.csv names for it by the study's key columns (none
for a row made before run identities: :mod:`.grid_identity`). What a study then keeps (finished rows, their
teachers checked) is its own."""
import os.path as osp
from typing import Callable, Dict, List, Sequence

from .grid_identity import Identities
from .tables import read_csv


def read_kept(path: str, key: Sequence[str], needed: Sequence[str], where: str,
              typed: Callable[[Dict[str, str]], dict] = dict) -> List[dict]:
    """The rows of ``path`` (a UsageError starting with ``where`` when a column of ``needed`` is missing), each
    ``typed(row)`` with its ``identity`` (None where it has none), in the file's order."""
    made = Identities(osp.dirname(osp.abspath(path)))
    name = osp.basename(path)
    out = []
    for r in read_csv(path, needed, where):
        row = typed(r)
        row['identity'] = made.get(name, row, key)
        out.append(row)
    return out
