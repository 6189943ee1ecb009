"""Files written whole or not at all, and checkpoint files fetched from the web: the one place for both.

Standard library only (the tools that read run identities and versions import it before torch). A temporary file is
``<final name>.tmp-<pid>`` in the final file's folder (:data:`TMP_MARK`: a resumed run removes a dead process's).
"""
import json
import os
import zipfile
from typing import Callable

TMP_MARK = '.tmp-'


def atomic_write(data: bytes, filepath: str) -> None:
    """Write ``data`` to ``filepath`` so that the file is either the old one or the complete new one, whenever the
    process dies: a temporary file in the same folder, flushed and fsynced, renamed over the final name."""
    folder = os.path.dirname(os.path.abspath(filepath))
    os.makedirs(folder, exist_ok=True)
    tmp = f'{filepath}{TMP_MARK}{os.getpid()}'
    try:
        with open(tmp, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filepath)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:  # the rename itself reaches the disk with the folder's entry
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_json(obj, filepath: str, newline: bool = False, **dump) -> None:
    """``obj`` as JSON (``json.dumps(obj, **dump)``, a final newline with ``newline``), written atomically."""
    atomic_write((json.dumps(obj, **dump) + ('\n' if newline else '')).encode(), filepath)


def is_torch_file(path: str) -> bool:
    """A file torch.load reads: a zip archive holding a ``data.pkl`` (torch's format since 1.6) or a pickle
    (the legacy format)."""
    with open(path, 'rb') as f:
        head = f.read(2)
    if head == b'PK':
        try:
            with zipfile.ZipFile(path) as z:
                return any(n == 'data.pkl' or n.endswith('/data.pkl') for n in z.namelist())
        except (zipfile.BadZipFile, OSError):
            return False
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def download_torch_file(url: str, dest: str, not_a_checkpoint: Callable[[], Exception]) -> None:
    """Download ``url`` to ``dest`` (a temporary name of this process first, renamed once whole): a file that is
    not a torch file (a web page: a quota or sign-in page) is removed and ``not_a_checkpoint()`` raised."""
    import torch
    tmp = f'{dest}{TMP_MARK}{os.getpid()}'
    try:
        torch.hub.download_url_to_file(url, tmp, progress=True)
        if not is_torch_file(tmp):
            raise not_a_checkpoint()
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
