"""tools/setup_env.sh as a user runs it: the default set-up installs mmcv-lite and never calls a compiler; the
compiled mmcv is an opt-in chosen by MMCV_COMPILED / MMCV_CUDA.

The set-up runs for real, from a copy of the repository, into a scratch venv that sees only torch and torchvision
(and what they require) from this environment, so everything else (mmengine, mmcv, mmdet, mmseg, mmpretrain, timm,
the test requirements, this package) is installed as on a fresh machine, with a fresh empty home folder and
failing ``cc`` / ``gcc`` / ``c++`` / ``g++`` / ``clang`` / ``nvcc`` first on PATH, each logging its call.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.helpers.installs import copy_repo, venv_on_this_environment

COMPILERS = ('cc', 'gcc', 'c++', 'g++', 'clang', 'clang++', 'nvcc')
V = '%d.%d' % sys.version_info[:2]
LOCK = f'py{V}.txt' if osp.isfile(osp.join(ROOT, 'requirements', 'lock', f'py{V}.txt')) else 'all.txt'


def _failing_compilers(folder, log):
    os.makedirs(folder)
    for name in COMPILERS:
        path = osp.join(folder, name)
        with open(path, 'w') as f:
            f.write(f'#!/bin/sh\necho "{name} $*" >> {log}\necho "{name}: no compiler on this machine" >&2\nexit 1\n')
        os.chmod(path, 0o755)
    return folder


def _setup(repo, venv, env, *args, timeout=1500):
    return subprocess.run(['bash', osp.join(repo, 'tools', 'setup_env.sh'), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_default_setup_installs_mmcv_lite_and_never_calls_a_compiler(tmp_path):
    repo = copy_repo(tmp_path / 'repo')
    python, _ = venv_on_this_environment(tmp_path / 'venv', with_pip=True, only=['torch', 'torchvision'])
    log = tmp_path / 'compiler_calls.log'
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PIP_CONSTRAINT', 'MMCV_CUDA',
                                                             'MMCV_COMPILED', 'SOFTFREE_CONSTRAINTS')}
    env.update(HOME=str(tmp_path / 'home'), SOFTFREE_VENV=str(tmp_path / 'venv'), CUDA_VISIBLE_DEVICES='',
               PATH=_failing_compilers(str(tmp_path / 'bin'), log) + os.pathsep + env['PATH'])
    env.pop('XDG_CACHE_HOME', None)
    proc = _setup(repo, tmp_path / 'venv', env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not log.exists(), f'the default set-up called a compiler:\n{log.read_text()[:2000]}'
    assert 'mmcv-lite 2.1.0, its ops served from torchvision' in proc.stderr
    assert (tmp_path / 'venv' / '.softfree_mm_setup_done').is_file()
    assert (tmp_path / 'home' / '.cache' / 'mim').is_dir()  # before any mim process of this home can race for it
    # exactly the lock: every package at its version, nothing beside it (torch is this environment's, at the lock's)
    marker = json.loads((tmp_path / 'venv' / '.softfree_mm_lock').read_text())
    assert marker == {'lock': f'requirements/lock/{LOCK}', 'not_from_lock': []}, marker
    check = subprocess.run([python, osp.join(repo, 'tools', 'lockfile.py'), 'check', osp.join(repo, marker['lock'])],
                           capture_output=True, text=True, env=env)
    assert check.returncode == 0 and check.stdout == '', check.stdout[-3000:]
    # what it installed: mmcv-lite, not mmcv; in a bare Python the stand-in of this copy serves mmcv._ext
    show = subprocess.run([python, '-m', 'pip', 'list', '--format=freeze'], capture_output=True, text=True, env=env)
    names = {line.split('==')[0].lower() for line in show.stdout.split()}
    assert 'mmcv-lite' in names and 'mmcv' not in names and 'mmdet' in names
    code = ('import sys, mmdet.models, mmseg.models, mmdet.evaluation, mmcv._ext; '
            'assert "softfree_mm" not in sys.modules; print(mmcv._ext.__file__)')
    bare = subprocess.run([python, '-c', code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert osp.realpath(bare.stdout.strip()) == osp.realpath(osp.join(repo, 'softfree_mm', 'mmcv_ext', 'ops.py'))

    # the check can fail: the compiled opt-in, in the same venv, reaches the compiler and stops there (on Python
    # 3.13, where mmcv 2.1.0's setup.py cannot work, the set-up refuses it in one line first)
    proc = _setup(repo, tmp_path / 'venv', dict(env, MMCV_COMPILED='1'))
    assert proc.returncode != 0
    if sys.version_info >= (3, 13):
        assert proc.returncode == 2 and 'MMCV_COMPILED=1 cannot work on Python 3.13' in proc.stderr, proc.stderr
    else:
        assert log.exists() and log.read_text().strip(), proc.stderr[-3000:]


def _plan_env(tmp_path, says='CPython 3.12.1'):
    """The plan's variables unset, an interpreter of a supported version that allows every plan (the plan
    printed does not depend on the suite's own Python), no environment yet."""
    env = {k: v for k, v in os.environ.items() if k not in ('MMCV_CUDA', 'MMCV_COMPILED')}
    return dict(env, PYTHON=_fake_python(tmp_path / 'py', says), SOFTFREE_VENV=str(tmp_path / 'venv'))


