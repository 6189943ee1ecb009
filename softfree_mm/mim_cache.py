"""mim's cache folder, made before any mim process of this home folder can start: mim's first import creates
``~/.cache/mim`` with ``os.makedirs`` and no ``exist_ok`` (mim/utils/default.py), so mim processes started side by
side in a new home folder (a user's first ``mim train`` / ``mim test`` runs, a job array) race, and all but one may
die with FileExistsError. ``make setup`` makes it too (tools/setup_env.sh); this covers a home folder that the
package's first import meets (another user, a fresh HOME on a cluster node). Standard library only."""
import os
import os.path as osp


def make_mim_cache() -> None:
    """Create ``~/.cache/mim`` (mim reads HOME only, not XDG_CACHE_HOME); a home folder that cannot be written is left
    as it is (mim then reports its own error)."""
    try:
        os.makedirs(osp.join(osp.expanduser('~'), '.cache', 'mim'), exist_ok=True)
    except OSError:
        pass
