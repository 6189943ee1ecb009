#!/usr/bin/env python
"""The warm-start study (docs/warm_start.md): softmax-free classifiers started from a trained softmax one, by swapping
the kernel or by attention transfer (softfree_mm.models.AttentionTransfer) and a short fine-tune, against the same
kernels trained from scratch, on the kernel study's two backbones and digits task; then the demo's Mask R-CNN from
each start.

    python tools/analysis/warm_start_grid.py [--work-dir work_dirs/warm_start] [--out docs/results/warm_start]
        [--seeds 0 1 2] [--budgets 30 75] [--scratch-from docs/results/study/runs.csv] [--ablation-seeds 0 1 2]
        [--recipes transfer transfer-half transfer-final transfer-attn transfer-newhead] [--det-from CSV]
        [--keep-from docs/results/warm_start]
        [--backbones xcit pvt] [--kernels K ...] [--teachers-only] [--docs docs/warm_start.md] [--jobs 2]
        [--threads 1] [--report-only]
    python tools/analysis/warm_start_grid.py --cost CONFIG [CONFIG ...] [--device cpu|cuda] [--batch 8] [--steps 3]
        [--csv PATH]

The from-scratch top-1 of a kernel is the kernel study's run of the same seed (--scratch-from, its runs.csv; '' trains
them all again); the grid trains from scratch only what it needs the weights of: softmax (the teachers) and the
detectors' kernels on XCiT. --det-from keeps an earlier grid's detectors.csv (its rows, marked as read) instead of
running the detectors again. --keep-from keeps an earlier grid's finished rows (its --out folder: classifiers.csv
and transfer_curves.csv), each identified by backbone, kernel, seed, start, iterations, recipe and groups, and runs
only the rest: a teacher the new runs need is trained again and must reach its kept row's top-1, else the grid stops
(softfree_mm/analysis/warm_start_keep.py); it needs --det-from where XCiT runs. The stage-1 groups are compared on
--ablation-seeds (default: every seed).
--recipes: the warm-start recipes of softfree_mm/engine/warm_start.py to run, the first the default the others are
measured against (paired by kernel and seed; the others on x^3, x, linear, relu and InLine in PVTv2, x^3 and linear
in XCiT); the table then names the default the rule of docs/warm_start.md picks per backbone.
Every run is tools/train.py or tools/test.py on a child config written into its folder under --work-dir; a run
that finished is not run again, so the same command resumes a stopped study. --report-only runs nothing and writes
the outputs from the runs finished so far. Each run's folder holds its run_identity.json (its resolved config and the
records of the runs it starts from: softfree_mm/analysis/grid_identity.py): a folder that holds another run is refused
in one line naming the keys that differ; identities.csv in --out names the rows runs with an identity made (kept rows
keep theirs; the committed rows, made before identities, have none).
Writes into --out: classifiers.csv (one row per classifier run, its
``start``: scratch / swap / transfer, its iterations and the transfer's), detectors.csv, transfer_curves.csv (each
block's stage-1 loss per iteration), summary.csv and table.md, and the plots (accuracy.png, recipes.png with a
second recipe, transfer_curves.png); and the table and plots into --docs between its markers ('' leaves it alone).
--cost times stage 1 of each configs/transfer_*.py against a supervised step of its kernel's classifier (the
matching configs/cls_*.py) in one process, alternating, random weights, and prints (and with --csv writes) the
seconds per step and their ratio: what a stage-1 iteration costs in supervised iterations.
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
    p.add_argument('--scratch-from', default=osp.join('docs', 'results', 'study', 'runs.csv'),
                   help="the kernel study's runs.csv: the from-scratch rows ('' runs them again)")
    p.add_argument('--ablation-seeds', nargs='+', type=int, help='seeds of the stage-1 groups comparison')
    p.add_argument('--recipes', nargs='+', default=['transfer'], help='warm-start recipes, the default first')
    p.add_argument('--det-from', default='', help="an earlier grid's detectors.csv: keep its rows, run no detector")
    p.add_argument('--keep-from', default='',
                   help="an earlier grid's --out folder: keep its finished rows, run the rest")
    p.add_argument('--docs', default=osp.join('docs', 'warm_start.md'),
                   help="the page whose generated section is rewritten ('': none)")
    p.add_argument('--backbones', nargs='+', default=None,
                   help="the grid's backbones (default: xcit pvt; swin: the windowed layout)")
    p.add_argument('--kernels', nargs='+', default=None,
                   help="only these of each backbone's kernels (default: all; softmax, the teacher, always)")
    p.add_argument('--teachers-only', action='store_true',
                   help="train from scratch only what the warm starts start from (the kernels' rows: 'not run')")
    p.add_argument('--jobs', type=int, default=2, help='processes at a time')
    p.add_argument('--threads', type=int, default=1, help='torch threads per process')
    p.add_argument('--report-only', action='store_true', help='run nothing; report the finished runs')
    p.add_argument('--cost', nargs='+', metavar='CONFIG', help='time stage 1 of these transfer configs instead')
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu', help='--cost: where to time')
    p.add_argument('--batch', type=int, default=8, help='--cost: images per step (224 x 224)')
    p.add_argument('--steps', type=int, default=3, help='--cost: timed steps of each (after one warm-up)')
    p.add_argument('--cost-recipes', nargs='+', metavar='RECIPE',
                   help="--cost: time each config's stage 1 under each of these recipes (default: the config's own)")
    p.add_argument('--csv', help='--cost: also write the rows here')
    args = p.parse_args(argv)
    if args.cost:
        return cost(args)
    from softfree_mm.analysis import study_engine as engine
    docs = args.docs and (args.docs if osp.isabs(args.docs) else osp.join(ROOT, args.docs))
    opts = engine.Options(work_dir=args.work_dir, out=args.out, docs=docs or None, seeds=args.seeds,
                          jobs=args.jobs, threads=args.threads, report_only=args.report_only)  # checked here
    if any(b < 3 for b in args.budgets) or sorted(args.budgets) != args.budgets:
        fail(f'--budgets {args.budgets}: increasing iteration counts >= 3')
    ablation = args.ablation_seeds if args.ablation_seeds is not None else args.seeds
    if not set(ablation) <= set(args.seeds):
        fail(f'--ablation-seeds {ablation}: a subset of --seeds {args.seeds}')
    scratch_from = args.scratch_from and (args.scratch_from if osp.isabs(args.scratch_from)
                                          else osp.join(ROOT, args.scratch_from))
    if scratch_from and not osp.isfile(scratch_from):
        fail(f"--scratch-from {args.scratch_from}: no such file (the kernel study's runs.csv, or '')")
    if args.docs and not osp.isfile(args.docs if osp.isabs(args.docs) else osp.join(ROOT, args.docs)):
        fail(f"--docs {args.docs}: no such page (the page for the grid's section, or '' for none)")
    keep_from = args.keep_from and (args.keep_from if osp.isabs(args.keep_from) else osp.join(ROOT, args.keep_from))
    if keep_from and not osp.isdir(keep_from):
        fail(f"--keep-from {args.keep_from}: no such folder (an earlier grid's --out folder, or '')")
    det_from = args.det_from and (args.det_from if osp.isabs(args.det_from) else osp.join(ROOT, args.det_from))
    if det_from and not osp.isfile(det_from):
        fail(f"--det-from {args.det_from}: no such file (an earlier grid's detectors.csv, or '' to run them)")
    from softfree_mm.engine.warm_start import RECIPES
    bad = [r for r in args.recipes if r not in RECIPES]
    if bad or len(set(args.recipes)) != len(args.recipes):
        fail(f'--recipes {args.recipes}: distinct names of {", ".join(RECIPES)}')
    from softfree_mm.analysis import warm_start as ws
    backbones = args.backbones or list(ws.DEFAULT_BACKBONES)
    if not backbones or len(set(backbones)) != len(backbones) or any(b not in ws.BACKBONES for b in backbones):
        fail(f'--backbones {" ".join(backbones)}: distinct names of {", ".join(ws.BACKBONES)}')
    unknown = sorted(set(args.kernels or ()) - {k for b in backbones for k in ws.BACKBONES[b][1]})
    if unknown or args.kernels == []:
        fail(f'--kernels {" ".join(args.kernels)}: kernels of the backbones {" ".join(backbones)}')
    chosen = {b: (ws.BACKBONES[b][0], [k for k in ws.BACKBONES[b][1] if not args.kernels or k in args.kernels])
              for b in backbones}
    from softfree_mm.analysis.studies import WARM_START_GRID
    opts.keep_from = keep_from or None
    opts.extra.update(budgets=args.budgets, recipes=args.recipes, scratch_from=scratch_from or None,
                      ablation_seeds=ablation, det_from=det_from or None, backbones=chosen,
                      teachers_only=args.teachers_only)
    engine.run(WARM_START_GRID, opts, ROOT, echo=lambda m: print(m, flush=True))
    return 0

def cost(args):
    import csv
    if args.batch < 1 or args.steps < 1:
        fail(f'--batch {args.batch} / --steps {args.steps}: each >= 1')
    for path in args.cost:
        if not osp.isfile(path) or not osp.basename(path).startswith('transfer_'):
            fail(f'--cost {path}: not a configs/transfer_*.py file')
    if args.device == 'cuda':
        import torch
        if not torch.cuda.is_available():
            fail('--device cuda: torch sees no CUDA device')
    from softfree_mm.analysis.warm_start_cost import step_cost
    from softfree_mm.engine.warm_start import RECIPES
    bad = [r for r in args.cost_recipes or () if r not in RECIPES]
    if bad:
        fail(f'--cost-recipes {" ".join(bad)}: known recipes are {", ".join(RECIPES)}')
    rows = []
    for path, recipe in [(path, recipe) for path in args.cost for recipe in args.cost_recipes or [None]]:
        row = step_cost(path, args.batch, args.steps, args.device, recipe=recipe)
        rows.append(row)
        print(f"{row['config']} ({row['recipe']}): stage 1 {row['transfer_s']:.3f} s/step, the classifier "
              f"{row['classifier_s']:.3f} s/step ({args.batch} images, {args.device}, {row['threads']} threads): ratio {row['ratio']:.2f}; "
              f"{row['trained_params'] / 1e6:.2f} M of the student's {row['student_params'] / 1e6:.2f} M parameters "
              'train', flush=True)
    if args.csv:
        with open(args.csv, 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
