"""tools/setup_env.sh as a user runs it: the default set-up installs mmcv-lite and never calls a compiler; the
compiled mmcv is an opt-in chosen by MMCV_COMPILED / MMCV_CUDA.

The set-up runs for real, from a copy of the repository, into a scratch venv that sees only torch and torchvision
(and what they require) from this environment, so everything else (mmengine, mmcv, mmdet, mmseg, mmpretrain, timm,
the test requirements, this package) is installed as on a fresh machine, with a fresh empty home folder and
failing ``cc`` / ``gcc`` / ``c++`` / ``g++`` / ``clang`` / ``nvcc`` first on PATH, each logging its call.
"""
import os
import os.path as osp
import subprocess

import pytest

from tests.helpers import ROOT
from tests.helpers.installs import copy_repo, venv_on_this_environment

COMPILERS = ('cc', 'gcc', 'c++', 'g++', 'clang', 'clang++', 'nvcc')


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
    # what it installed: mmcv-lite, not mmcv; in a bare Python the stand-in of this copy serves mmcv._ext
    show = subprocess.run([python, '-m', 'pip', 'list', '--format=freeze'], capture_output=True, text=True, env=env)
    names = {line.split('==')[0].lower() for line in show.stdout.split()}
    assert 'mmcv-lite' in names and 'mmcv' not in names and 'mmdet' in names
    code = ('import sys, mmdet.models, mmseg.models, mmdet.evaluation, mmcv._ext; '
            'assert "softfree_mm" not in sys.modules; print(mmcv._ext.__file__)')
    bare = subprocess.run([python, '-c', code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert osp.realpath(bare.stdout.strip()) == osp.realpath(osp.join(repo, 'softfree_mm', 'mmcv_ext', 'ops.py'))

    # the check can fail: the compiled opt-in, in the same venv, reaches the compiler and stops there
    proc = _setup(repo, tmp_path / 'venv', dict(env, MMCV_COMPILED='1'))
    assert proc.returncode != 0
    assert log.exists() and log.read_text().strip(), proc.stderr[-3000:]


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
def test_the_mmcv_plan_follows_the_variables(variables, plan):
    env = {k: v for k, v in os.environ.items() if k not in ('MMCV_CUDA', 'MMCV_COMPILED')}
    proc = _setup(ROOT, None, dict(env, **variables), '--print-mmcv-plan', timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == PLANS[plan]


@pytest.mark.parametrize('variables, message', [
    ({'MMCV_COMPILED': '2'}, "MMCV_COMPILED must be 0 or 1, got '2'"),
    ({'MMCV_CUDA': 'yes'}, "MMCV_CUDA must be 0 or 1, got 'yes'"),
    ({'MMCV_CUDA': '1', 'MMCV_COMPILED': '0'}, "MMCV_CUDA=1 compiles mmcv's ops: it cannot go with MMCV_COMPILED=0"),
])
def test_bad_mmcv_variables_are_one_line_errors(variables, message):
    env = {k: v for k, v in os.environ.items() if k not in ('MMCV_CUDA', 'MMCV_COMPILED')}
    proc = _setup(ROOT, None, dict(env, **variables), '--print-mmcv-plan', timeout=60)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip() == f'[setup_env] error: {message}'
