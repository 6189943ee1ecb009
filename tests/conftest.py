"""Suite-wide settings.

Home folder: the session runs under a fresh, empty HOME and XDG_CACHE_HOME (made at the start, removed at the end;
XDG_CONFIG_HOME, MPLCONFIGDIR, TORCH_HOME, MMENGINE_HOME unset), and so does every tool, torchrun and mim process
the tests start: no test can depend on what an earlier run left in the user's home (a green run once hid a mim start
that fails on a machine that never ran mim). The folders the stack creates on first use are made first
(tests/helpers/home.py), as processes started side by side would race to create them. Triton's kernel cache stays
the user's (a compile cache: it only saves time on a GPU machine).

Tools: tools/ is on sys.path (after everything else: a tool's name never hides a package), as running a tool
puts its folder first, so that ``tests.helpers.load_tool`` and plain imports of a tool's module find the tools'
own helper modules (tool_warnings, analysis/_cli). It is the one sys.path edit of the suite.

Demo data: many tests write their own ``data/demo`` root (through softfree_mm/engine/demo_data.py, which
tools/make_demo_data.py and the tools call). ``SOFTFREE_DEMO_CACHE`` makes each demo set be generated once per test
session and hard-linked into every root that asks for it (subprocesses inherit the variable). Tests that check the
generator itself remove it.
"""
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

pytest.register_assert_rewrite('tests.helpers')  # the helpers' asserts report like the tests' own
from tests.helpers import TOOLS  # noqa: E402
from tests.helpers.home import fresh_home_env, prepare_home  # noqa: E402

if TOOLS not in sys.path:
    sys.path.append(TOOLS)

# Under pytest-xdist (``make test`` runs TEST_WORKERS processes) each worker gets its share of the cores, so that the
# workers' torch threads do not oversubscribe the machine; the tools the tests start inherit the setting.
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1') or 1)
if _WORKERS > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    for _var in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        os.environ.setdefault(_var, str(_THREADS))
    import torch

    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


_SESSION_HOME = 'SOFTFREE_TEST_HOME'


def pytest_configure(config):
    if os.environ.get(_SESSION_HOME) and os.environ.get('HOME') == os.environ[_SESSION_HOME]:
        return  # a pytest-xdist worker: it shares the controller's session home
    os.environ.setdefault('TRITON_CACHE_DIR', os.path.join(os.path.expanduser('~'), '.triton', 'cache'))
    root = tempfile.mkdtemp(prefix='softfree_test_home_')
    env = fresh_home_env(os.environ, root=root)
    for var in set(os.environ) - set(env):
        del os.environ[var]
    os.environ.update(env)
    os.environ[_SESSION_HOME] = env['HOME']
    prepare_home(os.environ)
    config._softfree_home_root = root


def pytest_unconfigure(config):
    root = getattr(config, '_softfree_home_root', None)
    if root:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope='session', autouse=True)
def demo_data_cache(tmp_path_factory):
    if 'SOFTFREE_DEMO_CACHE' in os.environ:  # set by the caller: keep theirs
        yield os.environ['SOFTFREE_DEMO_CACHE']
        return
    if os.environ.get('PYTEST_XDIST_WORKER'):  # one cache for all the session's workers (the generator locks it)
        cache = tmp_path_factory.getbasetemp().parent / 'demo_data_cache'
        cache.mkdir(exist_ok=True)
        cache = str(cache)
    else:
        cache = str(tmp_path_factory.mktemp('demo_data_cache'))
    os.environ['SOFTFREE_DEMO_CACHE'] = cache
    yield cache
    os.environ.pop('SOFTFREE_DEMO_CACHE', None)


# The longest test files first, named by their path below tests/ (measured with --durations=0 on the 2-core CI
# machine: each takes 30-250 s, mostly tool subprocesses). pytest-xdist hands out whole files in collection order,
# one at a time as a worker frees up (the Makefile passes --no-loadscope-reorder; xdist's own reorder, by number of
# tests, would put these one-test files last and leave one worker idle while the other runs the main job). Longest
# first keeps both busy to the end.
_LONGEST_FIRST = ('tools/test_warm_start_chain.py', 'tools/test_setup_env.py', 'demo/test_demo_main_job.py',
                  'tools/test_warm_start.py', 'tools/test_setup_source_build.py', 'demo/test_demo_train.py',
                  'test_configs.py', 'tools/test_benchmark_cost.py', 'demo/test_demo_determinism.py',
                  'tools/test_mim.py', 'test_mmcv_ext.py', 'engine/test_tools_resume.py', 'models/test_export.py',
                  'tools/test_gpu_check.py', 'demo/test_demo_data.py', 'tools/test_tools_dist.py',
                  'attention/test_attention_properties.py', 'engine/test_tools_bad_inputs.py',
                  'models/test_openmmlab_fit.py')
_TESTS = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}

    def key(item):
        return rank.get(item.path.resolve().relative_to(_TESTS).as_posix(), len(rank))

    items.sort(key=key)  # stable: the rest keep their order
