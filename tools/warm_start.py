#!/usr/bin/env python
"""From a softmax release to the main job in one command: the warm start's stages a config needs, then the config.

    python tools/warm_start.py CONFIG [--work-root work_dirs] [--recipe NAME] [--release PATH_OR_URL] [--iters N]
        [--stage1-options KEY=VALUE ...] [--stage2-options KEY=VALUE ...] [--cfg-options KEY=VALUE ...]
        [--launcher none|pytorch|slurm] [--gpus N] [--nnodes N] [--partition P] [--job-name NAME]
        [--batch-scale linear|keep] [--wait] [--dry-run] [--train-args "ARGS"]
    python tools/warm_start.py --write-recipe-configs

CONFIG is a detection, segmentation or classification config of a kernel without a release (docs/warm_start.md):
its backbone starts from the work dir of the warm start's stage 2 (configs/finetune_<pair>.py), whose backbone
starts from stage 1's (configs/transfer_<pair>.py), whose teacher is the softmax release; a classification config
cls_<pair>.py stands for its stage 2. Each run's work dir is WORK_ROOT/<its config name>, and each reads the one
before it (its last checkpoint, found there: no config hard-codes an iteration count).
Decided from the end: the last run that is done and is this chain's ends the search; only what follows it runs (one
that stopped resumes, tools/train.py --resume). A run is this chain's when the fingerprint in its work dir
(warm_start_run.json, written when it starts: config, backbone, start, release and its sha256, recipe, scale, length,
lr rule, world size x per-GPU batch) is what this command would make; a work dir made before fingerprints is judged
by the config its checkpoint saved. Another is one line, exit status 2, before any process starts.
Each run is its own process, started the way a user starts one: tools/train.py (--launcher none, the default),
tools/dist_train.sh with --gpus per node (--launcher pytorch; several nodes: run the command on each with NNODES,
NODE_RANK, MASTER_ADDR set, as dist_train.sh reads them) or tools/slurm_train.sh on --partition with --gpus per node
x --nnodes (--launcher slurm). Each stage's images a step (processes x train_dataloader.batch_size) must be the
recipe's scale's (1024 at ImageNet: --gpus 8), or --batch-scale linear (lr and iterations rescaled) or keep says
what to do. --recipe NAME runs another recipe of softfree_mm/engine/warm_start.py (transfer, transfer-half,
transfer-final, transfer-attn, transfer-blocks, transfer-newhead: docs/warm_start.md) at the stage configs' scale.
--iters N runs the recipe at another length: N iterations in both stages, split and scheduled as the recipe says.
--release replaces the release the chain starts from (stage 1's teacher, stage 2's head); a URL is downloaded once,
by this tool, into WORK_ROOT/releases/ and every run reads that file. --stage1-options, --stage2-options and
--cfg-options (CONFIG's) go to one run each; --train-args to every tools/train.py call (e.g. "--amp --device cpu").
A second invocation of the same chain stops with one line (--wait: waits for the first). --dry-run prints the
chain: each run's config, work dir, the checkpoint it reads and the one it writes, and which of them exist.
--write-recipe-configs writes configs/_base_/transfer/recipe_<name>.py from softfree_mm/engine/warm_start.py.
Bad input (a config with a release, one that is no det / seg / cls config, a work dir holding another run, a
release of another architecture or not reachable, a launch of another batch, bad options): one line, exit status 2,
before any iteration. The logic is softfree_mm/engine/chain_run.py.
"""
import os.path as osp
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
    p.add_argument('--batch-scale', choices=['linear', 'keep'],
                   help="a launch of another batch than the recipe's: scale the lr and iterations, or keep them")
    p.add_argument('--wait', action='store_true', help='another invocation runs this chain: wait for it to end')
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


def request_of(args):
    from softfree_mm.engine.chain_run import Request
    options = dict(stage1=list(args.stage1_options), stage2=list(args.stage2_options), main=list(args.cfg_options))
    return Request(args.config, args.work_root, args.release, args.iters, args.recipe, options, args.launcher,
                   args.gpus, args.nnodes, args.partition, args.job_name, args.train_args, args.batch_scale)


def main(argv=None):
    args = parse_args(argv)
    from softfree_mm.engine import chain_run as cr
    from softfree_mm.engine.chain_release import chain_lock
    if args.write_recipe_configs:
        from softfree_mm.engine.warm_start import write_recipe_configs
        for path in write_recipe_configs(ROOT):
            print(f'[warm-start] wrote {osp.relpath(path, ROOT)}')
        return 0
    plan = cr.plan(request_of(args), ROOT)
    probe = cr.probe(plan)
    cr.check_launch(plan, probe)
    cr.release_for(plan, probe, fetch_it=False)  # a release of another architecture: one line before any run
    print('\n'.join(cr.report(plan, probe)), flush=True)
    if args.dry_run:
        return 0
    with chain_lock(args.work_root, plan.runs[0].name, args.wait, say=lambda s: print(s, flush=True)):
        probe = cr.probe(plan)  # again, under the lock: a run that held it may have moved the chain on
        release = cr.release_for(plan, probe, fetch_it=True)
        return cr.execute(plan, probe, release, say=lambda s, **kw: print(s, flush=True, **kw))


if __name__ == '__main__':
    from softfree_mm.engine.errors import UsageError
    try:
        sys.exit(main())
    except UsageError as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