PLANS = {
    'lite': 'mmcv-lite 2.1.0, its ops served from torchvision (softfree_mm/mmcv_ext; no compiler)',
    'cpu': 'mmcv 2.1.0 built from source with CPU ops (a C++ compiler; about 25 minutes on 2 cores)',
    'cuda': 'mmcv 2.1.0 built from source with CPU and CUDA ops (nvcc and a C++ compiler; tens of minutes)',
}


@pytest.mark.parametrize('variables, plan', [
    ({}, 'lite'), ({'MMCV_COMPILED': '0'}, 'lite'), ({'MMCV_CUDA': '0'}, 'lite'), ({'MMCV_COMPILED': '1'}, 'cpu'),
    ({'MMCV_CUDA': '1'}, 'cuda'), ({'MMCV_CUDA': '1', 'MMCV_COMPILED': '1'}, 'cuda'),
    ({'MMCV_CUDA': '0', 'MMCV_COMPILED': '1'}, 'cpu'),
])
def test_the_mmcv_plan_follows_the_variables(variables, plan, tmp_path):
    env = _plan_env(tmp_path)
    proc = _setup(ROOT, None, dict(env, **variables), '--print-mmcv-plan', timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == PLANS[plan]


@pytest.mark.parametrize('variables, message', [
    ({'MMCV_COMPILED': '2'}, "MMCV_COMPILED must be 0 or 1, got '2'"),
    ({'MMCV_CUDA': 'yes'}, "MMCV_CUDA must be 0 or 1, got 'yes'"),
    ({'MMCV_CUDA': '1', 'MMCV_COMPILED': '0'}, "MMCV_CUDA=1 compiles mmcv's ops: it cannot go with MMCV_COMPILED=0"),
])
def test_bad_mmcv_variables_are_one_line_errors(variables, message, tmp_path):
    env = _plan_env(tmp_path)
    proc = _setup(ROOT, None, dict(env, **variables), '--print-mmcv-plan', timeout=60)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == f'[setup_env] error: {message}'


def _fake_python(folder, says):
    """An 'interpreter' that answers the set-up's one question (implementation and version) with ``says``."""
    os.makedirs(folder, exist_ok=True)
    path = osp.join(folder, 'python')
    with open(path, 'w') as f:
        f.write(f'#!/bin/sh\necho "{says}"\n')
    os.chmod(path, 0o755)
    return path


@pytest.mark.parametrize('says', ['CPython 3.9.18', 'CPython 3.10.13', 'CPython 3.14.0', 'PyPy 3.11.11'])
def test_an_unsupported_interpreter_is_one_line_naming_the_supported_range(tmp_path, says):
    python = _fake_python(tmp_path / 'bin', says)
    env = dict(os.environ, PYTHON=python, SOFTFREE_VENV=str(tmp_path / 'venv'))
    proc = _setup(ROOT, None, env, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == (f'[setup_env] error: {says} ({python}) is not supported: softfree_mm runs on '
                                   'CPython 3.11 to 3.13; set PYTHON to one of them, e.g. PYTHON=python3.13 make setup')
    assert not (tmp_path / 'venv').exists()
    proc = _setup(ROOT, None, dict(env, PYTHON=str(tmp_path / 'nothing')), timeout=60)
    assert proc.returncode == 2 and 'does not run; set PYTHON to a CPython 3.11 to 3.13' in proc.stderr


def test_the_supported_range_is_setup_pys_and_its_metadata_says_the_same(tmp_path):
    import ast
    tree = ast.parse(open(osp.join(ROOT, 'setup.py')).read())
    pythons = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], 'id', '') == 'PYTHONS')
    assert pythons == ('3.11', '3.12', '3.13')
    meta = subprocess.run([sys.executable, 'setup.py', '-q', 'egg_info', '--egg-base', str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert meta.returncode == 0, meta.stderr[-2000:]
    pkg_info = (tmp_path / 'softfree_mm.egg-info' / 'PKG-INFO').read_text()
    assert 'Requires-Python: <3.14,>=3.11' in pkg_info or 'Requires-Python: >=3.11,<3.14' in pkg_info, pkg_info[:800]
    for v in pythons:
        assert f'Classifier: Programming Language :: Python :: {v}\n' in pkg_info
    assert 'Python :: 3.10' not in pkg_info and 'Python :: 3.9' not in pkg_info


def test_another_interpreter_than_the_environments_is_one_line_saying_how_and_changes_nothing(tmp_path):
    """A used checkout: .venv holds 3.11; PYTHON=3.12 asks for another: one line (remove it, or set up beside it
    with VENV=.venv-3.12), exit 2, the environment untouched. Without PYTHON the environment's own interpreter is
    the one (its stamp holds it)."""
    venv = tmp_path / 'venv'
    _fake_python(venv / 'bin', 'CPython 3.11.7')
    stamp = venv / '.softfree_mm_setup_done'
    stamp.write_text('an older set-up\n')
    other = _fake_python(tmp_path / 'py312', 'CPython 3.12.1')
    env = dict(os.environ, PYTHON=other, SOFTFREE_VENV=str(venv))
    proc = _setup(ROOT, None, env, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == (f'[setup_env] error: {venv} is CPython 3.11.7, PYTHON={other} is CPython 3.12.1: '
                                   f'remove it (rm -rf {venv}) to set up again with CPython 3.12.1, or set up beside '
                                   f'it: make setup test VENV=.venv-3.12 PYTHON={other}')
    assert stamp.read_text() == 'an older set-up\n' and sorted(os.listdir(venv)) == ['.softfree_mm_setup_done', 'bin']


def test_the_compiled_mmcv_on_python_3_13_is_one_line(tmp_path):
    python = _fake_python(tmp_path / 'bin', 'CPython 3.13.0')
    env = {k: v for k, v in os.environ.items() if k not in ('MMCV_CUDA', 'MMCV_COMPILED')}
    env.update(PYTHON=python, SOFTFREE_VENV=str(tmp_path / 'venv'))
    for variables in ({'MMCV_COMPILED': '1'}, {'MMCV_CUDA': '1'}):
        proc = _setup(ROOT, None, dict(env, **variables), '--print-mmcv-plan', timeout=60)
        assert proc.returncode == 2 and proc.stdout == ''
        assert proc.stderr.strip() == (
            "[setup_env] error: MMCV_COMPILED=1 cannot work on Python 3.13: mmcv 2.1.0's setup.py reads its version "
            'from locals() after exec(), which Python 3.13 changed; build it with Python 3.11 or 3.12 '
            '(PYTHON=python3.12), or use the default set-up (mmcv-lite, no compiler)')
    proc = _setup(ROOT, None, env, '--print-mmcv-plan', timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == PLANS['lite']
