#!/usr/bin/env python
"""Heat maps of one query's attention over the image, for every attention layer (or one), any backbone and kernel.

    python tools/vis_attention.py CONFIG CHECKPOINT IMAGE [--layer L] [--head H|mean] [--query X Y]
        [--channel C] [--out work_dirs/analysis/vis_attention] [--cfg-options K=V ...]

The image goes through the config's test pipeline and the backbone; forward hooks on the kernels record each
layer's inputs, and the query's row of A is drawn where its keys really lie: Swin's (shifted, padded) window,
CSwin's stripe, PVT's spatially reduced keys spread over the cells they pool, the whole grid for global layers.
Tokens the query cannot see stay uncoloured. XCiT attends over channels: for query channel C (--channel) the map
is sum_c' A[C, c'] v[c', :] over the image tokens. --query X Y: pixel of the network input (after the test
pipeline's resize / crop; default its centre). --layer: a layer name or index (default: all layers, one panel
each). --head: a head index or 'mean' (default 0). CHECKPOINT 'none' draws the initialised model. Writes
PREFIX.png and PREFIX.csv (layer, kind, head, y, x, weight of every visible token). Bad input: one line, exit 2.
"""
import csv
import math
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'analysis'))
from _cli import Parser, fail, run  # noqa: E402


def parse_args(argv=None):
    from mmengine.config import DictAction
    p = Parser(__doc__)
    p.add_argument('config')
    p.add_argument('checkpoint', help="a .pth file, or 'none' for the initialised model")
    p.add_argument('image')
    p.add_argument('--layer', help='layer name or index (default: every layer)')
    p.add_argument('--head', default='0', help="head index or 'mean'")
    p.add_argument('--query', nargs=2, type=float, metavar=('X', 'Y'), help='query pixel (default: the centre)')
    p.add_argument('--channel', type=int, default=0, help='query channel of channel-attention layers (XCiT)')
    p.add_argument('--out', default='work_dirs/analysis/vis_attention', help='output prefix (.png, .csv)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    if args.head != 'mean' and not args.head.isdigit():
        p.error(f"--head must be a head index or 'mean', got {args.head!r}")
    args.head = args.head if args.head == 'mean' else int(args.head)
    return args


def main(argv=None):
    args = parse_args(argv)
    from softfree_mm.analysis import probe
    from softfree_mm.analysis.attention_maps import query_map

    probe.check_checkpoint(args.checkpoint)
    cfg = probe.load_checked(args.config, args.cfg_options)
    sample = probe.load_image(cfg, args.image)
    ih, iw = sample['inputs'].shape[-2:]
    xy = tuple(args.query) if args.query else (iw / 2, ih / 2)
    if not (0 <= xy[0] < iw and 0 <= xy[1] < ih):
        fail(f'--query {xy[0]:g} {xy[1]:g} lies outside the {iw}x{ih} network input (after the test pipeline)')
    model = probe.build_model(cfg, args.checkpoint, args.config)
    layers = probe.pick_layers(model, args.layer)
    img, cap = probe.run_backbone(model, sample, layers)
    panels = []
    for name, call in cap.calls.items():
        if args.head != 'mean' and args.head >= call.num_heads:
            if args.layer is not None:
                fail(f'--head {args.head}: layer {name} has {call.num_heads} heads (0..{call.num_heads - 1})')
            panels.append((name, call, None, f'{call.num_heads} heads: no head {args.head}'))
            continue
        try:
            panels.append((name, call, query_map(call, xy, args.head, args.channel), ''))
        except ValueError as e:
            if args.layer is not None:
                fail(str(e))
            panels.append((name, call, None, str(e)))
    csv_path, png_path = probe.out_paths(args.out)
    with open(csv_path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['layer', 'kind', 'head', 'y', 'x', 'weight'])
        for name, call, res, _ in panels:
            if res is None:
                continue
            vals = res['values'].detach().cpu()
            for y in range(vals.shape[0]):
                for x in range(vals.shape[1]):
                    v = float(vals[y, x])
                    if not math.isnan(v):
                        w.writerow([name, res['kind'], args.head, y, x, f'{v:.8g}'])
    draw(panels, img, xy, args, png_path)
    print(f'wrote {png_path} and {csv_path}')
    return 0


def draw(panels, img, xy, args, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    from softfree_mm.analysis.plots import _short, save
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.9 * rows), squeeze=False)
    ih, iw = img.shape[:2]
    for ax in axes.flat:
        ax.axis('off')
    for ax, (name, call, res, why) in zip(axes.flat, panels):
        ax.imshow(img)
        if res is None:
            ax.set_title(_short(name), fontsize=8)
            ax.text(0.5, 0.5, _wrap(why, 40), transform=ax.transAxes, ha='center', va='center', fontsize=7,
                    color='white', bbox=dict(facecolor='black', alpha=0.6))
            continue
        vals = res['values'].detach().cpu().numpy().astype(float)
        h, w = vals.shape
        sy, sx = res['stride']
        finite = vals[np.isfinite(vals)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if lo < 0 < hi:
            norm, cmap = TwoSlopeNorm(0.0, lo, hi), 'RdBu_r'  # signed weights (InLine, linear maps of v)
        else:
            norm, cmap = None, 'inferno'
        im = ax.imshow(np.ma.masked_invalid(vals), extent=(0, w * sx, h * sy, 0), alpha=0.65, cmap=cmap, norm=norm,
                       interpolation='nearest')
        ax.set_xlim(0, iw)
        ax.set_ylim(ih, 0)
        if res['token'] is not None:
            ty, tx = res['token']
            ax.add_patch(Rectangle((tx * sx, ty * sy), sx, sy, fill=False, edgecolor='cyan', linewidth=1.2))
            ax.plot([xy[0]], [xy[1]], marker='+', color='cyan', markersize=8)
            what = f'head {args.head}'
        else:
            what = f'channel {args.channel}, head {args.head}'
        ax.set_title(f'{_short(name)} [{res["kind"]}] {what}\n{_wrap(res["note"], 48)}', fontsize=6.5)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
    save(fig, path)


def _wrap(text, width):
    import textwrap
    return '\n'.join(textwrap.wrap(text, width)[:3])


if __name__ == '__main__':
    sys.exit(run(main))
