"""The warm-start chain's release and its lock, both in the work root.

The release is fetched once, by the tool, before the first run that reads it, into ``WORK_ROOT/releases/`` (a
folder the compute nodes see, unlike a login node's torch cache), and every run is given that file: no rank
downloads. The cache is content-addressed: a URL's file lives in ``releases/<sha256 of the URL, 16 hex>/<its file
name>`` (two URLs that end in the same name, ``pytorch_model.bin``, never share a file), its content hash recorded
beside it when it is downloaded (``<file>.sha256.json``: the URL, size and sha256), never computed again while the
file is unchanged. A download that is no torch file (a zip archive with a ``data.pkl`` member, or a pickle) is
refused: a web page came back. Nothing is taken from torch hub's cache by its file name (nodes without internet:
``--release FILE``). :func:`start_of` is what a run records of a start (:mod:`softfree_mm.engine.run_identity`). The
lock (``WORK_ROOT/warm_start_<stage 1>.lock``) keeps a second invocation of the same chain (a second terminal, a
submitted job of it) from training beside the first, for as long as any stage it started runs.
"""
import errno
import hashlib
import os
import os.path as osp
import socket
import time
from contextlib import contextmanager
from typing import Dict, Optional

from ..files import download_torch_file
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


def _download(url: str, dest: str) -> None:
    download_torch_file(url, dest, lambda: UsageError(
        f'{url} did not give a checkpoint file (a web page came back): download it by hand and pass --release FILE, '
        f'or put it at {dest}'))  # one process downloads (under the lock)
    file_hash.remember_sha256(dest, file_hash.digest(dest), url=url)  # once, here: recorded beside the file


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


# flock's answers that mean "another holds it"; any other error is the file system refusing locks
HELD = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


def file_system_of(path: str) -> str:
    """'<type> at <mount point>' of the file system that holds ``path`` (from /proc/mounts; '' where not known)."""
    path = osp.realpath(path)
    best = ('', '')
    try:
        with open('/proc/mounts') as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mount = parts[1].replace('\\040', ' ')
                    if (path == mount or path.startswith(mount.rstrip('/') + '/')) and len(mount) >= len(best[0]):
                        best = (mount, parts[2])
    except OSError:
        return ''
    return f'{best[1]} at {best[0]}' if best[0] else ''


def _no_locks(path: str, e: OSError) -> UsageError:
    fs = file_system_of(path)
    return UsageError(f'the chain\'s lock {path} cannot be taken: its file system ({fs or "type unknown"}) gives no '
                      f'file locks ({errno.errorcode.get(e.errno, e.errno)}: {e.strerror}); put --work-root on a '
                      'file system with locks (a local disk, or NFS mounted with locking), or run the chain on Slurm '
                      '(--submit: Slurm keeps one job of a chain running at a time)')


def take_lock(f, path: str, wait: bool = False, say=print) -> None:
    """An exclusive flock on the open file ``f``: held by another -> one UsageError naming the holder and --wait (or,
    with ``wait``, a line and a wait); a file system without locks -> one UsageError naming it."""
    import fcntl
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in HELD:
            raise _no_locks(path, e) from None
        f.seek(0)
        holder = f.read().strip() or 'another process'
        if not wait:
            raise UsageError(f'this chain is running already ({holder}; lock {path}): wait for it to end, or '
                             'add --wait to start when it has') from None
        say(f'[warm-start] this chain is running already ({holder}); waiting for it to end (lock {path})')
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e2:
            raise _no_locks(path, e2) from None
    f.seek(0)
    f.truncate()
    f.write(f'pid {os.getpid()} on {socket.gethostname()} since {time.strftime("%Y-%m-%d %H:%M:%S")}\n')
    f.flush()


@contextmanager
def chain_lock(work_root: str, stage1_name: str, wait: bool = False, say=print):
    """Held while the chain runs; yields the lock file's descriptor, which the tool passes to each stage's process:
    an flock belongs to the open file, so the lock stays held while a stage runs even when the tool itself is killed,
    and is released when the last holder ends however it ends. Held by another: one UsageError naming the holder and
    --wait (with ``wait``: a line and a wait until it is free); a file system that gives no locks: one line naming
    it."""
    path = lock_path(work_root, stage1_name)
    os.makedirs(work_root, exist_ok=True)
    with open(path, 'a+') as f:
        take_lock(f, path, wait, say)
        yield f.fileno()
