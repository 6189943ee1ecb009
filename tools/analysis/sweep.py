#!/usr/bin/env python
"""Train a config once per attention kernel; final metric, seconds per iteration and peak memory as CSV, markdown
table and bar chart (a small-scale version of the seed papers' kernel tables).

    python tools/analysis/sweep.py CONFIG [CONFIG ...] --kernels softmax poly:degree=3 linear inline ...
        [--key model.backbone.attn_cfg] [--metric accuracy/top1] [--work-dir work_dirs/sweep]
        [--out PREFIX] [--in-process] [--cfg-options K=V ...]

Each (config, kernel) pair is trained through tools/train.py with a child config that sets the kernel at --key
(``_delete_=True``: the whole kernel config is replaced), in its own process (its peak memory is that process's;
--in-process: all in this one, faster to start). --cfg-options go to every run (e.g. a shorter schedule). A kernel
the backbone refuses (or a run that fails) gets a 'failed' row with the error's last line; the others go on.
Numbers come from each run's log: the last validation metric (--metric, default the task's usual one), the mean
logged time per iteration after the first record, CUDA's max allocated memory on a GPU, else the training
process's peak resident memory. Writes PREFIX.csv, PREFIX.md and PREFIX.png (PREFIX defaults to
<work-dir>/sweep). Bad input: one line, exit status 2.
"""
import csv
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import Parser, fail, kernel_specs, run  # noqa: E402


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('configs', nargs='+', metavar='CONFIG')
    p.add_argument('--kernels', nargs='+', required=True, help='kernel specs: name or name:arg=value,...')
    p.add_argument('--key', default='model.backbone.attn_cfg', help='where the kernel config lives')
    p.add_argument('--metric', help='the validation metric to report (default: accuracy/top1, mIoU or coco/bbox_mAP)')
    p.add_argument('--work-dir', default='work_dirs/sweep')
    p.add_argument('--out', help='output prefix (default: <work-dir>/sweep)')
    p.add_argument('--in-process', action='store_true', help='train in this process instead of one per run')
    p.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE', help='applied to every run')
    args = p.parse_args(argv)
    from mmengine.config import DictAction
    options = {}
    for item in args.cfg_options:
        key, eq, val = item.partition('=')
        if not eq or not key:
            fail(f'--cfg-options {item!r}: expected KEY=VALUE')
        options[key] = DictAction._parse_iterable(val)
    specs = kernel_specs(args.kernels)
    if not args.key or any(not part.isidentifier() for part in args.key.split('.')):
        fail(f'--key must be a dotted path of names such as model.backbone.attn_cfg, got {args.key!r}')
    from softfree_mm.engine.config_checks import load_config
    for config in args.configs:  # a bad config or option fails here, before any training
        cfg = load_config(config, options)
        node = cfg._cfg_dict
        for part in args.key.split('.'):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            fail(f'--key {args.key}: {config} has no {args.key} (the kernel config to replace)')

    from softfree_mm.analysis import plots
    from softfree_mm.analysis.sweep import FIELDS, markdown, series, sweep
    from softfree_mm.analysis.probe import out_paths
    train_py = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'train.py')
    rows = []
    for config in args.configs:
        rows += sweep(config, specs, args.work_dir, train_py, args.cfg_options, key=args.key, metric=args.metric,
                      in_process=args.in_process, echo=lambda m: print(m, flush=True))
    csv_path, md_path, png_path = out_paths(args.out or osp.join(args.work_dir, 'sweep'), ('csv', 'md', 'png'))
    with open(csv_path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ('' if r[k] is None else r[k]) for k in FIELDS})
    table = markdown(rows)
    with open(md_path, 'w') as f:
        f.write(table + '\n')
    metric = next((r['metric_name'] for r in rows if r['metric_name']), 'metric')
    groups = list(dict.fromkeys(r['config'] for r in rows))
    plots.grouped_bars(groups, series(rows), png_path, panels=('metric', 's_per_iter', 'peak_mem_mib'),
                       titles=(metric, 's / iter', 'peak memory (MiB)'))
    print(table)
    print(f'wrote {csv_path}, {md_path} and {png_path}')
    return 0 if any(r['status'] == 'ok' for r in rows) else 1


if __name__ == '__main__':
    sys.exit(run(main))
