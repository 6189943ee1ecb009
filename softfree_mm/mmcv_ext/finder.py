"""Serves ``mmcv._ext`` from ``ops.py`` when no compiled extension is found. Standard library only: it is loaded at
the start of every Python process of the environment (by the ``.pth`` line below, which an install of softfree_mm
puts in site-packages), before anything can import ``mmcv.ops``.

The finder sits at the END of ``sys.meta_path``: Python's own path finder looks first, so a compiled
``mmcv/_ext*.so`` (an mmcv built from source) is always the one imported and the stand-in stays out of the way.
"""
import importlib.util
import os
import sys

NAME = 'mmcv._ext'
STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ops.py')
MARK = 'softfree_mm_mmcv_ext'  # attribute that tells the finder apart, however often this file was loaded

# site-packages/softfree_mm-mmcv-ext.pth: one line that site.py executes; it finds the installed package without
# importing it (its __init__ imports torch and mmengine) and loads this file on its own. A softfree_mm found first
# that has no stand-in (an older checkout on PYTHONPATH) leaves mmcv as it is instead of a traceback at every start.
PTH_NAME = 'softfree_mm-mmcv-ext.pth'
PTH_LINE = ("import importlib.util as u, os.path as p; s = u.find_spec('softfree_mm'); "
            "l = s and s.submodule_search_locations and s.submodule_search_locations[0] + '/mmcv_ext/finder.py'; "
            "f = l and p.isfile(l) and u.spec_from_file_location('softfree_mm_mmcv_ext_finder', l); "
            "m = f and u.module_from_spec(f); m and (f.loader.exec_module(m) or m.install())\n")


class StandInFinder:
    softfree_mm_mmcv_ext = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        return importlib.util.spec_from_file_location(NAME, STANDIN)


def install():
    """Append the finder once per process (idempotent)."""
    if not any(getattr(f, MARK, False) for f in sys.meta_path):
        sys.meta_path.append(StandInFinder())


def is_standin(module) -> bool:
    """Whether a loaded ``mmcv._ext`` is this stand-in (not a compiled extension)."""
    path = getattr(module, '__file__', None) or ''
    return os.path.realpath(path) == os.path.realpath(STANDIN)
