#!/usr/bin/env python
"""||A||_F and the Frobenius norm of the Jacobian of A with respect to its scores, against the token count N, at
initialisation, for every kernel (the polynomial-attention paper's figure: softmax stays bounded, x^3 / sqrt(N) grows like sqrt(N)).

    python tools/analysis/attention_norms.py [--kernels softmax poly poly:degree=1 ...] [--sides 4 8 16 32]
        [--heads 4] [--head-dim 32] [--batch 2] [--std 1.0] [--seed 0] [--out work_dirs/analysis/attention_norms]

q and k are drawn N(0, std^2) on a side x side token grid (N = side^2), one draw per N shared by all kernels; each
kernel is built fresh with its default initialisation. Theory drawn in (dashed): softmax's bounds sqrt(N) and
2 sqrt(N), and poly's expectation sqrt(N E[S^2p]) (grows like sqrt(N)). Writes PREFIX.csv and PREFIX.png.
Bad input: one line on stderr, exit status 2.
"""
import csv
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import Parser, fail, kernel_specs  # noqa: E402


def parse_args(argv=None):
    p = Parser(__doc__)
    p.add_argument('--kernels', nargs='+', default=None,
                   help="kernel specs (name or name:arg=value,...); default: every registered kernel")
    p.add_argument('--sides', nargs='+', type=int, default=[4, 8, 16, 32], help='grid sides (N = side^2)')
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--head-dim', type=int, default=32)
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--std', type=float, default=1.0, help='standard deviation of q and k')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default='work_dirs/analysis/attention_norms', help='output prefix (.csv, .png)')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from softfree_mm.analysis import plots
    from softfree_mm.analysis.norms import norms_vs_n, poly_theory
    from softfree_mm.attention import kernel_label
    from softfree_mm.analysis.probe import out_paths
    from softfree_mm.attention import list_attentions

    specs = kernel_specs(args.kernels or list_attentions())
    for name, val in (('--sides', min(args.sides)), ('--heads', args.heads), ('--head-dim', args.head_dim),
                      ('--batch', args.batch)):
        if val < 1:
            fail(f'{name} must be >= 1, got {val}')
    if not args.std > 0:
        fail(f'--std must be > 0, got {args.std}')
    rows = norms_vs_n(specs, args.sides, heads=args.heads, head_dim=args.head_dim, batch=args.batch, std=args.std,
                      seed=args.seed)
    csv_path, png_path = out_paths(args.out)
    with open(csv_path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['kernel', 'n', 'fro', 'jac', 'sqrt_n', 'note'])
        for r in rows:
            w.writerow([r['kernel'], r['n'], _num(r['fro']), _num(r['jac']), f"{r['n'] ** 0.5:.6g}", r['note']])
    ns = sorted({r['n'] for r in rows})
    theory = {'softmax bound': dict(n=ns, fro=[n ** 0.5 for n in ns], jac=[2 * n ** 0.5 for n in ns],
                                    label_fro='softmax bound sqrt(N)', label_jac='softmax bound 2 sqrt(N)')}
    if args.std == 1.0:
        for spec in specs:
            if spec['type'] == 'poly' and spec.get('scale', 'sqrt_n') == 'sqrt_n':
                p = spec.get('degree', 3)
                th = [poly_theory(n, p, args.head_dim) for n in ns]
                theory[f'{kernel_label(spec)} theory'] = dict(
                    n=ns, fro=[t['fro'] for t in th], jac=[t['jac'] for t in th],
                    label_fro=f'{kernel_label(spec)}: sqrt(N E[S^{2 * p}])',
                    label_jac=f'{kernel_label(spec)}: sqrt(N p^2 E[S^{2 * p - 2}])')
    plots.norms_vs_n(rows, theory, png_path, title=f'at initialisation: q, k ~ N(0, {args.std:g}^2), '
                                                   f'{args.heads} heads x head_dim {args.head_dim}, batch {args.batch}')
    for r in rows:
        if r['note'] and r['fro'] is None:
            print(f"{r['kernel']} N={r['n']}: {r['note']}", file=sys.stderr)
    print(f'wrote {csv_path} and {png_path}')
    return 0


def _num(v):
    return '' if v is None else f'{v:.6g}'


if __name__ == '__main__':
    sys.exit(main())
