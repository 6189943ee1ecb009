"""The scratch installs' copy of the repository (tests/helpers/installs.py ``copy_repo``): what a user's clone has,
never a virtual environment, run folder or the tests. A .venv-3.13 that tools/test_pythons.sh had made was copied
into every scratch install (6 GB each) and filled the CI machine's disk."""
import os
import os.path as osp
import shutil
import subprocess

import pytest

from tests.helpers import ROOT
from tests.helpers.installs import copy_repo


def _files(folder):
    found = set()
    for here, dirs, names in os.walk(folder):
        for name in names + [d for d in dirs if osp.islink(osp.join(here, d))]:
            found.add(osp.relpath(osp.join(here, name), folder).replace(os.sep, '/'))
    return found


def _write(root, rel, text='x'):
    path = osp.join(root, rel)
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def _a_working_tree(root):
    for rel in ('setup.py', 'pkg/__init__.py', 'pkg/sub/mod.py', 'configs/a.py', 'tests/test_a.py',
                'data/demo/x.json', 'new_untracked.py'):
        _write(root, rel)
    for venv in ('.venv', '.venv-3.13', 'my env'):  # ignored by name, ignored by pattern, not ignored at all
        _write(root, f'{venv}/pyvenv.cfg', 'home = /usr/bin\n')
        _write(root, f'{venv}/lib/site-packages/big.bin', 'x' * 1000)
    _write(root, 'pkg/sub/__pycache__/mod.cpython-313.pyc')
    _write(root, 'pkg.egg-info/PKG-INFO')
    _write(root, 'work_dirs/run/epoch_1.pth')
    os.symlink('configs', osp.join(root, 'linked'))
    _write(root, '.gitignore', '.venv/\n.venv-*/\nwork_dirs/\n__pycache__/\n*.egg-info/\ndata/\n')


WANTED = {'setup.py', 'pkg/__init__.py', 'pkg/sub/mod.py', 'configs/a.py', 'new_untracked.py', 'linked',
          '.gitignore'}


def test_a_git_working_trees_copy_is_what_git_tracks_without_tests_data_or_any_venv(tmp_path):
    if shutil.which('git') is None:
        pytest.skip('git is not installed')
    src = str(tmp_path / 'src')
    _a_working_tree(src)
    subprocess.run(['git', 'init', '-q', src], check=True)
    tracked = ['setup.py', 'pkg', 'configs', 'tests', 'linked', '.gitignore']
    subprocess.run(['git', '-C', src, 'add', *tracked], check=True)
    os.remove(osp.join(src, 'configs', 'a.py'))  # deleted in the working tree, still in the index: not copied
    copied = copy_repo(str(tmp_path / 'copy'), root=src)
    assert _files(copied) == WANTED - {'configs/a.py'}
    assert osp.islink(osp.join(copied, 'linked')) and os.readlink(osp.join(copied, 'linked')) == 'configs'


def test_outside_git_the_copy_skips_the_same_things(tmp_path):
    src = str(tmp_path / 'src')
    _a_working_tree(src)
    copied = copy_repo(str(tmp_path / 'copy'), root=src)
    assert _files(copied) == WANTED


def test_the_repositorys_copy_holds_the_package_and_no_virtual_environment(tmp_path):
    copied = copy_repo(str(tmp_path / 'repo'))
    files = _files(copied)
    assert {'setup.py', 'softfree_mm/__init__.py', 'tools/train.py', 'model-index.yml'} <= files
    assert not any(f.startswith(('tests/', 'data/', 'work_dirs/', '.git/')) or f.endswith('pyvenv.cfg')
                   for f in files), sorted(files)[:20]
    size = sum(osp.getsize(osp.join(copied, f)) for f in files if not osp.islink(osp.join(copied, f)))
    assert size < 200e6, f'{size / 1e6:.0f} MB copied from {ROOT}'
