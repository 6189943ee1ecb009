"""The warm-start chain's release and its lock, both in the work root.

The release is fetched once, by the tool, before the first run that reads it, into ``WORK_ROOT/releases/`` (a
folder the compute nodes see, unlike a login node's torch cache), and every run is given that file: no rank
downloads. The lock (``WORK_ROOT/warm_start_<stage 1>.lock``) keeps a second invocation of the same chain (a requeued
job, a second terminal) from training beside the first.
"""
import os
import os.path as osp
import shutil
import socket
import time
from contextlib import contextmanager
from typing import Optional

from .errors import UsageError, short_error

RELEASES = 'releases'
_MAGIC = (b'PK', b'\x80\x02', b'\x80\x03', b'\x80\x04', b'\x80\x05')  # zip or pickle: a torch file


def release_path(url: str, work_root: str) -> str:
    from softfree_mm.models.converters import release_file_name
    return osp.join(work_root, RELEASES, release_file_name(url))


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


def _download(url: str, dest: str) -> None:
    import torch
    tmp = f'{dest}.{os.getpid()}.part'  # one process downloads (under the lock); the name is its own anyway
    cached = osp.join(torch.hub.get_dir(), 'checkpoints', osp.basename(dest))
    if osp.isfile(cached):  # this machine's torch cache has it: copied, the compute nodes may not see that cache
        shutil.copyfile(cached, tmp)
    else:
        torch.hub.download_url_to_file(url, tmp, progress=True)
    with open(tmp, 'rb') as f:
        head = f.read(2)
    if head not in _MAGIC:
        os.remove(tmp)
        raise UsageError(f'{url} did not give a checkpoint file (a web page came back): download it by hand and pass '
                         f'--release FILE, or put it at {dest}')
    os.replace(tmp, dest)


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
