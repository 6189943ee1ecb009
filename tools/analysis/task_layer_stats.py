#!/usr/bin/env python
"""Per attention layer, at several input sizes, the classifiers and segmentors of the detection and segmentation
study, read from its work dir: the token count, ||A||_F over sqrt(N), the RMS of the scores, of v and of the
kernel's output, and the output's gain over v (tools/analysis/layer_stats.py's measures), for the model each
segmentor started from and for the segmentor, and for a row from scratch the classifier at its random
initialisation (init: its config's init_weights, torch seeded by the row's seed), each on the first --num-images of
its own val split resized to each --sizes side, under the study row's identity and result (mIoU, at the
all-background floor or not).

    python tools/analysis/task_layer_stats.py [--work-dir work_dirs/task_study] [--runs docs/results/task_study/runs.csv]
        [--layout pvt] [--kernels softmax poly:degree=3] [--seeds 3 4] [--starts scratch transfer]
        [--models init classifier segmentor] [--sizes 64 128] [--num-images 4]
        [--out docs/results/task_study/layer_stats.csv] [--docs docs/study.md]

A row of --runs is measured where its runs are in --work-dir (the work dir's test gives the row's numbers and its
classifier run is there); a (run, model) already in --out is kept, not measured again (the CSV is written after
each model, so a stopped measurement resumes); the others are skipped with a line. --docs: the generated section of
that page is rewritten from --out ('' leaves it alone). Bad input: one line, exit status 2.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _cli import ROOT, Parser, fail, run  # noqa: E402


def main(argv=None):
    p = Parser(__doc__)
    p.add_argument('--work-dir', default='work_dirs/task_study', help="the task study's runs")
    p.add_argument('--runs', default='docs/results/task_study/runs.csv', help="the task study's runs.csv")
    p.add_argument('--layout', default='pvt', help='the backbone layout')
    p.add_argument('--kernels', nargs='+', default=None, help="kernels, the study's spelling (default: all)")
    p.add_argument('--seeds', nargs='+', type=int, default=None, help='seeds (default: all)')
    p.add_argument('--starts', nargs='+', default=None, help='starts (default: all)')
    p.add_argument('--models', nargs='+', default=['init', 'classifier', 'segmentor'],
                   help='init (from scratch rows only), classifier, segmentor')
    p.add_argument('--sizes', nargs='+', type=int, default=[64, 128], help='square input sides in pixels')
    p.add_argument('--num-images', type=int, default=4)
    p.add_argument('--out', default='docs/results/task_study/layer_stats.csv')
    p.add_argument('--docs', default='docs/study.md', help="the page whose generated section is rewritten ('': none)")
    args = p.parse_args(argv)
    from softfree_mm.analysis import task_layer_stats as tl
    from softfree_mm.analysis import task_study as ts
    from softfree_mm.analysis import task_study_report as tsr
    from softfree_mm.analysis.warm_start import Runner
    from softfree_mm.engine.errors import UsageError
    if bad := [m for m in args.models if m not in tl.MODELS]:
        fail(f'--models {" ".join(bad)}: unknown (known: {", ".join(tl.MODELS)})')
    if any(s <= 0 or s % 32 for s in args.sizes) or len(set(args.sizes)) != len(args.sizes):
        fail(f'--sizes {" ".join(map(str, args.sizes))}: distinct sides, multiples of 32')
    if args.num_images < 1:
        fail(f'--num-images {args.num_images}: >= 1')
    if not osp.isfile(args.runs):
        fail(f"--runs {args.runs}: no such file (the task study's runs.csv)")
    try:
        ts.check_names([args.layout], args.kernels, ['seg'], args.starts)
    except UsageError as e:
        fail(str(e))
    try:
        every = ts.read_rows(args.runs)
    except (KeyError, ValueError, UsageError) as e:
        fail(f"--runs {args.runs}: not a runs.csv of the task study ({type(e).__name__}: {e})")
    rows = [r for r in every if r['layout'] == args.layout and r['task'] == 'seg'
            and (args.kernels is None or r['kernel'] in args.kernels)
            and (args.seeds is None or r['seed'] in args.seeds) and (args.starts is None or r['start'] in args.starts)]
    runner = Runner(osp.abspath(args.work_dir), osp.join(ROOT, 'tools'), echo=lambda m: None, report_only=True)
    study = ts.Study(runner, ROOT, sorted({r['seed'] for r in rows}) or [0], [args.layout], ['seg'],
                     args.kernels, echo=lambda m: None)
    from softfree_mm.analysis.doc_figures import read_csv
    from softfree_mm.analysis.tables import write_csv
    done = read_csv(args.out) if osp.isfile(args.out) else []
    have = {tuple(str(r[k]) for k in (*tl.IDENTITY, 'model')) for r in done}
    entries = tl.models_of(study, rows, tsr.FLOOR_MACC, args.models)
    found = {tuple(str(e[k]) for k in tl.IDENTITY) for e in entries}
    for r in rows:
        if r['status'] == 'ok' and tuple(str(r[k]) for k in tl.IDENTITY) not in found:
            print(f"[task-layer-stats] {r['kernel']} {r['start']} seed {r['seed']}: its runs are not in "
                  f'{args.work_dir}: skipped', flush=True)
    for e in entries:
        if tuple(str(e[k]) for k in (*tl.IDENTITY, 'model')) in have:
            continue
        try:
            got = tl.measure(e, args.sizes, args.num_images)
        except UsageError as err:
            fail(str(err))
        done += got
        write_csv(args.out, done, tl.FIELDS)
        print(f"[task-layer-stats] {e['kernel']} {e['start']} seed {e['seed']} {e['model']}: {len(got)} rows",
              flush=True)
    print(tl.markdown(tl.largest_gain(done)) if done else 'nothing measured', flush=True)
    if args.docs:
        from softfree_mm.analysis import doc_figures as df
        from softfree_mm.analysis.docs_section import write_section
        s = next(s for s in df._sections() if s.make is df.task_layer_stats)
        out_rel = osp.relpath(osp.abspath(args.out), osp.join(ROOT, 'docs', 'results', 'task_study'))
        if out_rel == 'layer_stats.csv':
            write_section(args.docs, s.make(ROOT), s.begin, s.end, s.heading)
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
