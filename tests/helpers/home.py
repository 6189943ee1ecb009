"""The folders the stack creates in a home folder on first use, and a fresh home folder for the tests.

On a machine that never ran these tools, the first processes create them. mim's import does
``os.makedirs('~/.cache/mim')`` without ``exist_ok`` (mim/utils/default.py): several mim processes started at once
on a fresh home race, and all but one may die with ``FileExistsError``. The others (matplotlib's config and cache
folders, YAPF's grammar cache, pip's, torch hub's, mmengine's download cache) are created with ``exist_ok`` and
written atomically or under a lock, but are made here too, so that processes started side by side find everything
in place. Whoever starts tools, mim or torchrun in parallel calls :func:`prepare_home` first.
"""
import os
import os.path as osp
import tempfile


def first_use_folders(env=None):
    """The folders that first use creates under ``env``'s HOME / XDG_CACHE_HOME / XDG_CONFIG_HOME."""
    env = os.environ if env is None else env
    home = env.get('HOME') or osp.expanduser('~')
    cache = env.get('XDG_CACHE_HOME') or osp.join(home, '.cache')
    config = env.get('XDG_CONFIG_HOME') or osp.join(home, '.config')
    mpl = env.get('MPLCONFIGDIR')
    import yapf
    return [
        osp.join(home, '.cache', 'mim'),  # mim reads HOME only (not XDG_CACHE_HOME)
        mpl or osp.join(config, 'matplotlib'),
        mpl or osp.join(cache, 'matplotlib'),
        osp.join(cache, 'YAPF', yapf.__version__),  # platformdirs' user_cache_dir('YAPF', version=...)
        osp.join(cache, 'pip'),
        osp.join(env.get('TORCH_HOME') or osp.join(cache, 'torch'), 'hub'),
        env.get('MMENGINE_HOME') or osp.join(cache, 'mmengine'),
    ]


def prepare_home(env=None):
    """Create :func:`first_use_folders` (before processes that would create them start side by side)."""
    folders = first_use_folders(env)
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    return folders


def fresh_home_env(base_env=None, root=None):
    """``base_env`` with HOME and XDG_CACHE_HOME pointing at new empty folders (under ``root``), the other
    per-user locations the stack reads (XDG_CONFIG_HOME, MPLCONFIGDIR, TORCH_HOME, MMENGINE_HOME) removed."""
    env = dict(os.environ if base_env is None else base_env)
    for var in ('XDG_CONFIG_HOME', 'MPLCONFIGDIR', 'TORCH_HOME', 'MMENGINE_HOME'):
        env.pop(var, None)
    env['HOME'] = tempfile.mkdtemp(prefix='home_', dir=root)
    env['XDG_CACHE_HOME'] = tempfile.mkdtemp(prefix='xdg_cache_', dir=root)
    return env


def folders_under(*roots):
    """Every folder below ``roots`` (relative to its root, with the root's index)."""
    found = set()
    for i, root in enumerate(roots):
        for folder, dirs, _ in os.walk(root):
            found.update((i, osp.relpath(osp.join(folder, d), root)) for d in dirs)
    return found
