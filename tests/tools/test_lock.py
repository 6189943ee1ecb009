"""The lock (requirements/lock/, tools/lock.sh) and what the set-up made of it: this environment holds exactly the lock
it was set up from (read from the packages' metadata, no pip), the lock covers every loose requirement at the set-up's
torch, a path that brings torch or mmcv from elsewhere leaves out only those, `make lock` locks only what `make newest`
passed with today's requirements, and mim's cache folder is there before any mim process of a new home folder can
start."""
import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, load_tool

lockfile = load_tool('lockfile')
LOCKS = sorted(glob.glob(osp.join(ROOT, 'requirements', 'lock', '*.txt')))
LOOSE = ('build.txt', 'mmcv.txt', 'runtime.txt', 'tests.txt', 'onnx.txt', 'constraints.txt')


def _marker():
    """What tools/setup_env.sh wrote into this environment: the lock it installed and the groups from elsewhere."""
    path = osp.join(sys.prefix, lockfile.MARKER)
    if not osp.isfile(path):
        pytest.skip(f'{sys.prefix} was not set up by tools/setup_env.sh with locks (no {lockfile.MARKER})')
    with open(path) as f:
        return json.load(f)


def test_this_environment_holds_exactly_the_lock_it_was_set_up_from():
    marker = _marker()
    if marker['lock'] is None:
        pytest.skip('set up from the loose requirements (SOFTFREE_LOCK=none: make newest)')
    lock = osp.join(ROOT, marker['lock'])
    diff = lockfile.differences(lockfile.pins(lock), lockfile.installed(), lockfile.installed(own=True),
                                marker['not_from_lock'])
    assert not diff, f'{sys.prefix} differs from {marker["lock"]}:\n' + '\n'.join(diff)


def test_the_check_names_a_version_a_missing_and_an_extra_package():
    """The comparison can fail: a lock one version off, a package it lacks and one it has that is not installed."""
    have = {'numpy': '2.4.6', 'torch': '2.14.1', 'nvidia-cublas': '13.1.1.3', 'extra-thing': '1.0', 'pip': '23.2.1'}
    lock = {'numpy': '2.4.5', 'torch': '2.14.1', 'nvidia-cublas': '13.1.1.3', 'scipy': '1.17.1'}
    assert lockfile.differences(lock, have, own=have) == [
        'extra-thing: 1.0 installed, not in the lock', 'numpy: 2.4.5 in the lock, 2.4.6 installed',
        'scipy: 1.17.1 in the lock, not installed']
    other_torch = dict(have, torch='2.5.1+cu121', **{'nvidia-cublas': '12.1.3.1'})
    assert lockfile.differences(lock, other_torch, own=other_torch, groups=['torch']) == \
        lockfile.differences(lock, have, own=have)
    assert 'torch: 2.14.1 in the lock, 2.5.1+cu121 installed' in lockfile.differences(lock, other_torch)
    with pytest.raises(ValueError, match="unknown group 'cuda' \\(valid: torch, mmcv\\)"):
        lockfile.excluded(['cuda'])


@pytest.mark.parametrize('lock', LOCKS, ids=osp.basename)
def test_the_lock_pins_every_loose_requirement_with_hashes_and_the_setups_torch(lock):
    from packaging.requirements import Requirement
    pins = lockfile.pins(lock)
    entries = lockfile.entries(lock)
    assert all(len(lines) > 1 and all('--hash=sha256:' in x for x in lines[1:]) for lines in entries.values())
    wrong = []
    for name in LOOSE:
        with open(osp.join(ROOT, 'requirements', name)) as f:
            for line in f:
                line = line.split('#')[0].strip()
                if not line or line.startswith('-'):
                    continue
                req = Requirement(line)
                have = pins.get(lockfile.canonical(req.name))
                if have is None or not req.specifier.contains(have, prereleases=True):
                    wrong.append(f'{name}: {line} (lock: {have})')
    assert not wrong, wrong
    with open(osp.join(ROOT, 'tools', 'setup_env.sh')) as f:
        setup = f.read()
    for var, name in (('TORCH_VERSION', 'torch'), ('TORCHVISION_VERSION', 'torchvision')):
        assert pins[name] == re.search(rf'^{var}=\${{{var}:-(\S+)}}$', setup, re.M).group(1)
    assert 'pip' not in pins and 'softfree-mm' not in pins  # the venv's installer; this package (-e)


