"""The project's three studies, each a declaration of the one engine (:mod:`.study_engine`): what it crosses, what
it measures, how its runs pair, where its rule is stated, its plan and its outputs. The tools
(tools/analysis/study.py, task_study.py, warm_start_grid.py) parse their command lines into
:class:`~.study_engine.Options` and call :func:`.study_engine.run` with one of these.
"""
import os.path as osp
from typing import List

from ..engine.errors import UsageError
from .study_engine import NOT_RUN, Context, Declaration, Tables


# ---------------------------------------------------------------------------------------------- the kernel study
def _kernel_plan(ctx: Context) -> Tables:
    """Every (config, kernel, seed) of the selection (report only: the finished ones read, the others 'not run'),
    the kept runs of --keep-from with them; their norm curves."""
    from . import study as st
    o = ctx.options
    kept = None
    if o.keep_from:
        from .study_keep import KeptStudy
        kept = KeptStudy(o.keep_from)
    rows = st.study(o.configs, o.specs, o.seeds, ctx.runner, o.cfg_options, key=o.key, in_process=o.in_process,
                    kept=kept)  # a report-only runner reads the finished runs: the others are 'not run'
    new = [r for r in rows if not (kept and kept.get(r['config'], r['kernel'], r['seed']))]
    curves = st.norm_curves(new, ctx.runner.root)
    if kept is not None:  # the kept runs outside the selection too, and their curves; a run not run keeps its row
        rows = [r for r in rows if r['status'] != NOT_RUN or (r['config'], r['kernel'], r['seed']) not in kept.rows]
        rows, curves = kept.merged(rows, curves)
    return dict(rows=rows, curves=curves)


def _kernel_write(ctx: Context, tables: Tables) -> List[str]:
    from .study_report import write_outputs
    o = ctx.options
    return write_outputs(tables['rows'], tables['curves'], o.out, o.configs, o.cfg_options_dict, ctx.root,
                         kept_from=[o.keep_from] if o.keep_from else [])


KERNEL_STUDY = Declaration(
    name='study', axes=('config', 'kernel', 'seed'), metrics=('top1_final', ), pairing='seed',
    rule='softfree_mm.analysis.study.summarise (each kernel minus softmax, paired by seed)',
    plan=_kernel_plan, write=_kernel_write, tables=('rows', ))


# ---------------------------------------------------------------------------------------------- the task study
def _task_plan(ctx: Context) -> Tables:
    """The classifiers, then the detectors and segmentors of the selection (task_study.Study); the kept rows of
    --keep-from and their curves with them."""
    from . import task_curves as tc
    from . import task_study as ts
    o = ctx.options
    try:
        keep = ts.read_rows(o.keep_from) if o.keep_from else []
    except (KeyError, ValueError, UsageError) as e:
        raise UsageError(f'--keep-from {o.keep_from}: not a runs.csv of this study ({type(e).__name__}: {e})')
    if keep:
        ctx.echo(f'[task-study] keeping the finished rows of {o.keep_from} '
                 f'({sum(r["status"] == "ok" and r["source"] == "study" for r in keep)} of {len(keep)}): '
                 'not run again')
    study = ts.Study(ctx.runner, ctx.root, o.seeds, o.layouts, o.tasks, o.kernels, o.det_from or None, o.starts,
                     keep=keep, echo=ctx.echo)
    curves_from = osp.join(osp.dirname(o.keep_from), 'curves.csv') if o.keep_from else ''
    try:
        kept_curves = tc.read_curves(curves_from) if curves_from else {}
    except (KeyError, ValueError) as e:
        raise UsageError(f'{curves_from}: {e}')
    rows = study.run()
    return dict(rows=rows, curves=tc.merged(rows, study.curves(rows), kept_curves))


def _task_write(ctx: Context, tables: Tables) -> List[str]:
    from . import task_study_report as tsr
    o = ctx.options
    kept_from = [osp.dirname(osp.abspath(f)) for f in (o.keep_from, o.det_from) if f]  # their versions.json
    summary = tsr.write_outputs(tables['rows'], osp.abspath(o.out), o.docs or None, root=ctx.runner.root,
                                curves=tables['curves'], kept_from=kept_from)
    return tsr.within_and_extremes(summary)


TASK_STUDY = Declaration(
    name='task-study', axes=('layout', 'task', 'kernel', 'start', 'recipe', 'seed'),
    metrics=('bbox_mAP', 'segm_mAP', 'mIoU'), pairing='seed',
    rule='softfree_mm.analysis.task_study_report (paired by seed), collapse_arms, task_route_rule',
    plan=_task_plan, write=_task_write, tables=('rows', ))


# ---------------------------------------------------------------------------------------------- the warm-start grid
def _warm_plan(ctx: Context) -> Tables:
    from . import warm_start as ws
    o = ctx.options
    plan = ws.Plan(ctx.runner, ctx.root, o.seeds, o.budgets, recipe=o.recipes[0], recipes=o.recipes[1:],
                   scratch_from=o.scratch_from or None, ablation_seeds=o.ablation_seeds, det_from=o.det_from or None,
                   keep_from=o.keep_from or None, backbones=o.backbones, echo=ctx.echo,
                   teachers_only=o.teachers_only)
    return dict(ws.run_grid(plan), plan=plan)


def _warm_write(ctx: Context, tables: Tables) -> List[str]:
    from .warm_start_report import write_outputs
    o = ctx.options
    read_from = [o.keep_from] + [osp.dirname(f) for f in (o.det_from, o.scratch_from) if f]  # their versions.json
    result = {k: v for k, v in tables.items() if k != 'plan'}
    write_outputs(result, osp.abspath(o.out), tables['plan'], o.docs or None, kept_from=[f for f in read_from if f])
    return []


WARM_START_GRID = Declaration(
    name='warm-start', axes=('backbone', 'kernel', 'start', 'recipe', 'iters', 'groups', 'seed'),
    metrics=('top1', ), pairing='seed (and kernel, for a recipe against the default)',
    rule='softfree_mm.analysis.recipe_rule (version 2), carry_over',
    plan=_warm_plan, write=_warm_write, tables=('rows', 'detectors'))

STUDIES = {d.name: d for d in (KERNEL_STUDY, TASK_STUDY, WARM_START_GRID)}

