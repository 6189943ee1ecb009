#!/usr/bin/env python
"""The warm-start recipe rule, version 2, applied to a recipes grid's classifier rows.

    python tools/analysis/recipe_rule.py [--csv docs/results/warm_start/classifiers.csv] [--budget N]
        [--default transfer] [--docs docs/warm_start.md]

Per backbone of the grid and per budget it ran (--budget: that one only), every recipe it holds against the default
its runs were made beside (--default): the paired top-1 difference averaged over the kernels of each seed, a 95 %
t-interval over the seeds, and whether it replaces the default (softfree_mm/analysis/recipe_rule.py states the rule).
Prints the verdict lines and which budget ships; --docs writes every budget's between the rule's markers of that
page.
"""
import csv
import os.path as osp
import sys

from _cli import Parser, fail


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('--csv', default='docs/results/warm_start/classifiers.csv')
    p.add_argument('--budget', type=int, default=None,
                   help='the warm starts\' iterations in all (default: every budget the grid ran)')
    p.add_argument('--default', default='transfer', help='the recipe the grid\'s runs were made beside')
    p.add_argument('--docs', default=None)
    args = p.parse_args(argv)
    if not osp.isfile(args.csv):
        fail(f'--csv {args.csv}: no such file')
    from softfree_mm.analysis import recipe_rule as rr
    with open(args.csv, newline='') as f:
        rows = list(csv.DictReader(f))
    backbones = list(dict.fromkeys(r['backbone'] for r in rows if r.get('backbone')))
    if not backbones:
        fail(f'--csv {args.csv}: no grid rows (no backbone column values)')
    defaults = {bb: args.default for bb in backbones}
    try:
        shipped = rr.shipped_budget(rows)
    except ValueError as e:  # a grid without one from-scratch length or without the shipped budget: said, not fatal
        shipped = None
        print(f'note: {e}')
    for budget in [args.budget] if args.budget else rr.budgets(rows):
        print(f'at {budget} iterations' + (' (the fraction that ships)' if budget == shipped else '') + ':')
        print('\n'.join(rr.lines(rr.choose(rows, budget, defaults), rr.NAMES)))
    if args.docs:
        rr.write_docs(args.docs, rows, defaults)
        print(f'docs: {args.docs}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
