"""A file's content hash, computed once: kept beside the file in ``<file>.sha256.json`` with its size and mtime
(and where it came from), computed again only when either changed. Releases are identified by it
(engine/run_identity.py, engine/chain_release.py)."""
import hashlib
import json
import os
import os.path as osp
import re
from typing import Dict, Optional

from ..files import write_json

SIDECAR = '.sha256.json'
_MEMO: Dict[tuple, str] = {}


def digest(path: str) -> str:
    """The sha256 of a file's content, read once through (the one place a file is hashed)."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def _sidecar(path: str) -> Optional[Dict]:
    try:
        with open(path + SIDECAR) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def remember_sha256(path: str, sha256: str, **extra) -> None:
    """Record a file's hash beside it (``<file>.sha256.json``: size, mtime_ns, sha256 and ``extra``, e.g. the URL it
    came from); a folder that cannot be written keeps it for this process only."""
    st = os.stat(path)
    _MEMO[(osp.abspath(path), st.st_size, st.st_mtime_ns)] = sha256
    data = dict(extra, size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha256)
    try:
        write_json(data, path + SIDECAR, indent=1, sort_keys=True)
    except OSError:
        pass


def sha256_of(path: str) -> str:
    """A file's content hash, computed once: kept beside it in ``<file>.sha256.json`` with its size and mtime, and
    computed again only when either changed."""
    st = os.stat(path)
    key = (osp.abspath(path), st.st_size, st.st_mtime_ns)
    if key in _MEMO:
        return _MEMO[key]
    side = _sidecar(path)
    if side and side.get('size') == st.st_size and side.get('mtime_ns') == st.st_mtime_ns \
            and re.fullmatch(r'[0-9a-f]{64}', str(side.get('sha256'))):
        _MEMO[key] = side['sha256']
        return side['sha256']
    sha = digest(path)
    remember_sha256(path, sha, **{k: v for k, v in (side or {}).items() if k == 'url'})
    return sha
