"""tools/train.py's command line and run, importable: the tool is this module's :func:`main` (its usage, bad input and
``--resume`` / ``--dry-run`` are the tool's docstring), and the warm-start chain's submitted jobs
(softfree_mm/engine/chain_job.py) run it in their tasks' own processes.
"""
import argparse
import os
import os.path as osp
import sys


def parse_args(argv=None):
    from softfree_mm.engine.cfg_options import CfgOptions
    p = argparse.ArgumentParser(description='Train a model (mmdet, mmseg or mmpretrain config)')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and models (default: ./work_dirs/<config name>)')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision (needs CUDA)')
    p.add_argument('--amp-dtype', choices=['auto', 'float16', 'bfloat16'], default='auto',
                   help='autocast dtype of --amp: auto = bfloat16 where the GPU has it, else float16 (loss scaling)')
    p.add_argument('--device', choices=['auto', 'cuda', 'cpu'], default=None,
                   help='auto (default, or $SOFTFREE_MM_DEVICE): CUDA when it works; cpu: on purpose, also where '
                   'GPUs are allocated or under a launcher')
    p.add_argument('--skip-nonfinite-loss', action='store_true',
                   help='skip the update of an iteration whose loss is NaN / inf (default: stop with exit status 2)')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from this checkpoint; without a path, from the latest one in the work dir')
    p.add_argument('--auto-scale-lr', action='store_true',
                   help='scale the lr by (GPUs x images per GPU) / auto_scale_lr.base_batch_size')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptions,
                   help='override config settings, e.g. model.backbone.attn_cfg=linear')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    p.add_argument('--dry-run', action='store_true',
                   help='check the config without data: build the model, run the backbone once, build the '
                        'pipelines, evaluators, optimizer and visualiser backends; train nothing')
    args = p.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def prepare(args):
    """The checked config, ready for the Runner (raises UsageError)."""
    from softfree_mm.engine import config_checks as checks
    from softfree_mm.engine import device, runner
    from softfree_mm.engine.checkpoints import latest_checkpoint
    from softfree_mm.engine.demo_data import make_demo
    from softfree_mm.engine.errors import UsageError
    cfg, on = runner.tool_config('train', args)
    if args.resume == 'auto':
        # the newest checkpoint of the work dir (mmengine's last_checkpoint, else the newest iter_/epoch_ file)
        cfg.resume, cfg.load_from = True, latest_checkpoint(cfg.work_dir, check=False)
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise UsageError(f'--resume: checkpoint not found: {args.resume}')
        cfg.resume, cfg.load_from = True, args.resume
    checks.check_attention(cfg)
    checks.check_model_types(cfg)
    checks.check_types(cfg)
    checks.check_vis_backends(cfg)
    phases = ('train', 'val') if cfg.get('val_cfg') is not None else ('train', )
    if not getattr(args, 'dry_run', False):  # a dry run reads no data and loads no weights
        for root, subset in checks.demo_roots(cfg, phases):
            make_demo(root, subset)
        checks.check_data(cfg, phases)
        if not (cfg.get('resume') and cfg.get('load_from')):  # a resumed checkpoint replaces every weight
            checks.check_pretrained(cfg)
    if on == 'cuda':
        device.check_cuda_ops(cfg)
    if args.amp:
        device.enable_amp(cfg, args.amp_dtype)
    if args.auto_scale_lr:
        runner.enable_auto_scale_lr(cfg)
    device.enable_determinism_env(cfg)
    runner.add_reliability_hooks(cfg, args.skip_nonfinite_loss)
    for note in device.apply_device_settings(cfg, args.launcher) + device.apply_cluster_settings(cfg, args.launcher):
        print(f'[softfree_mm] {note}', file=sys.stderr)
    return cfg


def check_start(runner, cfg, auto_resume):
    """The checkpoints the run starts from are readable and belong to the model: each backbone's Pretrained file that
    is here (the warm start's teacher included), and load_from (--resume: exactly); an auto-resume whose newest
    checkpoint is unreadable falls back to the newest readable one."""
    from mmengine.model import is_model_wrapper
    from softfree_mm.engine.checkpoints import check_checkpoint, latest_checkpoint, remove_stale_temporaries
    from softfree_mm.engine.dry_run import check_starts_here
    from softfree_mm.engine.errors import BadInput
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    check_starts_here(model)  # each backbone's Pretrained file that is here holds its architecture
    path = cfg.get('load_from')
    if not path:
        return
    try:
        check_checkpoint(path, model, 'resume' if cfg.get('resume') else 'load')
    except BadInput as e:
        if not auto_resume:
            raise
        fallback = latest_checkpoint(cfg.work_dir, check=True)
        if not fallback or fallback == path:
            raise
        print(f'[softfree_mm] {e}; resuming from {fallback} instead', file=sys.stderr)
        check_checkpoint(fallback, model, 'resume')
        runner._load_from = fallback
    from mmengine.dist import is_main_process
    if cfg.get('resume') and is_main_process():
        remove_stale_temporaries(cfg.work_dir)


def main(argv=None):
    args = parse_args(argv)
    if (args.device or os.environ.get('SOFTFREE_MM_DEVICE')) == 'cpu':
        os.environ['CUDA_VISIBLE_DEVICES'] = ''  # before anything initialises CUDA: every part takes its CPU path
    from softfree_mm.engine.data_errors import name_failing_samples
    from softfree_mm.engine.runner import build_runner, finish_dist, one_line_errors, run
    name_failing_samples()
    with one_line_errors(args.config, setup=True) as setup:
        cfg = prepare(args)
        if args.dry_run:
            from softfree_mm.engine.dry_run import dry_run
            for line in dry_run(cfg):
                print(f'[dry-run] {line}')
            print(f'[dry-run] {args.config}: config checked, no data read, nothing trained')
            return 0
        runner = build_runner(cfg)
        check_start(runner, cfg, auto_resume=args.resume == 'auto')
    if setup.status:
        return setup.status
    with one_line_errors(args.config) as training:
        run(runner, 'train', args.config)
    if training.status:
        return training.status
    finish_dist()
    return 0
