#!/usr/bin/env python
"""From a softmax release to the main job in one command: the warm start's stages a config needs, then the config.

    python tools/warm_start.py CONFIG [--work-root work_dirs] [--recipe NAME] [--release PATH_OR_URL] [--iters N]
        [--stage1-options KEY=VALUE ...] [--stage2-options KEY=VALUE ...] [--cfg-options KEY=VALUE ...]
        [--launcher none|pytorch|slurm] [--gpus N] [--nnodes N] [--partition P] [--job-name NAME]
        [--dry-run] [--train-args "ARGS"]
    python tools/warm_start.py --write-recipe-configs

CONFIG is a detection, segmentation or classification config of a kernel without a release (docs/warm_start.md):
its backbone starts from the work dir of the warm start's stage 2 (configs/finetune_<pair>.py), whose backbone
starts from stage 1's (configs/transfer_<pair>.py), whose teacher is the softmax release; a classification config
cls_<pair>.py stands for its stage 2. Each run's work dir is WORK_ROOT/<its config name>, and each reads the one
before it (its last checkpoint, found there: no config hard-codes an iteration count). A stage that finished is not
run again; one that stopped is resumed (tools/train.py --resume); then CONFIG runs (resumed too when it stopped).
Each run is its own process, started the way a user starts one: tools/train.py (--launcher none, the default),
tools/dist_train.sh with --gpus per node (--launcher pytorch; several nodes: run the command on each with NNODES,
NODE_RANK, MASTER_ADDR set, as dist_train.sh reads them) or tools/slurm_train.sh on --partition with --gpus per node
x --nnodes (--launcher slurm). --recipe NAME runs another recipe of softfree_mm/engine/warm_start.py (transfer,
the default, transfer-half, transfer-final, transfer-attn, transfer-newhead: docs/warm_start.md) at the stage
configs' scale; a stage config may also take configs/_base_/transfer/recipe_<name>.py as its base. --iters N runs the
recipe at another length: N iterations in both stages, split and
scheduled as the recipe says (the stage configs' recipe base names it). --release replaces the release the chain starts from (stage 1's teacher, stage 2's
head); --stage1-options, --stage2-options and --cfg-options (CONFIG's) go to one run each; --train-args to every
tools/train.py call (e.g. "--amp --device cpu"). --dry-run prints the chain: each run's config, work dir, the
checkpoint it reads and the one it writes, and which of them exist.
--write-recipe-configs writes configs/_base_/transfer/recipe_<name>.py from softfree_mm/engine/warm_start.py.
Bad input (a config with a release, one that is no det / seg / cls config, a work dir holding another backbone x
kernel's checkpoint, a release of another architecture, bad options): one line, exit status 2, before any iteration.
"""
import os
import os.path as osp
import shlex
import subprocess
import sys

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository, for `softfree_mm`


