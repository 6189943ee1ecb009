#!/usr/bin/env python
"""Curves of the attention norms AttentionStatsHook recorded during training: one line per layer.

    python tools/analysis/plot_attention_stats.py WORK_DIR|RUN_DIR|attention_stats.json [--metrics fro jac]
        [--head H] [--normalise] [--prefix attn] [--out PREFIX]

WORK_DIR: the newest run under it (``<work_dir>/<timestamp>/vis_data/attention_stats.json``). Left panel: ||A||_F,
right panel: the Frobenius norm of the Jacobian of A with respect to its scores, against the training iteration;
per layer the mean over heads (--head H: that head only). --normalise divides by sqrt(rows) (softmax's bound on
||A||_F becomes 1, on the Jacobian 2). Writes PREFIX.png and PREFIX.csv (step, layer, metric, value); PREFIX
defaults to attention_stats beside the JSON file. Bad input: one line, exit status 2.
"""
import csv
import glob
import json
import math
import os
import os.path as osp
import sys
from collections import OrderedDict

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import Parser, fail  # noqa: E402


def find_json(path: str, name: str = 'attention_stats.json') -> str:
    if osp.isfile(path):
        return path
    if not osp.isdir(path):
        fail(f'{path}: no such file or folder (give a work dir, a run dir or an attention_stats.json)')
    found = glob.glob(osp.join(path, 'vis_data', name)) or glob.glob(osp.join(path, '*', 'vis_data', name))
    if not found:
        fail(f'{path}: no */vis_data/{name} (was AttentionStatsHook in custom_hooks?)')
    return max(found, key=osp.getmtime)


def read_records(path: str, prefix: str):
    """layer -> metric -> [(step, value)], in file order."""
    out = OrderedDict()
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                fail(f'{path}: line {n} is not JSON')
            step = rec.get('step')
            for key, val in rec.items():
                if not key.startswith(prefix + '/'):
                    continue
                layer, _, metric = key[len(prefix) + 1:].rpartition('/')
                out.setdefault(layer, OrderedDict()).setdefault(metric, []).append((step, val))
    if not out:
        fail(f'{path}: no {prefix}/... scalars (another --prefix?)')
    return out


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('path')
    p.add_argument('--metrics', nargs='+', default=['fro', 'jac'], choices=['fro', 'jac'])
    p.add_argument('--head', type=int, help='one head instead of the mean over heads')
    p.add_argument('--normalise', action='store_true', help='divide by sqrt(rows)')
    p.add_argument('--prefix', default='attn', help="the hook's scalar prefix")
    p.add_argument('--out', help='output prefix (default: attention_stats beside the JSON file)')
    args = p.parse_args(argv)
    path = find_json(args.path)
    records = read_records(path, args.prefix)
    suffix = '' if args.head is None else f'_h{args.head}'
    if args.head is not None and not any(f'fro{suffix}' in m for m in records.values()):
        fail(f'--head {args.head}: no layer recorded that head (per_head=False, or fewer heads)')
    by_layer = OrderedDict()
    table = []
    for layer, metrics in records.items():
        rows = dict(metrics.get('rows', []))
        d = {}
        for metric in args.metrics:
            pts = metrics.get(metric + suffix)
            if not pts:
                continue
            if args.normalise:
                pts = [(s, v / math.sqrt(rows[s])) for s, v in pts if rows.get(s)]
            d[metric] = [v for _, v in pts]
            d['step_' + metric] = [s for s, _ in pts]
            table += [(s, layer, metric + suffix, v) for s, v in pts]
        if d:
            by_layer[layer] = d
    prefix = args.out or osp.join(osp.dirname(path), 'attention_stats')
    os.makedirs(osp.dirname(osp.abspath(prefix)), exist_ok=True)
    from softfree_mm.analysis import plots
    what = ' / sqrt(rows)' if args.normalise else ''
    plots.curves_per_layer(by_layer, prefix + '.png', keys=args.metrics,
                           labels=(f'||A||_F{what}', f'||dA/dS||_F{what}'),
                           title=f'{path}: {"mean over heads" if args.head is None else f"head {args.head}"}')
    with open(prefix + '.csv', 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['step', 'layer', 'metric', 'value'])
        w.writerows(table)
    print(f'wrote {prefix}.png and {prefix}.csv ({len(by_layer)} layers)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
