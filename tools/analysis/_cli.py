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
    """'poly:degree=3' -> normalised kernel config (the tools' kernel syntax); one-line error when bad."""
    from softfree_mm.attention import normalize_cfg, parse_kernel
    out = []
    for text in texts:
        try:
            out.append(normalize_cfg(parse_kernel(text)))
        except (KeyError, TypeError, ValueError) as e:
            fail(f'--kernels {text}: {e.args[0] if e.args else e}')
    return out


def probe_args(argv, doc: str, out: str, extra=None, check=None):
    """The options of the tools that probe a model on the images of a split (injectivity, locality): config,
    checkpoint, --split, --num-images, --layer, --out (default work_dirs/analysis/OUT), --cfg-options;
    ``extra(parser)`` adds a tool's own options, ``check(args)`` returns what is wrong with them (or None)."""
    from mmengine.config import DictAction
    p = Parser(doc)
    p.add_argument('config')
    p.add_argument('checkpoint', help="a .pth file, or 'none' for the initialised model")
    p.add_argument('--split', default='val', help='train, val or test (the config\'s <split>_dataloader)')
    p.add_argument('--num-images', type=int, default=8)
    if extra is not None:
        extra(p)
    p.add_argument('--layer', help='one layer (name or index); default: every layer')
    p.add_argument('--out', default=f'work_dirs/analysis/{out}', help='output prefix (.csv, .png)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    if args.num_images < 1:
        p.error(f'--num-images must be >= 1, got {args.num_images}')
    problem = None if check is None else check(args)
    if problem:
        p.error(problem)
    return args


def run(main, argv=None):
    """Call ``main``; UsageError -> one line, exit status 2."""
    from softfree_mm.engine.errors import UsageError
    try:
        return main(argv)
    except UsageError as e:
        fail(str(e))
