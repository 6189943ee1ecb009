"""What the test files share: the repository root, loading a tool as a module and its one-line refusals (the other
helpers sit beside this file: presets, demo, home, models). Test files import them as ``tests.helpers``; only
tests/conftest.py touches sys.path."""
import importlib.util
import os.path as osp

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))  # the repository
TOOLS = osp.join(ROOT, 'tools')


def load_tool(name, module_name=None):
    """tools/<name>.py (``'train'``, ``'analysis/study'``) as a fresh module, executed as running the tool would
    (tests/conftest.py puts tools/ on sys.path for the tools' own imports; the analysis tools add their folder)."""
    path = osp.join(TOOLS, f'{name}.py')
    spec = importlib.util.spec_from_file_location(module_name or f'softfree_tool_{osp.basename(name)}', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main_as_command(module, capsys):
    """A tool's ``main(argv)`` as its command line wraps it: a UsageError is ``error: ...`` on stderr and status 2,
    argparse's own refusals their exit code; ``call(*args) -> (status, stdout, stderr)``."""
    import sys

    from softfree_mm.engine.errors import UsageError

    def call(*args):
        try:
            status = module.main(list(args))
        except UsageError as e:
            print(f'error: {e}', file=sys.stderr)
            status = 2
        except SystemExit as e:
            status = e.code
        out, err = capsys.readouterr()
        return status, out, err
    return call


def one_line_error(capsys, name, argv, match):
    """tools/<name>.py refuses ``argv``: exit status 2 and one ``error:`` line on stderr that contains ``match``."""
    tool = load_tool(name)
    with pytest.raises(SystemExit) as e:
        if hasattr(tool, 'run'):
            tool.run(tool.main, argv)
        else:
            tool.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert len(err) == 1 and err[0].startswith('error:') and match in err[0], err
