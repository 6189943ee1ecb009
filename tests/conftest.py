"""Suite-wide settings.

Demo data: many tests write their own ``data/demo`` root (through tools/make_demo_data.py or the tools that call
it). ``SOFTFREE_DEMO_CACHE`` makes each demo set be generated once per test session and hard-linked into every root
that asks for it (subprocesses inherit the variable). Tests that check the generator itself remove it.
"""
import os

import pytest


@pytest.fixture(scope='session', autouse=True)
def demo_data_cache(tmp_path_factory):
    if 'SOFTFREE_DEMO_CACHE' in os.environ:  # set by the caller: keep theirs
        yield os.environ['SOFTFREE_DEMO_CACHE']
        return
    cache = str(tmp_path_factory.mktemp('demo_data_cache'))
    os.environ['SOFTFREE_DEMO_CACHE'] = cache
    yield cache
    os.environ.pop('SOFTFREE_DEMO_CACHE', None)
