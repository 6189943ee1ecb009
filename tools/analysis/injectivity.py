#!/usr/bin/env python
"""Confusions per image and layer (InLine's injectivity measure): pairs of distinct queries with (nearly) the same
attention row.

    python tools/analysis/injectivity.py CONFIG CHECKPOINT [--split val] [--num-images 8] [--threshold 1e-3]
        [--query-threshold 1e-3] [--layer L] [--out work_dirs/analysis/injectivity] [--cfg-options K=V ...]

For every image of the split (the first --num-images) and every attention layer, the pairs of queries that are at
least --query-threshold apart (L2) but whose attention rows differ by less than --threshold (L2; InLine uses 1e-3)
are counted within each attention problem (a window's queries share its keys; padding queries left out) and summed
over the problems of the image, per head. Rows are the kernel's A; 'matrix' says 'partial' where part of the output
is no matrix shared by v's channels (InLine's official per-channel residual). Writes PREFIX.csv (image, layer, kind,
matrix, head, queries, pairs, confusions)
and PREFIX.png (mean confusions per image of each layer, summed over heads). CHECKPOINT 'none' measures the
initialised model. Bad input: one line, exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import probe_args, run  # noqa: E402


def _thresholds(p):
    p.add_argument('--threshold', type=float, default=1e-3, help='rows closer than this (L2) are confused')
    p.add_argument('--query-threshold', type=float, default=1e-3,
                   help='queries at least this far apart (L2) are distinct')


def _bad_thresholds(args):
    if not (args.threshold > 0 and args.query_threshold >= 0):
        return f'--threshold must be > 0 and --query-threshold >= 0, got {args.threshold}, {args.query_threshold}'
    return None


def parse_args(argv=None):
    return probe_args(argv, __doc__, 'injectivity', _thresholds, _bad_thresholds)


def main(argv=None):
    args = parse_args(argv)
    from softfree_mm.analysis import plots, probe
    from softfree_mm.analysis.injectivity import call_confusions
    from softfree_mm.analysis.tables import write_csv

    probe.check_checkpoint(args.checkpoint)
    cfg = probe.load_checked(args.config, args.cfg_options)
    ds = probe.build_dataset(cfg, args.split, args.config)
    model = probe.build_model(cfg, args.checkpoint, args.config)
    layers = probe.pick_layers(model, args.layer)
    rows, order = [], []
    for name, sample in probe.dataset_samples(ds, args.num_images):
        _, cap = probe.run_backbone(model, sample, layers)
        for layer, call in cap.calls.items():
            if layer not in order:
                order.append(layer)
            conf, pairs, queries = call_confusions(call, 0, args.threshold, args.query_threshold)
            matrix = 'complete' if call.complete else 'partial'
            for h in range(call.num_heads):
                rows.append(dict(image=name, layer=layer, kind=call.layout.kind, matrix=matrix, head=h, queries=queries,
                                 pairs=int(pairs[h]), confusions=int(conf[h])))
    csv_path, png_path = probe.out_paths(args.out)
    write_csv(csv_path, rows, ['image', 'layer', 'kind', 'matrix', 'head', 'queries', 'pairs', 'confusions'])
    images = sorted({r['image'] for r in rows})
    means = [sum(r['confusions'] for r in rows if r['layer'] == layer) / len(images) for layer in order]
    plots.per_layer_bars(order, means, png_path, ylabel='confusions per image (sum over heads)', log=True,
                         title=f'{osp.basename(args.config)}: {len(images)} {args.split} images, rows closer than '
                               f'{args.threshold:g} for queries >= {args.query_threshold:g} apart')
    for layer, m in zip(order, means):
        print(f'{layer}: {m:.1f} confusions per image')
    print(f'wrote {csv_path} and {png_path}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
