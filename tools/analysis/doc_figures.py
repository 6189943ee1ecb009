#!/usr/bin/env python
"""Write every generated section of the README, docs/warm_start.md and docs/study.md from the committed CSVs.

    python tools/analysis/doc_figures.py [--check]

Each section sits between its two marker lines (softfree_mm/analysis/doc_figures.py lists them, with the CSVs each is
made from: the kernel study's, the warm-start grid's, the task study's, the cost sweep's). Run it after a grid's CSVs
change; --check writes nothing and exits 1 naming each section whose page differs from what the CSVs make.
"""
import sys

from _cli import ROOT, Parser


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('--check', action='store_true', help='write nothing; exit 1 when a section is stale')
    args = p.parse_args(argv)
    from softfree_mm.analysis import doc_figures
    if args.check:
        stale = doc_figures.stale(ROOT)
        for s in stale:
            print(f'stale: {s}')
        return 1 if stale else 0
    for page in doc_figures.write(ROOT):
        print(f'written: {page}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
