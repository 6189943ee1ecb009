"""Scratch installs: a copy of the repository as a user's clone has it, and scratch virtual environments that see
this environment's packages (all of them, or only some distributions and what they require) without copying them.

The packages are seen through a ``.pth`` line naming a folder OUTSIDE the scratch environment, so pip there treats
them as installed but never uninstalls them ("outside environment"), and the ``.pth`` files of this environment
(its editable finder, softfree_mm-mmcv-ext.pth) do not run there: the scratch environment's own installs must put
theirs in place.
"""
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig

from . import ROOT


# never part of a user's copy: the tests, local data and what building and running leave behind
_NOT_A_USERS = {'.git', 'data', 'work_dirs', 'build', 'dist', 'tests', '__pycache__', '.pytest_cache'}


def _is_local(folder, name):
    """Whether ``folder/name`` is something a clone does not have: a skipped name, build output, a virtual
    environment (any name: .venv, the .venv-3.X that tools/test_pythons.sh makes, one a user named) or the
    configs/tools links setup.py places in softfree_mm/.mim."""
    path = osp.join(folder, name)
    return (name in _NOT_A_USERS or name.endswith(('.egg-info', '.pyc')) or
            (osp.isdir(path) and osp.isfile(osp.join(path, 'pyvenv.cfg'))) or
            (name == '.mim' and osp.basename(folder) == 'softfree_mm'))


def _git_files(root):
    """The files of ``root``'s working tree that git tracks or would track (untracked, not ignored), or None
    where ``root`` is not a git working tree."""
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [f for f in out.decode().split('\0') if f]


def copy_repo(dst, root=ROOT):
    """The repository's files a user's clone has: what git tracks (and untracked files it does not ignore), without
    the tests and local data. Outside a git working tree, the tree without what ``_is_local`` names. Never a
    virtual environment or run folder: a .venv-3.X of several GB copied into every scratch install once filled
    the CI machine's disk."""
    files = _git_files(root)
    if files is None:
        shutil.copytree(root, dst, symlinks=True,
                        ignore=lambda folder, names: [n for n in names if _is_local(folder, n)])
        return dst
    os.makedirs(dst)
    for rel in files:
        parts = rel.split('/')
        if any(_is_local(osp.join(root, *parts[:i]), part) for i, part in enumerate(parts)):
            continue
        src = osp.join(root, rel)
        if not osp.lexists(src):  # deleted in the working tree, not yet in the index
            continue
        target = osp.join(dst, rel)
        os.makedirs(osp.dirname(target), exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    return dst


def _site(python):
    return subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'], check=True,
                          capture_output=True, text=True).stdout.strip()


def _closure(names):
    """The installed distributions ``names`` and, recursively, those they require (without extras)."""
    from importlib.metadata import PackageNotFoundError, distribution
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    found, todo = {}, list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        found[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({'extra': ''}):
                todo.append(req.name)
    return list(found.values())


def _link_only(dists, folder):
    """``folder`` holding links to the top-level files and folders of ``dists`` in this environment."""
    os.makedirs(folder)
    for dist in dists:
        base = str(dist.locate_file(''))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != '..'}:
            src = osp.join(base, top)
            if osp.exists(src) and not osp.lexists(osp.join(folder, top)):
                os.symlink(src, osp.join(folder, top))
    return folder


def venv_on_this_environment(path, with_pip=False, only=None):
    """A venv at ``path`` that sees this environment's packages after its own: every one, or with ``only`` the
    named distributions and what they require. Returns (python, its site-packages)."""
    subprocess.run([sys.executable, '-m', 'venv', *([] if with_pip else ['--without-pip']), str(path)], check=True)
    python = str(path / 'bin' / 'python')
    site = _site(python)
    if only is None:
        outer = [p for p in sys.path if osp.basename(p) in ('site-packages', 'dist-packages') and osp.isdir(p)]
        seen = list(dict.fromkeys([sysconfig.get_paths()['purelib'], *outer]))
    else:
        seen = [_link_only(_closure(only), str(path) + '-seen')]
    with open(osp.join(site, 'outer_environment.pth'), 'w') as f:
        f.write('\n'.join(seen) + '\n')
    return python, site
