#!/usr/bin/env python
"""From a softmax release to the main job in one command: the warm start's stages a config needs, then the config.

    python tools/warm_start.py CONFIG [--work-root work_dirs] [--recipe NAME] [--release PATH_OR_URL] [--iters N]
        [--stage1-options KEY=VALUE ...] [--stage2-options KEY=VALUE ...] [--cfg-options KEY=VALUE ...]
        [--launcher none|pytorch|slurm] [--gpus N [ROLE=N ...]] [--nnodes N] [--partition P] [--job-name NAME]
        [--cpus-per-task N] [--srun-args "ARGS"] [--submit [--time T] [--signal-before S] [--sbatch-args "ARGS"]]
        [--batch-scale linear|keep] [--wait] [--dry-run] [--train-args "ARGS"]
    python tools/warm_start.py CONFIG --from-task CHECKPOINT [the options above but --release and --cfg-options]
    python tools/warm_start.py --write-recipe-configs

CONFIG is a detection, segmentation or classification config of a kernel without a release (docs/warm_start.md):
its backbone starts from the work dir of the warm start's stage 2 (configs/finetune_<pair>.py), whose backbone
starts from stage 1's (configs/transfer_<pair>.py), whose teacher is the softmax release; a classification config
cls_<pair>.py stands for its stage 2. Each run's work dir is WORK_ROOT/<its config name>, and each reads the one
before it (its last checkpoint, found there: no config hard-codes an iteration count).
Decided from the end: the last run that is done and is this chain's ends the search; only what follows it runs (one
that stopped resumes, tools/train.py --resume). A run is this chain's when the identity in its work dir
(run_identity.json, written when it starts: the hash of its whole resolved config less a named list of keys that cannot
change a result, of its starts, a release by content hash and an upstream run by that run's planned record, of world
size x per-GPU batch and of the --train-args flags that change a result; softfree_mm/engine/run_identity.py) is what
this command would make; records chain, so a finished main job is the chain's only when the stages above it are too.
A work dir made before identities is judged by the config its checkpoint saved and the world size its log names.
Another is one line naming the first resolved keys that differ (old -> new), exit status 2, before any process
starts (docs/warm_start.md, "What identifies a run").
Each run is its own process, started the way a user starts one: tools/train.py (--launcher none, the default),
tools/dist_train.sh with --gpus processes on this node (--launcher pytorch) or tools/slurm_train.sh on --partition with --gpus per node
x --nnodes (--launcher slurm; --cpus-per-task and --srun-args, e.g. "--account=A --qos=Q", go to each srun; a
CPU run, --train-args "--device cpu", asks for no GPU GRES; each stage's output is WORK_ROOT/logs/<run>.<time>.log).
The scripts run this tool's interpreter (PYTHON).
--gpus ROLE=N (stage1, stage2, main) gives one stage its own count. One controller runs a chain: this tool, on one
node (--launcher pytorch runs on this node only: a chain over several nodes runs on Slurm).
--submit (slurm) submits the chain through submitit: one job per stage that runs, each after the one before it
(afterok) and every job of the chain a singleton (one chain at a time); each job holds its stage's --gpus per node x
--nnodes, its tasks started by Slurm; Slurm warns it with USR2 --signal-before seconds before --time (default: the
partition's default time): the stage saves a checkpoint at its iteration and stops, and the job requeues itself and
resumes there, as long as it made progress (softfree_mm/engine/chain_job.py). --sbatch-args adds the jobs' own
options; each task's output is WORK_ROOT/logs/submitit/<job id>_<task>_log.out. Each stage's images a step
(processes x train_dataloader.batch_size) must be the recipe's scale's (1024 at ImageNet: --gpus 8), or
--batch-scale linear (lr and iterations rescaled) or keep says what to do. --recipe NAME runs another recipe of softfree_mm/engine/warm_start.py (transfer, transfer-half,
transfer-final, transfer-attn, transfer-blocks, transfer-newhead: docs/warm_start.md) at the stage configs' scale.
--iters N runs the recipe at another length: N iterations in both stages, split and scheduled as the recipe says.
--release replaces the release the chain starts from (stage 1's teacher, stage 2's head); a URL is downloaded once,
by this tool, into WORK_ROOT/releases/<hash of the URL>/ (a web page is refused; nodes without internet: --release
FILE) and every run reads that file. --stage1-options, --stage2-options and
--cfg-options (CONFIG's) go to one run each; --train-args to every tools/train.py call (e.g. "--amp --device cpu").
A second invocation of the same chain stops with one line (--wait: waits for the first): the lock is held while any
stage it started runs, even when this tool is killed. --dry-run prints the
chain: each run's config, work dir, the checkpoint it reads and the one it writes, and which of them exist.
--from-task CHECKPOINT takes the task route instead (docs/warm_start.md, "The task route"): CONFIG is a detection
or segmentation config of the kernel and CHECKPOINT the same model trained with softmax (ours, or mmdet's / mmseg's
Swin); stage 1 transfers the backbone's blocks on CONFIG's own training images (teacher: CHECKPOINT's backbone),
stage 2 fine-tunes CONFIG's whole model (backbone from stage 1, neck and heads from CHECKPOINT), the recipe's split of
a quarter of CONFIG's schedule (--iters N: N iterations); the stage configs are written into WORK_ROOT/task_route/
(softfree_mm/engine/task_route.py). The first lines say which route runs and what each run costs in images.
--write-recipe-configs writes configs/_base_/transfer/recipe_<name>.py from softfree_mm/engine/warm_start.py.
Bad input (a config with a release, one that is no det / seg / cls config or does not parse, options that do not fit
it, a work dir holding another run, a release of another architecture or not reachable, a launch of another batch,
bad options, a file system without locks): one line, exit status 2, before any iteration. The logic is softfree_mm/engine/chain_run.py.
"""
import os
import os.path as osp
import shlex
import sys

