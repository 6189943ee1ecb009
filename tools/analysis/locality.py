#!/usr/bin/env python
"""Locality per image and layer (InLine's measure): the attention mass each query puts on its 3x3 neighbourhood.

    python tools/analysis/locality.py CONFIG CHECKPOINT [--split val] [--num-images 8] [--layer L]
        [--out work_dirs/analysis/locality] [--cfg-options K=V ...]

For every image of the split (the first --num-images), attention layer and head: the mean over real queries of
sum_j A_ij * share_j, share_j the part of key j inside the query's 3x3 token neighbourhood in image space (window,
stripe and padding layouts placed on the grid; a spatially reduced PVT key counts with the fraction of its cell in
the neighbourhood), and the same measure for uniform attention over the keys each query may see (9/N for an
interior query of a global layer). Channel-attention layers (XCiT) have no token neighbourhood: they are listed
with an empty value. 'matrix' says 'partial' where part of the output is no matrix shared by v's channels (InLine's
official per-channel 3x3 residual, local by construction, is then not counted). Writes PREFIX.csv (image, layer,
kind, matrix, head, queries, mass_3x3, uniform_3x3) and PREFIX.png
(mean per layer, uniform reference marked). CHECKPOINT 'none' measures the initialised model. Bad input: one line,
exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import probe_args, run  # noqa: E402


def main(argv=None):
    args = probe_args(argv, __doc__, 'locality')
    from softfree_mm.analysis import plots, probe
    from softfree_mm.analysis.locality import call_locality
    from softfree_mm.analysis.tables import write_csv

    probe.check_checkpoint(args.checkpoint)
    cfg = probe.load_checked(args.config, args.cfg_options)
    ds = probe.build_dataset(cfg, args.split, args.config)
    model = probe.build_model(cfg, args.checkpoint, args.config)
    layers = probe.pick_layers(model, args.layer)
    rows, order, notes = [], [], {}
    for name, sample in probe.dataset_samples(ds, args.num_images):
        _, cap = probe.run_backbone(model, sample, layers)
        for layer, call in cap.calls.items():
            if layer not in order:
                order.append(layer)
            matrix = 'complete' if call.complete else 'partial'
            try:
                mass, uniform, queries = call_locality(call, 0)
            except ValueError as e:
                notes[layer] = str(e)
                rows.append(dict(image=name, layer=layer, kind=call.layout.kind, matrix=matrix, head='', queries='',
                                 mass_3x3='', uniform_3x3=''))
                continue
            for h in range(call.num_heads):
                rows.append(dict(image=name, layer=layer, kind=call.layout.kind, matrix=matrix, head=h, queries=queries,
                                 mass_3x3=f'{float(mass[h]):.6g}', uniform_3x3=f'{float(uniform[h]):.6g}'))
    csv_path, png_path = probe.out_paths(args.out)
    write_csv(csv_path, rows, ['image', 'layer', 'kind', 'matrix', 'head', 'queries', 'mass_3x3', 'uniform_3x3'])
    shown = [layer for layer in order if layer not in notes]
    mean = [_mean(rows, layer, 'mass_3x3') for layer in shown]
    ref = [_mean(rows, layer, 'uniform_3x3') for layer in shown]
    if shown:
        plots.per_layer_bars(shown, mean, png_path, ylabel='attention mass in the 3x3 neighbourhood',
                             reference=ref, reference_label='uniform attention',
                             title=f'{osp.basename(args.config)}: {args.split}, mean over images, heads and queries')
    for layer in order:
        if layer in notes:
            print(f'{layer}: {notes[layer]}')
        else:
            i = shown.index(layer)
            print(f'{layer}: mass {mean[i]:.4f} in the 3x3 neighbourhood (uniform: {ref[i]:.4f})')
    if not shown:
        print(f'no layer with token positions: no picture ({png_path} not written)', file=sys.stderr)
        print(f'wrote {csv_path}')
    else:
        print(f'wrote {csv_path} and {png_path}')
    return 0


def _mean(rows, layer, key):
    vals = [float(r[key]) for r in rows if r['layer'] == layer and r[key] != '']
    return sum(vals) / len(vals)


if __name__ == '__main__':
    sys.exit(run(main))
