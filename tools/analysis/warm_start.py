#!/usr/bin/env python
"""The warm-start study (docs/warm_start.md): softmax-free classifiers started from a trained softmax one, by swapping
the kernel or by attention transfer (softfree_mm.models.AttentionTransfer) and a short fine-tune, against the same
kernels trained from scratch, on the kernel study's two backbones and digits task; then the demo's Mask R-CNN from
each start.

    python tools/analysis/warm_start.py [--work-dir work_dirs/warm_start] [--out docs/results/warm_start]
        [--seeds 0 1 2] [--budgets 30 75] [--jobs 2] [--threads 1] [--report-only]

Every run is tools/train.py or tools/test.py on a child config written into its folder under --work-dir; a run
that finished is not run again, so the same command resumes a stopped study. --report-only runs nothing and writes
the outputs from the runs finished so far. Writes into --out: classifiers.csv (one row per classifier run, its
``start``: scratch / swap / transfer, its iterations and the transfer's), detectors.csv, transfer_curves.csv (each
block's stage-1 loss per iteration), summary.csv and table.md, and the plots.
Bad input: one line, exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import ROOT, Parser, fail, run  # noqa: E402


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('--work-dir', default='work_dirs/warm_start', help='the runs (and their results, for resuming)')
    p.add_argument('--out', default='docs/results/warm_start', help='folder of the CSVs, table and plots')
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--budgets', nargs='+', type=int, default=[30, 75],
                   help='iterations of a warm start (transfer included), against 300 from scratch')
    p.add_argument('--jobs', type=int, default=2, help='processes at a time')
    p.add_argument('--threads', type=int, default=1, help='torch threads per process')
    p.add_argument('--report-only', action='store_true', help='run nothing; report the finished runs')
    args = p.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or any(s < 0 for s in args.seeds):
        fail(f'--seeds {args.seeds}: distinct ints >= 0')
    if any(b < 3 for b in args.budgets) or sorted(args.budgets) != args.budgets:
        fail(f'--budgets {args.budgets}: increasing iteration counts >= 3')
    if args.jobs < 1 or args.threads < 1:
        fail(f'--jobs {args.jobs} / --threads {args.threads}: each >= 1')
    from softfree_mm.analysis import warm_start as ws
    runner = ws.Runner(osp.abspath(args.work_dir), osp.join(ROOT, 'tools'), args.jobs, args.threads,
                       echo=lambda m: print(m, flush=True))
    if args.report_only:
        runner.train = runner.test = lambda key, *a, **k: runner.done(key) or dict(status='not run', key=key)
    plan = ws.Plan(runner, ROOT, args.seeds, args.budgets, echo=lambda m: print(m, flush=True))
    result = ws.run_grid(plan)
    ws.write_outputs(result, osp.abspath(args.out), plan)
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