import tool_warnings  # noqa: F401  (tools/tool_warnings.py: before the OpenMMLab stack is imported)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository, for `softfree_mm`


def parse_args(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], epilog=__doc__.partition('\n\n')[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument('config', nargs='?')
    p.add_argument('--work-root', default='work_dirs', help='each run works in WORK_ROOT/<its config name>')
    p.add_argument('--release', help="the release the chain starts from (default: the stage configs')")
    p.add_argument('--from-task', metavar='CHECKPOINT',
                   help='the task route: CONFIG (det / seg) made softmax-free from this trained softmax model of it')
    p.add_argument('--iters', type=int, help="both stages' iterations in all (default: the recipe's at its scale)")
    p.add_argument('--recipe', help="the warm-start recipe (default: the stage configs')")
    p.add_argument('--stage1-options', nargs='+', default=[], metavar='KEY=VALUE')
    p.add_argument('--stage2-options', nargs='+', default=[], metavar='KEY=VALUE')
    p.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE', help="CONFIG's")
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    p.add_argument('--gpus', nargs='+', default=[], metavar='N|ROLE=N',
                   help="processes per node (pytorch: default 1; slurm: 8); ROLE=N (stage1, stage2, main): one stage's")
    p.add_argument('--nnodes', type=int, default=1, help='nodes (slurm)')
    p.add_argument('--partition', help='the Slurm partition (--launcher slurm)')
    p.add_argument('--job-name', default='warm_start', help='Slurm job name prefix')
    p.add_argument('--train-args', default='', help='options for every tools/train.py call, as one string')
    p.add_argument('--cpus-per-task', type=int, help="slurm: CPUs per task (default: tools/slurm_train.sh's, 10)")
    p.add_argument('--srun-args', default='', help='slurm: more srun options for each stage, as one string')
    p.add_argument('--submit', action='store_true',
                   help='slurm: a job per stage through submitit, each requeued at its time limit until it is done')
    p.add_argument('--time', help="--submit: each job's time limit (sbatch --time; default: the partition's)")
    p.add_argument('--signal-before', type=int, default=300, metavar='S',
                   help='--submit: seconds before the limit at which the stage saves and the job requeues')
    p.add_argument('--sbatch-args', default='', help='--submit: more sbatch options for the jobs, as one string')
    p.add_argument('--batch-scale', choices=['linear', 'keep'],
                   help="a launch of another batch than the recipe's: scale the lr and iterations, or keep them")
    p.add_argument('--wait', action='store_true', help='another invocation runs this chain: wait for it to end')
    p.add_argument('--dry-run', action='store_true', help='print the chain, run nothing')
    p.add_argument('--write-recipe-configs', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args(_joined(argv))
    if args.write_recipe_configs:
        return args
    if not args.config:
        p.error('CONFIG is required')
    for opt in args.stage1_options + args.stage2_options + args.cfg_options:
        if '=' not in opt:
            p.error(f'options are KEY=VALUE, got {opt!r}')
    if args.iters is not None and args.iters < 2:
        p.error(f'--iters must be at least 2 (one a stage), got {args.iters}')
    args.gpus, args.stage_gpus = _gpus(p, args.gpus)
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        p.error(f'--cpus-per-task must be a positive number, got {args.cpus_per_task}')
    if args.submit and args.launcher != 'slurm':
        p.error('--submit is for --launcher slurm (a job per stage)')
    if not 0 < args.signal_before < 65536:
        p.error(f'--signal-before must be 1 to 65535 seconds, got {args.signal_before}')
    for opt in ('time', 'sbatch_args'):
        if getattr(args, opt) and not args.submit:
            p.error(f'--{opt.replace("_", "-")} is for --submit')
    if args.nnodes < 1:
        p.error(f'--nnodes must be a positive number, got {args.nnodes}')
    if args.launcher == 'slurm' and not args.partition:
        p.error('--launcher slurm needs --partition')
    if args.launcher != 'slurm' and args.nnodes != 1:
        p.error('--nnodes is for --launcher slurm (a chain over several nodes runs on Slurm)')
    nnodes = os.environ.get('NNODES', '1').strip() or '1'
    if args.launcher == 'pytorch' and nnodes != '1' and not args.dry_run:
        p.error(f'NNODES={nnodes}: --launcher pytorch runs a chain on this node only (one controller launches every '
                'stage); a chain over several nodes runs on Slurm: --launcher slurm --nnodes N [--submit]. One run over '
                'several nodes without Slurm: tools/dist_train.sh on each node (docs/clusters.md)')
    return args


_VALUED = ('--train-args', '--srun-args', '--sbatch-args')


def _joined(argv):
    """'--train-args --amp' as '--train-args=--amp' (argparse takes a value that starts with '-' for an option)."""
    out, i = [], 0
    argv = list(argv or [])
    while i < len(argv):
        if argv[i] in _VALUED and i + 1 < len(argv):
            out.append(f'{argv[i]}={argv[i + 1]}')
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


from softfree_mm.engine.chain import ROLES  # noqa: E402  (stage1, stage2, main)


def _gpus(p, values):
    """--gpus N [ROLE=N ...] -> (N or None, {role: N})."""
    common, per_role = None, {}
    for v in values:
        role, _, count = v.rpartition('=')
        if role and role not in ROLES:
            p.error(f'--gpus {v}: no stage {role!r}; stages are {", ".join(ROLES)} (ROLE=N), or N for all')
        if not count.isdigit() or int(count) < 1:
            p.error(f'--gpus must be a positive number, got {count}' + (f' in {v}' if role else ''))
        if role:
            per_role[role] = int(count)
        else:
            common = int(count)
    return common, per_role


def request_of(args):
    from softfree_mm.engine.chain_run import Request
    options = dict(stage1=list(args.stage1_options), stage2=list(args.stage2_options), main=list(args.cfg_options))
    return Request(config=args.config, work_root=args.work_root, release=args.release, iters=args.iters,
                   recipe=args.recipe, options=options, launcher=args.launcher, gpus=args.gpus, nnodes=args.nnodes,
                   partition=args.partition, job_name=args.job_name, train_args=args.train_args,
                   batch_scale=args.batch_scale, stage_gpus=args.stage_gpus, cpus_per_task=args.cpus_per_task,
                   srun_args=args.srun_args)


def submit(args, plan, say):
    """--submit: the release fetched here, a job per stage that runs (softfree_mm/engine/chain_job.py)."""
    from softfree_mm.engine import chain_job
    from softfree_mm.engine import chain_run as cr
    from softfree_mm.engine.errors import UsageError
    limit = args.time or chain_job.partition_time(args.partition)
    time_s = chain_job.seconds(limit)
    if time_s - args.signal_before < 1:
        raise UsageError(f'--time {limit} with --signal-before {args.signal_before}: the warning would come before '
                         'each job starts; give a longer --time or a smaller --signal-before')
    chain_job.sbatch_options(args.sbatch_args)  # one line before anything is fetched
    probe = cr.probe(plan)
    release = cr.release_for(plan, probe, fetch_it=True)  # on this node: compute nodes may have no internet
    if release:
        from softfree_mm.engine import chain_identity
        plan.records = chain_identity.records(plan.runs, plan.cfgs, plan.request)
    if probe.first == len(plan.runs):
        say(f'[warm-start] {args.config}: every run of the chain is done; nothing to submit')
        return 0
    jobs = chain_job.submit(plan, probe, release, time_s, args.signal_before, args.sbatch_args, say=say)
    say(f'[warm-start] submitted {len(jobs)} job(s) ({", ".join(jobs)}) as {chain_job.chain_job_name(plan)}: each '
        f'requeued at its time limit ({limit}) while it makes progress; the same command later finds what they did')
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from softfree_mm.engine import chain_run as cr
    from softfree_mm.engine.chain_release import chain_lock
    if args.write_recipe_configs:
        from softfree_mm.engine.warm_start import write_recipe_configs
        for path in write_recipe_configs(ROOT):
            print(f'[warm-start] wrote {osp.relpath(path, ROOT)}')
        return 0
    say = lambda s, **kw: print(s, flush=True, **kw)  # noqa: E731
    if args.from_task:  # the task route: its stage configs written into the work root (engine/task_route.py)
        from softfree_mm.engine.task_route import plan as task_plan
        plan = task_plan(request_of(args), ROOT, args.from_task)
    else:
        plan = cr.plan(request_of(args), ROOT)
    probe = cr.probe(plan)
    cr.check_launch(plan, probe)
    cr.release_for(plan, probe, fetch_it=False)  # a release of another architecture: one line before any run
    from softfree_mm.engine.route_report import route_lines
    print('\n'.join(route_lines(plan)), flush=True)
    from softfree_mm.engine.chain_report import report
    print('\n'.join(report(plan, probe)), flush=True)
    if args.dry_run:
        return 0
    if args.submit:
        return submit(args, plan, say)
    with chain_lock(args.work_root, plan.runs[0].name, args.wait, say=say) as lock:
        probe = cr.probe(plan)  # again, under the lock: a run that held it may have moved the chain on
        release = cr.release_for(plan, probe, fetch_it=True)
        return cr.execute(plan, probe, release, say=say, keep_fds=(lock, ))


if __name__ == '__main__':
    from softfree_mm.engine.errors import UsageError
    try:
        sys.exit(main())
    except UsageError as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