def parse_args(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], epilog=__doc__.partition('\n\n')[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', nargs='?')
    p.add_argument('--work-root', default='work_dirs', help='each run works in WORK_ROOT/<its config name>')
    p.add_argument('--release', help="the release the chain starts from (default: the stage configs')")
    p.add_argument('--iters', type=int, help="both stages' iterations in all (default: the recipe's at its scale)")
    p.add_argument('--recipe', help="the warm-start recipe (default: the stage configs')")
    p.add_argument('--stage1-options', nargs='+', default=[], metavar='KEY=VALUE')
    p.add_argument('--stage2-options', nargs='+', default=[], metavar='KEY=VALUE')
    p.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE', help="CONFIG's")
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    p.add_argument('--gpus', type=int, default=None, help='processes per node (pytorch: default 1; slurm: 8)')
    p.add_argument('--nnodes', type=int, default=1, help='nodes (slurm)')
    p.add_argument('--partition', help='the Slurm partition (--launcher slurm)')
    p.add_argument('--job-name', default='warm_start', help='Slurm job name prefix')
    p.add_argument('--train-args', default='', help='options for every tools/train.py call, as one string')
    p.add_argument('--dry-run', action='store_true', help='print the chain, run nothing')
    p.add_argument('--write-recipe-configs', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write_recipe_configs:
        return args
    if not args.config:
        p.error('CONFIG is required')
    for opt in args.stage1_options + args.stage2_options + args.cfg_options:
        if '=' not in opt:
            p.error(f'options are KEY=VALUE, got {opt!r}')
    if args.iters is not None and args.iters < 2:
        p.error(f'--iters must be at least 2 (one a stage), got {args.iters}')
    if args.gpus is not None and args.gpus < 1:
        p.error(f'--gpus must be a positive number, got {args.gpus}')
    if args.nnodes < 1:
        p.error(f'--nnodes must be a positive number, got {args.nnodes}')
    if args.launcher == 'slurm' and not args.partition:
        p.error('--launcher slurm needs --partition')
    if args.launcher != 'slurm' and args.nnodes != 1:
        p.error('--nnodes is for --launcher slurm (with pytorch, run the command on each node with NNODES, NODE_RANK '
                'and MASTER_ADDR set)')
    return args


def _config(stage):
    """The stage's config with its options (as its run reads it)."""
    from mmengine.config import Config, DictAction
    import argparse
    cfg = Config.fromfile(stage.config)
    opts = [f'{stage.read_key}={stage.reads}', *stage.options]
    p = argparse.ArgumentParser()
    p.add_argument('--o', nargs='+', action=DictAction)
    cfg.merge_from_dict(p.parse_args(['--o', *opts]).o)
    return cfg


def _target(cfg):
    """('iter' | 'epoch', the count the run ends at)."""
    loop = cfg.get('train_cfg', {}) or {}
    if loop.get('max_iters') is not None:
        return 'iter', int(loop['max_iters'])
    return 'epoch', int(loop.get('max_epochs') or 0)


def _state(stage, cfg):
    """('done' | 'partial' | 'missing', its last checkpoint, where it is)."""
    import torch

    from softfree_mm.models.converters import checkpoints_in
    found = checkpoints_in(stage.work_dir) if osp.isdir(stage.work_dir) else []
    if not found:
        return 'missing', None, None
    unit, end = _target(cfg)
    meta = torch.load(found[0], map_location='cpu', weights_only=False).get('meta', {})
    at = meta.get(unit)
    return ('done' if at is not None and at >= end else 'partial'), found[0], (unit, at, end)


def _exists(path):
    from urllib.parse import urlparse

    import torch

    from softfree_mm.models.converters import checkpoints_in, release_file_name
    if urlparse(path).scheme in ('http', 'https'):
        cached = osp.join(torch.hub.get_dir(), 'checkpoints', release_file_name(path))
        return 'downloaded' if osp.isfile(cached) else 'not downloaded yet: the run fetches it'
    if osp.isdir(path):
        return 'here' if checkpoints_in(path) else 'holds no checkpoint yet'
    return 'here' if osp.isfile(path) else 'missing'


def _command(args, stage, resume):
    opts = ['--cfg-options', f'{stage.read_key}={stage.reads}', *stage.options]
    extra = [*shlex.split(args.train_args), *(['--resume'] if resume else []), *opts]
    if args.launcher == 'pytorch':
        return ['bash', osp.join(ROOT, 'tools', 'dist_train.sh'), stage.config, str(args.gpus or 1),
                '--work-dir', stage.work_dir, *extra], {}
    if args.launcher == 'slurm':
        per_node = args.gpus or 8
        env = dict(GPUS=str(per_node * args.nnodes), GPUS_PER_NODE=str(per_node))
        return ['bash', osp.join(ROOT, 'tools', 'slurm_train.sh'), args.partition, f'{args.job_name}_{stage.name}',
                stage.config, stage.work_dir, *extra], env
    return [sys.executable, osp.join(ROOT, 'tools', 'train.py'), stage.config, '--work-dir', stage.work_dir,
            *extra], {}


def main(argv=None):
    args = parse_args(argv)
    from softfree_mm.engine import warm_start as ws
    from softfree_mm.engine.errors import UsageError
    if args.write_recipe_configs:
        for path in ws.write_recipe_configs(ROOT):
            print(f'[warm-start] wrote {osp.relpath(path, ROOT)}')
        return 0
    options = dict(stage1=list(args.stage1_options), stage2=list(args.stage2_options), main=list(args.cfg_options))
    if args.release:
        options['stage1'].append(f'model.teacher.init_cfg.checkpoint={args.release}')
        options['stage2'].append(f'model.head.init_cfg.checkpoint={args.release}')
    runs = ws.chain(args.config, args.work_root, ROOT, options)
    if args.release:
        runs[0].reads = args.release
    if args.recipe is not None and args.recipe not in ws.RECIPES:
        raise UsageError(f'--recipe {args.recipe!r} is no recipe; known: {", ".join(ws.RECIPES)}')
    if args.iters or args.recipe:
        from mmengine.config import Config
        declared = Config.fromfile(runs[0].config).get('warm_start') or {}
        if declared.get('recipe') not in ws.RECIPES or declared.get('scale') not in ws.SCALES:
            what = '--iters' if args.iters else '--recipe'
            raise UsageError(f'{what}: {runs[0].config} takes no recipe base (configs/_base_/transfer/recipe_*.py), '
                             "so its scale is not known; set the stages' keys with --stage1-options and "
                             '--stage2-options')
        recipe = ws.RECIPES[args.recipe or declared['recipe']]
        scale = ws.SCALES[declared['scale']]
        extra = (ws.recipe_options(recipe, scale, args.iters) if args.recipe else
                 ws.length_options(recipe, scale, args.iters))
        runs[0].options[:0] = extra['stage1']
        runs[1].options[:0] = extra['stage2']
    cfgs = [_config(r) for r in runs]
    states = [_state(r, c) for r, c in zip(runs, cfgs)]
    for r, c, (state, ckpt, _) in zip(runs, cfgs, states):  # a work dir holding another pair's run
        if ckpt is None:
            continue
        theirs, ours = ws.checkpoint_pair(ckpt), ws.backbone_pair(c)
        if theirs is not None and theirs != ours:
            raise UsageError(f'{r.work_dir} holds a checkpoint of {ws.describe_pair(theirs)}, not of this run\'s '
                             f'{ws.describe_pair(ours)} ({osp.basename(ckpt)}): give the chain another --work-root, '
                             'or move that folder away')
    if states[0][0] != 'done':  # a release of another architecture: one line before any run
        ws.check_release(cfgs[0])
    n = len(runs)
    declared = cfgs[0].get('warm_start') or {}
    if declared:
        print(f"[warm-start] recipe {args.recipe or declared.get('recipe')} at the {declared.get('scale')} scale "
              '(softfree_mm/engine/warm_start.py)', flush=True)
    for i, (r, c, (state, ckpt, where)) in enumerate(zip(runs, cfgs, states), 1):
        unit, end = _target(c)
        what = 'stage 1 (transfer)' if i == 1 else 'stage 2 (fine-tune)' if i == 2 else 'the main job'
        if state == 'done':
            now = f'done: {ckpt}'
        elif state == 'partial':
            now = f'stopped at {where[0]} {where[1]} of {end}: resumes from {ckpt}'
        else:
            now = 'not started'
        print(f'[warm-start] {i}/{n} {what}: {osp.relpath(r.config, ROOT) if r.config.startswith(ROOT) else r.config}'
              f'\n    work dir {r.work_dir}; reads {r.reads} ({_exists(r.reads)}); writes its last checkpoint there '
              f'after {end} {unit}s; {now}', flush=True)
    if args.dry_run:
        return 0
    for i, (r, c, (state, _, _)) in enumerate(zip(runs, cfgs, states), 1):
        if state == 'done':
            continue
        cmd, env = _command(args, r, resume=state == 'partial')
        print(f'[warm-start] {i}/{n} {r.name}: {" ".join(shlex.quote(x) for x in cmd)}', flush=True)
        proc = subprocess.run(cmd, cwd=os.getcwd(), env=dict(os.environ, **env))
        if proc.returncode:
            print(f'[warm-start] {r.name} stopped with exit status {proc.returncode}; the same command resumes the '
                  'chain', file=sys.stderr, flush=True)
            return proc.returncode
        state, ckpt, where = _state(r, c)
        if state != 'done' and args.launcher != 'slurm':
            raise UsageError(f'{r.name} ended without its last checkpoint in {r.work_dir} ({state}): the chain stops')
    print(f'[warm-start] {args.config}: every run of the chain is done', flush=True)
    return 0


if __name__ == '__main__':
    from softfree_mm.engine.errors import UsageError
    try:
        sys.exit(main())
    except UsageError as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
