#!/usr/bin/env python
"""The detection and segmentation study (docs/study.md, "Detection and segmentation"): is softmax needed in the main
job? Per backbone layout, kernel, start and seed: the classifier, then the demo Mask R-CNN (COCO bbox / segm mAP)
and the demo Semantic FPN (mIoU) from it; paired differences to softmax per seed.

    python tools/analysis/task_study.py [--work-dir work_dirs/task_study] [--out docs/results/task_study]
        [--docs docs/study.md] [--layouts pvt xcit] [--tasks det seg] [--kernels K ...] [--seeds 0 1 2]
        [--starts scratch swap transfer task] [--det-from docs/results/warm_start/detectors.csv] [--jobs 2]
        [--threads 1] [--keep-from docs/results/task_study/runs.csv] [--report-only]

Layouts: pvt (configs/demo/study_pvt_v2_b0_digits.py, PVTv2-b0 without spatial reduction: token attention; its
detector configs/demo/maskrcnn_pvt_v2_b0_digits.py, segmentor configs/demo/semfpn_pvt_v2_b0_digits.py) and xcit
(configs/demo/study_xcit_t12_digits.py, XCiT-T12: channel attention; make demo's detector and segmentor). Starts:
every kernel's own classifier from scratch (the kernel study's recipe: 300 iterations), and for x^3 and linear the
warm start's default recipe in the layout (pvt: transfer-final, xcit: transfer; attention transfer from the softmax
classifier of the same seed, then the fine-tune: 75 iterations in all, 25 %); on xcit also the swap (the softmax classifier, the kernel swapped in, fine-tuned 75); on pvt also
InLine and agent from the warm start, and the task route (start task, for x^3, linear, InLine and agent: the softmax
detector / segmentor of the same seed made softmax-free by tools/warm_start.py --from-task's two stages, seeing the
images the warm start and the detector's / segmentor's schedule see; softfree_mm/analysis/task_study_route.py). A
``recipe`` column names each row's. Every detector and segmentor sees the demo scenes at their own size (1x),
as make demo's do. XCiT's detector rows are read from --det-from (the warm-start grid's; '' runs them again).
Every run is tools/train.py / tools/test.py on a child config under --work-dir; a run that finished is never run
again: the same command resumes a stopped study, --report-only runs nothing and writes the outputs from the runs
finished so far. The finished rows of --keep-from (by default --out's runs.csv, the committed outputs) are kept as
they are and not run again, also when the work dir is gone (another machine); their classifiers are not retrained
unless another run needs them ('' keeps none); rows outside the selection stay in the outputs. A kernel a layout
does not take is a row with the fit error's line; a run folder that holds another run (its run_identity.json:
softfree_mm/analysis/grid_identity.py) is refused in one line naming the keys that differ; the kept rows keep
--keep-from's order, and identities.csv in --out names the rows runs with an identity made;
a run that fails is a row with its error; the grid goes on. Writes into --out: runs.csv (one row per layout, task, kernel, start, seed),
summary.csv, table.md, task_study.png, curves.csv (every logged training loss of each run, under the row's identity:
read from the run's log where its run is in --work-dir and its test there gives the row's numbers, else kept from the
--keep-from folder's curves.csv), seg_curves.png and a table of the segmentors' losses, and the section of --docs
between its markers ('' leaves the page alone).
Bad input: one line, exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import ROOT, Parser, fail, run  # noqa: E402


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('--work-dir', default='work_dirs/task_study', help='the runs (and their results, for resuming)')
    p.add_argument('--out', default='docs/results/task_study', help='folder of the CSVs, table and plot')
    p.add_argument('--docs', default='docs/study.md', help="the page whose section is rewritten ('': none)")
    p.add_argument('--layouts', nargs='+', default=None, help='backbone layouts (default: all)')
    p.add_argument('--tasks', nargs='+', default=None, help='det, seg (default: both)')
    p.add_argument('--kernels', nargs='+', default=None, help="kernels, the study's spelling (default: the "
                                                               "layout's; softmax always runs)")
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--starts', nargs='+', default=None, help='the starts to run (default: each layout\'s)')
    p.add_argument('--det-from', default=osp.join('docs', 'results', 'warm_start', 'detectors.csv'),
                   help="the warm-start grid's detectors.csv: XCiT's detector rows ('' runs them)")
    p.add_argument('--jobs', type=int, default=2, help='processes at a time')
    p.add_argument('--threads', type=int, default=1, help='torch threads per process')
    p.add_argument('--keep-from', default=None, help="a runs.csv whose finished rows are kept, not run again "
                                                     "(default: --out's, when it exists; '': none)")
    p.add_argument('--report-only', action='store_true', help='run nothing; report the finished runs')
    args = p.parse_args(argv)
    from softfree_mm.analysis import study_engine as engine
    docs = args.docs and (args.docs if osp.isabs(args.docs) else osp.join(ROOT, args.docs))
    opts = engine.Options(work_dir=args.work_dir, out=args.out, docs=docs or None, seeds=args.seeds,
                          kernels=args.kernels, jobs=args.jobs, threads=args.threads,
                          report_only=args.report_only)  # checked here, the kernels parsed once
    det_from = args.det_from and (args.det_from if osp.isabs(args.det_from) else osp.join(ROOT, args.det_from))
    if det_from and not osp.isfile(det_from):
        fail(f"--det-from {args.det_from}: no such file (the warm-start grid's detectors.csv, or '')")
    keep_from = osp.join(args.out, 'runs.csv') if args.keep_from is None else args.keep_from
    if keep_from and not osp.isfile(keep_from):
        if args.keep_from:
            fail(f"--keep-from {args.keep_from}: no such file (a runs.csv of this study, or '')")
        keep_from = ''
    from softfree_mm.analysis import task_study as ts
    from softfree_mm.analysis.studies import TASK_STUDY
    layouts = args.layouts or list(ts.LAYOUTS)
    ts.check_names(layouts, args.kernels, args.tasks or ts.TASKS, args.starts)  # a UsageError: one line
    opts.keep_from = keep_from or None
    opts.extra.update(layouts=layouts, tasks=args.tasks or ts.TASKS, starts=args.starts, det_from=det_from or None)
    _, lines = engine.run(TASK_STUDY, opts, ROOT, echo=lambda m: print(m, flush=True))
    for line in lines:
        print(line, flush=True)
    return 0

if __name__ == '__main__':
    sys.exit(run(main))
