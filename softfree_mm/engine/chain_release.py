"""The warm-start chain's release and its lock, both in the work root.

The release is fetched once, by the tool, before the first run that reads it, into ``WORK_ROOT/releases/`` (a
folder the compute nodes see, unlike a login node's torch cache), and every run is given that file: no rank
downloads. The cache is content-addressed: a URL's file lives in ``releases/<sha256 of the URL, 16 hex>/<its file
name>`` (two URLs that end in the same name, ``pytorch_model.bin``, never share a file), its content hash recorded
beside it when it is downloaded (``<file>.sha256.json``: the URL, size and sha256), never computed again while the
file is unchanged. A download that is no torch file (a zip archive with a ``data.pkl`` member, or a pickle) is
refused: a web page came back. Nothing is taken from torch hub's cache by its file name (nodes without internet:
``--release FILE``). :func:`start_of` is what a run records of a start (:mod:`softfree_mm.engine.run_identity`). The
lock (``WORK_ROOT/warm_start_<stage 1>.lock``) keeps a second invocation of the same chain (a requeued job, a second
terminal) from training beside the first.
"""
import hashlib
import os
import os.path as osp
import socket
import time
import zipfile
from contextlib import contextmanager
from typing import Dict, Optional

from . import file_hash, run_identity
from .errors import UsageError, short_error

RELEASES = 'releases'


def reference_name(reference: Optional[str]) -> Optional[str]:
    """What a start is called whatever folder it sits in: a URL's file name, a file's name, a work dir's name."""
    if not isinstance(reference, str):
        return None
    if '://' in reference:
        from softfree_mm.models.converters import release_file_name
        return release_file_name(reference)
    return osp.basename(osp.normpath(reference))


def release_path(url: str, work_root: str) -> str:
    """Where a URL's file lives in the work root: releases/<sha256(url)[:16]>/<its file name>."""
    return osp.join(work_root, RELEASES, hashlib.sha256(url.encode()).hexdigest()[:16], reference_name(url))


def local_release(reference: str, work_root: str) -> Optional[str]:
    """The file the release is here, without fetching anything: a URL's copy in the work root, a file, a run's work
    dir's last checkpoint; None when it is not here yet."""
    from softfree_mm.models.converters import checkpoints_in
    if '://' in reference:
        path = release_path(reference, work_root)
        return path if osp.isfile(path) else None
    if osp.isdir(reference):
        found = checkpoints_in(reference)
        return found[0] if found else None
    return reference if osp.isfile(reference) else None


def start_of(reference: str, work_root: str) -> Dict:
    """What a run records of a checkpoint it starts from (:mod:`run_identity`): the work dir of a run that wrote its
    identity -> that run's record; a file (a URL's copy in the work root, a run's last checkpoint) -> its name and
    content hash (computed once); not here yet -> its name, hash unknown."""
    from softfree_mm.models.converters import checkpoints_in
    if '://' not in reference and osp.isdir(reference):
        stored = run_identity.read(reference)
        if stored is not None:
            return run_identity.run_start(stored['record'])
        found = checkpoints_in(reference)
        if found:
            return run_identity.release_start(osp.basename(found[0]), file_hash.sha256_of(found[0]))
    local = local_release(reference, work_root)
    return run_identity.release_start(reference_name(reference),
                                      file_hash.sha256_of(local) if local else None)


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


def _download(url: str, dest: str) -> None:
    import torch
    tmp = f'{dest}.{os.getpid()}.part'  # one process downloads (under the lock); the name is its own anyway
    torch.hub.download_url_to_file(url, tmp, progress=True)
    if not is_torch_file(tmp):
        os.remove(tmp)
        raise UsageError(f'{url} did not give a checkpoint file (a web page came back): download it by hand and pass '
                         f'--release FILE, or put it at {dest}')
    sha = file_hash.digest(tmp)  # once, here: recorded beside the file
    os.replace(tmp, dest)
    file_hash.remember_sha256(dest, sha, url=url)


def fetch(reference: str, work_root: str) -> str:
    """The release as a local file: a URL downloaded once into WORK_ROOT/releases/ (no network: one line naming
    --release FILE and where the file may be put); a file or a run's work dir as it is (missing: one line)."""
    here = local_release(reference, work_root)
    if here is not None:
        return here
    if '://' not in reference:
        raise UsageError(f'the release {reference} is not here (no such file, or a work dir without a checkpoint): '
                         'pass --release FILE')
    dest = release_path(reference, work_root)
    os.makedirs(osp.dirname(dest), exist_ok=True)
    try:
        _download(reference, dest)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001  (no network, a proxy, a 404: all the same to the user)
        raise UsageError(f'the release {reference} could not be downloaded here ({short_error(e, 160)}): on nodes '
                         f'without internet download it elsewhere and pass --release FILE, or put it at {dest}') \
            from None
    return dest


def lock_path(work_root: str, stage1_name: str) -> str:
    return osp.join(work_root, f'warm_start_{stage1_name}.lock')


@contextmanager
def chain_lock(work_root: str, stage1_name: str, wait: bool = False, say=print):
    """Held while the chain runs (an flock, released when the process ends however it ends). Held by another: one
    UsageError naming the holder and --wait, or with ``wait`` a line and a wait until it is free."""
    import fcntl
    path = lock_path(work_root, stage1_name)
    os.makedirs(work_root, exist_ok=True)
    with open(path, 'a+') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or 'another process'
            if not wait:
                raise UsageError(f'this chain is running already ({holder}; lock {path}): wait for it to end, or '
                                 'add --wait to start when it has') from None
            say(f'[warm-start] this chain is running already ({holder}); waiting for it to end (lock {path})')
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f'pid {os.getpid()} on {socket.gethostname()} since {time.strftime("%Y-%m-%d %H:%M:%S")}\n')
        f.flush()
        yield path
