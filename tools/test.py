"""Evaluate a checkpoint: COCO AP (detection), mIoU (segmentation) or top-1 (classification).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out RESULTS.pkl] [--show-dir DIR]
        [--format-only] [--device auto|cuda|cpu] [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]

CHECKPOINT ``init`` evaluates the model as its config initialises it: a config whose backbone starts from a release
(``Pretrained``) and whose head reads the release's classifier (``ReleaseHead``), such as configs/cls_*_agent.py, is
that release as shipped. The metrics are logged, printed on the last line of stdout as ``metrics: {json}`` and written to
``<work-dir>/test_metrics.json``. ``--format-only`` writes the results in the benchmark's submission format
(COCO json / ADE20K png) under ``<work-dir>/format_only`` instead of evaluating (for test sets without labels).
A corrupt checkpoint or one of another model, an unreadable image or annotation file, an unusable CUDA where CUDA
is expected (see tools/train.py, --device) are one line on stderr and exit status 2.
"""
import argparse
import json
import os
import os.path as osp
import sys

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # the repository, for `softfree_mm`


def parse_args(argv=None):
    from softfree_mm.engine.cfg_options import CfgOptions
    p = argparse.ArgumentParser(description='Test (evaluate) a model (mmdet, mmseg or mmpretrain config)')
    p.add_argument('config', help='test config file path')
    p.add_argument('checkpoint', help="checkpoint file, or 'init': the model as its config's init_cfg makes it (a "
                                      'release through Pretrained and ReleaseHead)')
    p.add_argument('--work-dir', help='the dir for logs and metrics (default: ./work_dirs/<config name>)')
    p.add_argument('--out', help='dump the raw predictions to this pickle file')
    p.add_argument('--show-dir', help='draw predictions into images saved under this folder')
    p.add_argument('--format-only', action='store_true',
                   help='only write results in the submission format (detection, segmentation), no evaluation')
    p.add_argument('--device', choices=['auto', 'cuda', 'cpu'], default=None,
                   help='auto (default, or $SOFTFREE_MM_DEVICE): CUDA when it works; cpu: on purpose')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptions, help='override config settings')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


INIT = 'init'  # the CHECKPOINT that evaluates the model as its config's init_cfg makes it
VISUALIZATION_HOOKS = {'mmdet': 'DetVisualizationHook', 'mmseg': 'SegVisualizationHook',
                       'mmpretrain': 'VisualizationHook'}


def _set_visualization(cfg, show_dir):
    """Draw every test image (interval 1) under show_dir; the scope's hook is created when the config has none."""
    scope = cfg.default_scope
    if not cfg.get('default_hooks'):
        cfg.default_hooks = {}
    if not cfg.default_hooks.get('visualization'):
        cfg.default_hooks.visualization = dict(type=VISUALIZATION_HOOKS[scope])
    vis = cfg.default_hooks.visualization
    vis.update(interval=1)
    if scope == 'mmdet':
        vis.update(draw=True, test_out_dir=osp.abspath(show_dir))
    elif scope == 'mmseg':
        vis.update(draw=True)
        cfg.visualizer['save_dir'] = show_dir
    else:  # mmpretrain
        vis.update(enable=True, out_dir=osp.abspath(show_dir))


def _set_format_only(cfg, out_dir):
    from softfree_mm.engine.errors import UsageError
    evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [cfg.test_evaluator]
    for ev in evaluators:
        kind = ev.get('type', '')
        if kind == 'CocoMetric':
            ev.update(format_only=True, outfile_prefix=osp.join(out_dir, 'results'))
        elif kind == 'IoUMetric':
            ev.update(format_only=True, output_dir=out_dir)
        else:
            raise UsageError(f'--format-only: the {kind!r} evaluator has no submission format; use --out instead')


def prepare(args):
    from softfree_mm.engine import config_checks as checks
    from softfree_mm.engine import device, runner
    from softfree_mm.engine.demo_data import make_demo
    from softfree_mm.engine.errors import UsageError
    cfg, on = runner.tool_config('test', args)
    if args.checkpoint == INIT:
        cfg.load_from = None
    elif not osp.isfile(args.checkpoint):
        raise UsageError(f"checkpoint not found: {args.checkpoint} (or 'init': the model as its config initialises "
                         'it)')
    else:
        cfg.load_from = args.checkpoint
    cfg.resume = False
    checks.check_attention(cfg)
    checks.check_model_types(cfg)
    checks.check_types(cfg)
    if args.format_only:
        _set_format_only(cfg, osp.join(cfg.work_dir, 'format_only'))
    for root, subset in checks.demo_roots(cfg, ('test', )):
        make_demo(root, subset)
    checks.check_data(cfg, ('test', ))
    if args.show_dir:
        _set_visualization(cfg, args.show_dir)
    if args.out is not None:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise UsageError(f'--out must be a .pkl or .pickle file, got {args.out}')
        dump = dict(type='DumpDetResults' if cfg.default_scope == 'mmdet' else 'DumpResults', out_file_path=args.out)
        ev = cfg.test_evaluator
        cfg.test_evaluator = [*ev, dump] if isinstance(ev, list) else [ev, dump]
    if on == 'cuda':
        device.check_cuda_ops(cfg)
    for note in device.apply_device_settings(cfg, args.launcher) + device.apply_cluster_settings(cfg, args.launcher):
        print(f'[softfree_mm] {note}', file=sys.stderr)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    if (args.device or os.environ.get('SOFTFREE_MM_DEVICE')) == 'cpu':
        os.environ['CUDA_VISIBLE_DEVICES'] = ''  # before anything initialises CUDA
    from softfree_mm.engine.checkpoints import check_checkpoint
    from softfree_mm.engine.data_errors import name_failing_samples
    from softfree_mm.engine.runner import build_runner, finish_dist, one_line_errors, run
    name_failing_samples()
    with one_line_errors(args.config, setup=True) as setup:
        cfg = prepare(args)
        runner = build_runner(cfg)
        from mmengine.model import is_model_wrapper
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if args.checkpoint == INIT:
            model.init_weights()  # (mmengine initialises weights in train() only)
        else:
            check_checkpoint(args.checkpoint, model, 'test')
    if setup.status:
        return setup.status
    with one_line_errors(args.config) as testing:
        metrics = run(runner, 'test', args.config)
    if testing.status:
        return testing.status
    metrics = {k: (float(v) if hasattr(v, '__float__') else v) for k, v in (metrics or {}).items()}
    from mmengine.dist import is_main_process
    if is_main_process():
        with open(osp.join(cfg.work_dir, 'test_metrics.json'), 'w') as f:
            json.dump(metrics, f, indent=1)
        print('metrics: ' + json.dumps(metrics))
    finish_dist()
    return 0


if __name__ == '__main__':
    sys.exit(main())