def test_a_path_with_torch_or_mmcv_from_elsewhere_selects_all_the_rest_with_hashes(tmp_path):
    lock = LOCKS[0]
    out = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'lockfile.py'), 'select', lock, '--not-from-lock',
                          'torch', 'mmcv'], capture_output=True, text=True, check=True).stdout
    (tmp_path / 'selected.txt').write_text(out)
    left = set(lockfile.pins(str(tmp_path / 'selected.txt')))
    gone = set(lockfile.pins(lock)) - left
    assert {'torch', 'torchvision', 'triton', 'mmcv-lite', 'nvidia-cublas'} <= gone
    assert all(re.match(r'^(torch|torchvision|triton|mmcv-lite|nvidia-.*|cuda-.*)$', n) for n in gone), gone
    assert {'numpy', 'mmengine', 'mmdet', 'timm', 'opencv-python', 'sympy', 'setuptools'} <= left
    assert lockfile.entries(str(tmp_path / 'selected.txt'))['numpy'] == lockfile.entries(lock)['numpy']


def test_the_first_import_makes_mims_cache_folder_in_an_empty_home(tmp_path):
    """mim's first process creates ~/.cache/mim without exist_ok: several started side by side in a new home
    folder race. ``import softfree_mm`` (and make setup, tests/tools/test_setup_env.py) make it first."""
    home = tmp_path / 'home'
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', )}
    env['HOME'] = str(home)
    code = 'import os, softfree_mm; print(os.path.isdir(os.path.expanduser("~/.cache/mim")))'
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == 'True'


def test_setup_makes_mims_cache_folder_before_it_installs_anything(tmp_path):
    """Every call of tools/setup_env.sh, also one that stops at once (here: a bad SOFTFREE_NEED_MIB, checked before
    any venv is made), leaves ~/.cache/mim in the home folder it runs in."""
    fake = tmp_path / 'python'
    fake.write_text('#!/bin/sh\necho "CPython 3.12.1"\n')
    fake.chmod(0o755)
    env = dict(os.environ, HOME=str(tmp_path / 'home'), PYTHON=str(fake), SOFTFREE_VENV=str(tmp_path / 'venv'),
               SOFTFREE_NEED_MIB='lots')
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and 'SOFTFREE_NEED_MIB must be a whole number' in proc.stderr, proc.stderr
    assert (tmp_path / 'home' / '.cache' / 'mim').is_dir() and not (tmp_path / 'venv').exists()


def test_make_lock_refuses_without_a_passing_record_of_todays_requirements_for_every_python(tmp_path):
    """tools/lock.sh locks only what `make newest` tested: a Python without a record, or with a record of other
    requirements than today's, is refused in one line before anything is resolved or installed."""
    hash_now = subprocess.run(['bash', osp.join(ROOT, 'tools', 'lock.sh'), '--inputs-hash'], capture_output=True,
                              text=True, check=True).stdout.strip()
    (tmp_path / 'py3.11.txt').write_text(f'# inputs {hash_now}\nnumpy==2.4.6\n')
    (tmp_path / 'py3.12.txt').write_text('# inputs 0000000000000000\nnumpy==2.4.6\n')
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'lock.sh')], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, NEWEST_DIR=str(tmp_path)))
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == (
        f'[lock] error: Python 3.12: {tmp_path}/py3.12.txt is of other requirements; Python 3.13: no record (make '
        'newest tests the loose requirements on every supported Python and records what passed)')
