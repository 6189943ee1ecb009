#!/usr/bin/env python
"""Per attention layer of a trained model at several input sizes: the token count, ||A||_F and the score Jacobian's
norm over sqrt(N), the RMS of the scores, of v and of the kernel's output, and the output's gain over v; the RMS of
the residual stream the layer's block adds its attention branch to, of that branch, and their ratio.

    python tools/analysis/layer_stats.py CONFIG CHECKPOINT [--sizes 64 128 256] [--split val] [--num-images 8]
        [--layer L] [--no-jacobian] [--out work_dirs/analysis/layer_stats] [--cfg-options K=V ...]

The same images (the split's first --num-images, through the config's pipeline and data preprocessor) resized to
each --sizes side (0: as the pipeline gives them), so that one checkpoint is measured at the token counts of two
tasks: a classifier at its own size and at its segmentor's. Writes PREFIX.csv (size, image, layer, rows, keys,
fro_sqrt_n, jac_sqrt_n, score_rms, v_rms, out_rms, gain, stream_rms, branch_rms, branch_ratio, note) and
PREFIX_summary.csv (the mean over images per size and layer), and prints the summary. CHECKPOINT 'none' measures the
initialised model. Bad input: one line, exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import probe_args, run  # noqa: E402


def _extra(p):
    p.add_argument('--sizes', nargs='+', type=int, default=[0], help='square input sides in pixels (0: as fed)')
    p.add_argument('--no-jacobian', action='store_true', help='skip the score Jacobian (faster)')


def _check(args):
    bad = [s for s in args.sizes if s < 0 or (s and s % 32)]
    if bad or len(set(args.sizes)) != len(args.sizes):
        return f'--sizes {" ".join(map(str, args.sizes))}: distinct sides, multiples of 32 (0: as fed)'
    return None


def main(argv=None):
    args = probe_args(argv, __doc__, 'layer_stats', extra=_extra, check=_check)
    from softfree_mm.analysis import probe
    from softfree_mm.analysis.layer_stats import FIELDS, layer_stats, summarise
    from softfree_mm.analysis.tables import write_csv

    probe.check_checkpoint(args.checkpoint)
    cfg = probe.load_checked(args.config, args.cfg_options)
    ds = probe.build_dataset(cfg, args.split, args.config)
    model = probe.build_model(cfg, args.checkpoint, args.config)
    layers = probe.pick_layers(model, args.layer)
    rows = layer_stats(model, probe.dataset_samples(ds, args.num_images), args.sizes, layers,
                       jacobian=not args.no_jacobian)
    (csv_path,) = probe.out_paths(args.out, ('csv', ))
    summary_path = args.out + '_summary.csv'
    write_csv(csv_path, rows, FIELDS)
    summary = summarise(rows)
    cols = ['size', 'layer', 'images'] + list(FIELDS[3:-1])
    write_csv(summary_path, summary, cols)
    for r in summary:
        print(' '.join(f'{c}={r[c]:.4g}' if isinstance(r[c], float) else f'{c}={r[c]}' for c in cols))
    print(f'wrote {csv_path} and {summary_path}')
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
