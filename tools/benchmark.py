#!/usr/bin/env python
"""Kernel speed and activation memory as ratios to softmax, measured in one run.

    python tools/benchmark.py --sides 16 32 64 --kernels softmax poly:degree=1 poly linear inline soft

Prints a markdown table (the one in the README comes from this command).
"""
import argparse
import os
import sys


def parse_kernel(text):
    """'poly:degree=1,scale=0.1' -> dict(type='poly', degree=1, scale=0.1)."""
    name, _, rest = text.partition(':')
    cfg = dict(type=name)
    for item in filter(None, rest.split(',')):
        key, _, val = item.partition('=')
        for cast in (int, float):
            try:
                val = cast(val)
                break
            except ValueError:
                continue
        if val in ('True', 'False'):
            val = val == 'True'
        cfg[key] = val
    return cfg if len(cfg) > 1 else name


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch

    from softfree_mm.analysis.benchmark import compare, markdown
    from softfree_mm.attention import normalize_cfg

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--kernels', nargs='+', default=['softmax', 'poly:degree=1', 'poly', 'relu', 'linear',
                                                    'efficient', 'taylor', 'inline', 'soft'])
    p.add_argument('--sides', nargs='+', type=int, default=[16, 32, 64], help='token grid sides (N = side^2)')
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--head-dim', type=int, default=32)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = p.parse_args(argv)
    kernels = [parse_kernel(k) for k in args.kernels]
    for k in kernels:
        try:
            normalize_cfg(k)
        except (KeyError, TypeError, ValueError) as e:
            p.error(str(e))
    rows = compare(kernels, args.sides, heads=args.heads, head_dim=args.head_dim, repeats=args.repeats,
                   device=args.device)
    print(f'device={args.device} heads={args.heads} head_dim={args.head_dim} threads={torch.get_num_threads()}')
    print(markdown(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
