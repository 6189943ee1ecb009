#!/usr/bin/env python
"""The kernel study: a grid of (backbone config, attention kernel, seed) trained on the digits classification demo,
with AttentionStatsHook on; CSVs of every run and of the per-layer norm curves, a markdown table of mean ± std over
the seeds, and plots (docs/study.md shows the committed one).

    python tools/analysis/study.py [--configs CONFIG ...] [--kernels SPEC ...] [--seeds 0 1 2]
        [--work-dir /work/study_runs/main] [--out docs/results/study] [--key model.backbone.attn_cfg]
        [--jobs 2] [--threads 1] [--in-process] [--report-only] [--cfg-options K=V ...]

Defaults: the committed study (configs/demo/study_xcit_t12_digits.py, configs/demo/study_pvt_v2_b0_digits.py; ten
kernels; seeds 0 1 2). Every run is tools/train.py on a child config that sets the kernel at --key, with
randomness.seed=S and --cfg-options (one recipe for every kernel), in a process of its own (--in-process: in this
one), in <work-dir>/<config>/<kernel>/seed<S>/; --jobs processes at a time (default 2) with --threads torch
threads each (default: the cores / --jobs, so 1 on 2 cores: two one-thread runs use two cores better than one
two-thread run, whose threads wait on each other at every small op). The numbers depend on the thread count. A run that finished (its result.json) is not trained again, so the
same command resumes a study that was stopped; a run that was killed is trained again from its start. A kernel the
backbone refuses, or a run that fails, is a 'failed' row with the error's last line; the others go on.
--report-only trains nothing: the outputs from the runs that have finished so far.
Writes into --out: runs.csv (one row per run: final and best top-1, final training loss, mean logged s/iter after
the first record, peak memory, wall and CPU seconds), norm_curves.csv (every AttentionStatsHook record per run and
layer: ||A||_F, the score-Jacobian norm, both over sqrt(N)), summary.csv and table.md (mean ± sample std over the
seeds, chance and the validation set's standard error stated), accuracy.png and norms_<config>.png.
--keep-from: an earlier study's --out folder (runs.csv, norm_curves.csv) whose finished runs are kept, not trained
again (softfree_mm/analysis/study_keep.py); the outputs hold them all, the selection's new runs added (so
`--kernels agent --configs configs/demo/study_pvt_v2_b0_digits.py --keep-from docs/results/study --out
docs/results/study` adds one kernel's rows to the committed study).
Each run's folder holds its run_identity.json (softfree_mm/analysis/grid_identity.py): a folder that holds another
run (another config, kernel, seed or --cfg-options, or a base config whose content changed) is refused in one line
naming the keys that differ, before anything trains; identities.csv beside the outputs names the rows made by runs
with an identity (the committed rows, made before identities, have none).
Bad input: one line, exit status 2.
"""
import os
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import ROOT, Parser, fail, kernel_specs, run  # noqa: E402

KERNELS = ('softmax', 'poly:degree=3', 'poly:degree=3,scale=1.0', 'poly:degree=1', 'relu', 'linear', 'inline',
           'inline:local_residual=False', 'soft:landmark_ratio=2', 'synthesizer')


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('--configs', nargs='+', default=None, metavar='CONFIG', help='default: the committed study\'s')
    p.add_argument('--kernels', nargs='+', default=list(KERNELS), help='kernel specs: name or name:arg=value,...')
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--key', default='model.backbone.attn_cfg', help='where the kernel config lives')
    p.add_argument('--work-dir', default='work_dirs/study', help='the runs (and their results, for resuming)')
    p.add_argument('--out', help='folder of the CSVs, table and plots (default: <work-dir>/results)')
    p.add_argument('--in-process', action='store_true', help='train in this process instead of one per run')
    p.add_argument('--jobs', type=int, default=2, help='training processes at a time (1 with --in-process)')
    p.add_argument('--threads', type=int, help='torch threads per training process (default: cores / jobs)')
    p.add_argument('--report-only', action='store_true', help='train nothing; report the finished runs')
    p.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE', help='applied to every run')
    p.add_argument('--keep-from', default='', help="an earlier study's --out folder: keep its finished runs")
    args = p.parse_args(argv)
    if args.in_process:
        args.jobs = 1
    from softfree_mm.analysis import study_engine as engine
    threads = args.threads if args.threads is not None else max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    opts = engine.Options(work_dir=args.work_dir, out=args.out or osp.join(args.work_dir, 'results'),
                          seeds=args.seeds, jobs=args.jobs, threads=None if args.in_process else threads, keep_from=args.keep_from or None,
                          report_only=args.report_only)  # seeds, jobs and threads checked here
    from mmengine.config import DictAction
    options = {}
    for item in args.cfg_options:
        key, eq, val = item.partition('=')
        if not eq or not key:
            fail(f'--cfg-options {item!r}: expected KEY=VALUE')
        if key.startswith('randomness.seed'):
            fail('--cfg-options randomness.seed: the study sets the seed of each run (use --seeds)')
        options[key] = DictAction._parse_iterable(val)
    specs = kernel_specs(args.kernels)
    if not args.key or any(not part.isidentifier() for part in args.key.split('.')):
        fail(f'--key must be a dotted path of names such as model.backbone.attn_cfg, got {args.key!r}')
    from softfree_mm.analysis.study_report import CONFIGS
    args.configs = args.configs or [osp.join(ROOT, c) for c in CONFIGS]
    names = [osp.splitext(osp.basename(c))[0] for c in args.configs]
    if len(set(names)) != len(names):
        fail(f'--configs: two configs with the same file name ({names}); the run folders are named by it')
    from softfree_mm.engine import config_checks
    for config in args.configs:  # a bad config or option fails here, before any training
        cfg = config_checks.load_config(config, options)
        node = cfg._cfg_dict
        for part in args.key.split('.'):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            fail(f'--key {args.key}: {config} has no {args.key} (the kernel config to replace)')
        if not any(h.get('type') == 'AttentionStatsHook' for h in cfg.get('custom_hooks', [])):
            fail(f'{config}: no AttentionStatsHook in custom_hooks (the study records the norm curves with it)')

    if args.keep_from and not osp.isdir(args.keep_from):
        fail(f"--keep-from {args.keep_from}: no such folder (an earlier study's --out folder, or '')")
    from softfree_mm.analysis.studies import KERNEL_STUDY
    opts.extra.update(configs=args.configs, specs=specs, key=args.key, cfg_options=args.cfg_options,
                      cfg_options_dict=options, in_process=args.in_process)
    start = time.time()
    tables, lines = engine.run(KERNEL_STUDY, opts, ROOT, echo=lambda m: print(m, flush=True))
    rows = tables['rows']
    print(*lines, sep='\n')
    ok = sum(r['status'] == 'ok' for r in rows)
    print(f'{ok} of {len(rows)} runs trained; this call took {time.time() - start:.0f} s (runs trained in all: '
          f'{sum(r["wall_s"] or 0 for r in rows):.0f} s wall); wrote {opts.out}/')
    return 0 if ok or (args.report_only and rows) else 1


if __name__ == '__main__':
    sys.exit(run(main))
