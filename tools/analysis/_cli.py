"""What the analysis tools share before any heavy import: a parser whose errors are one line (exit status 2)."""
import argparse
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the repository, for `softfree_mm`


class Parser(argparse.ArgumentParser):
    """argparse with the module docstring as help and one-line errors."""

    def __init__(self, doc: str, **kwargs):
        head, _, rest = doc.partition('\n\n')
        super().__init__(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter,
                         **kwargs)

    def error(self, message):
        fail(f'{message} (see {self.prog} --help)')


def fail(message: str):
    print(f'error: {message}', file=sys.stderr)
    sys.exit(2)


def kernel_specs(texts):
    """'poly:degree=3' -> normalised kernel config (the syntax of tools/benchmark.py); one-line error when bad."""
    sys.path.insert(0, osp.join(ROOT, 'tools'))
    from benchmark import parse_kernel
    from softfree_mm.attention import normalize_cfg
    out = []
    for text in texts:
        try:
            out.append(normalize_cfg(parse_kernel(text)))
        except (KeyError, TypeError, ValueError) as e:
            fail(f'--kernels {text}: {e.args[0] if e.args else e}')
    return out


def run(main, argv=None):
    """Call ``main``; UsageError -> one line, exit status 2."""
    from softfree_mm.engine.errors import UsageError
    try:
        return main(argv)
    except UsageError as e:
        fail(str(e))
