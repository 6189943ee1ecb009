#!/usr/bin/env python
"""Write the embedded demo data sets under ``data/demo/`` (deterministic, a few seconds): COCO-style instances,
ADE20K-style segmentation and ImageNet-style classification of real scanned digits (the generator:
softfree_mm/engine/demo_data.py, which says what is written where).

Usage: ``python tools/make_demo_data.py [--out data/demo] [--seed 0] [--only coco ade imagenet] [--force]``

With ``SOFTFREE_DEMO_CACHE=DIR`` in the environment, each set is generated once under ``DIR`` and hard-linked
(copied where links fail) into every ``--out`` that asks for it.
"""
import argparse
import os.path as osp
import sys

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # the repository, for `softfree_mm`
from softfree_mm.engine.demo_data import TASKS, make_demo_data  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default='data/demo', help='output folder (default: data/demo)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--only', nargs='+', default=list(TASKS), choices=TASKS, help='which sets to write')
    p.add_argument('--force', action='store_true', help='rewrite sets that already exist')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    make_demo_data(args.out, args.seed, args.only, args.force)
    print(f'demo data ready under {args.out}: {", ".join(args.only)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
