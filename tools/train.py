"""Train a detector, segmentor or classifier from a softfree_mm (or any mmdet / mmseg / mmpretrain) config.

    python tools/train.py configs/maskrcnn_xcit_s12_poly3.py [--work-dir DIR] [--amp] [--resume [CKPT]]
        [--auto-scale-lr] [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]

Without CUDA the tool switches to CPU settings by itself (gloo, DDP without device_ids, BN for SyncBN). A missing
data root or image folder, an unknown config file or kernel, a misspelt type anywhere in the config, --cfg-options
that cannot be applied, a --launcher without its environment, or a setting the Runner refuses while it builds the
dataloaders, optimizer, schedulers and evaluators gives one line on stderr and exit status 2.
Demo data roots (``data/demo/...``) are written on demand by tools/make_demo_data.py.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # the repository, for `softfree_mm`


def parse_args(argv=None):
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description='Train a model (mmdet, mmseg or mmpretrain config)')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and models (default: ./work_dirs/<config name>)')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision (needs CUDA)')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from this checkpoint; without a path, from the latest one in the work dir')
    p.add_argument('--auto-scale-lr', action='store_true',
                   help='scale the lr by (GPUs x images per GPU) / auto_scale_lr.base_batch_size')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, e.g. model.backbone.attn_cfg=linear')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def prepare(args):
    """The checked config, ready for the Runner (raises UsageError)."""
    from softfree_mm.engine import launch
    launch.check_launcher(args.launcher, 'train')
    cfg = launch.load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise launch.UsageError(f'--resume: checkpoint not found: {args.resume}')
        cfg.resume, cfg.load_from = True, args.resume
    launch.check_attention(cfg)
    launch.check_model_types(cfg)
    launch.check_types(cfg)
    phases = ('train', 'val') if cfg.get('val_cfg') is not None else ('train', )
    for root, subset in launch.demo_roots(cfg, phases):
        make_demo(root, subset)
    launch.check_data(cfg, phases)
    if args.amp:
        launch.enable_amp(cfg)
    if args.auto_scale_lr:
        launch.enable_auto_scale_lr(cfg)
    for note in launch.apply_device_settings(cfg, args.launcher):
        print(f'[softfree_mm] {note}', file=sys.stderr)
    return cfg


def make_demo(root, subset=None):
    """Write the demo data set ``subset`` (all when None or unknown) under ``root`` once; a file lock keeps parallel
    processes (torchrun) from racing."""
    import fcntl
    sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
    from make_demo_data import TASKS, make_demo_data
    os.makedirs(osp.dirname(osp.abspath(root)), exist_ok=True)
    with open(osp.abspath(root) + '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make_demo_data(root, only=[subset] if subset in TASKS else TASKS)


def main(argv=None):
    args = parse_args(argv)
    from softfree_mm.engine import launch
    try:
        cfg = prepare(args)
        runner = launch.build_runner(cfg)
    except launch.UsageError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    except (KeyError, ValueError, TypeError) as e:
        # building the model / datasets rejected a setting (e.g. a kernel the backbone cannot use)
        if os.environ.get('SOFTFREE_MM_TRACEBACK'):
            raise
        print(f'error: {args.config}: {launch.short_error(e)} (SOFTFREE_MM_TRACEBACK=1 shows the traceback)',
              file=sys.stderr)
        return 2
    try:
        launch.run(runner, 'train', args.config)
    except launch.UsageError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    launch.finish_dist()
    return 0


if __name__ == '__main__':
    sys.exit(main())
