"""The set-up's mmcv source path, which MMCV_COMPILED=1 (and MMCV_CUDA=1) takes.

``tools/setup_env.sh --check-mmcv-source`` replays the set-up's pip calls in a scratch venv up to mmcv's metadata step
(``pip --dry-run``: mmcv's setup.py runs, nothing compiles). mmcv 2.1.0's setup.py imports ``pkg_resources`` on its
first line, which setuptools >= 82 no longer ships; torch's own requirement would pull such a setuptools.
"""
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

# mmcv 2.1.0's setup.py cannot read its own version on Python 3.13: there the set-up refuses the source path
before_313 = pytest.mark.skipif(sys.version_info >= (3, 13), reason='the set-up refuses mmcv from source on 3.13')


def _check(tmp_path, constraints=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith('PIP_') and k != 'PYTHON'}
    # the interpreter under test, not the checkout's .venv: make test-pythons runs this file on .venv-3.X
    env['SOFTFREE_VENV'] = sys.prefix
    env['HOME'] = str(tmp_path / 'home')  # no pip cache or config from an earlier run
    env.pop('XDG_CACHE_HOME', None)
    if constraints is not None:
        path = tmp_path / 'constraints.txt'
        path.write_text(constraints)
        env['SOFTFREE_CONSTRAINTS'] = str(path)
    return subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh'), '--check-mmcv-source'], env=env,
                          capture_output=True, text=True, timeout=600)


@before_313
def test_mmcv_source_metadata_step_gets_a_setuptools_below_82_and_succeeds(tmp_path):
    proc = _check(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = re.search(r'setuptools (\S+) at the mmcv step', proc.stderr).group(1)
    assert int(version.split('.')[0]) < 82, version
    assert 'mmcv 2.1.0 source: metadata prepared' in proc.stderr


@before_313
def test_without_the_constraints_torchs_setuptools_reaches_mmcv_and_the_step_fails(tmp_path):
    """The check can fail: with an empty constraints file the torch step's setuptools (>= 82) reaches mmcv's setup.py,
    as it did for users before the constraints file."""
    proc = _check(tmp_path, constraints='# no constraints\n')
    version = re.search(r'setuptools (\S+) at the mmcv step', proc.stderr).group(1)
    assert int(version.split('.')[0]) >= 82, version
    assert proc.returncode != 0 and "No module named 'pkg_resources'" in proc.stderr, proc.stderr[-3000:]


def test_unknown_argument_and_missing_constraints_file_are_one_line_errors(tmp_path):
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh'), '--bogus'], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("[setup_env] error: unknown argument '--bogus' (valid: --print-mmcv-plan, "
                                   '--check-mmcv-source)')
    env = dict(os.environ, SOFTFREE_CONSTRAINTS=str(tmp_path / 'nope.txt'), SOFTFREE_VENV=str(tmp_path / 'venv'))
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"[setup_env] error: SOFTFREE_CONSTRAINTS: no such file '{tmp_path / 'nope.txt'}'"
    assert not (tmp_path / 'venv').exists()


@pytest.mark.skipif(sys.version_info < (3, 13), reason='the refusal is for Python 3.13')
def test_the_source_check_on_python_3_13_is_one_line(tmp_path):
    proc = _check(tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().startswith(
        "[setup_env] error: MMCV_COMPILED=1 cannot work on Python 3.13: mmcv 2.1.0's setup.py"), proc.stderr
