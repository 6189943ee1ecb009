"""The warm-start study: does a softmax-free backbone started from a trained softmax one reach its from-scratch
accuracy for a fraction of the compute, and does a detector from it do as well? On the kernel study's two backbones
and digits task (docs/study.md), per kernel and seed: ``scratch`` (the study's runs, 300 iterations, read from its
runs.csv; trained again in its recipe where the grid needs the weights), ``swap`` (the
softmax classifier of the same seed with the kernel swapped in: as it is, and fine-tuned), ``transfer`` (stage 1,
:class:`AttentionTransfer` from it, then the same fine-tune), at shares of the from-scratch iterations with the
transfer's counted in them; then the demo's Mask R-CNN from each start. Every run is ``tools/train.py`` /
``tools/test.py`` on a child config in a process of its own; a finished run (its result.json) is not run again.
"""
import dataclasses
import os.path as osp
from typing import Dict, List, Optional, Sequence

from ..engine.warm_start import DEFAULT, RECIPES, SCALES, Recipe, finetune_settings, stage_settings
from ..attention import Kernel
from .grid_runner import RESULT, Runner, kernel_config, top1  # noqa: F401  (the runner both grids take)
from .sweep import safe_name
from .warm_start_keep import Kept, row_key
from .warm_start_rows import SCRATCH_ITERS, read_detectors, transfer_curves


def backbone_of(config: str) -> dict:
    from ..engine.config_checks import read_config
    return read_config(config).model.backbone.to_dict()


# ---------------------------------------------------------------------------------------------- child configs
def _settings_text(settings: dict, skip=('head', 'train', 'loss')) -> str:
    return ''.join(f'{k} = {v!r}\n' for k, v in settings.items() if k not in skip)


def finetune_config(base: str, kernel, iters: int, backbone_start: str, release: str,
                    recipe: Optional[Recipe] = None) -> str:
    """The recipe's stage 2 at the digits scale on the study's classifier with ``kernel``, ``iters`` iterations: the
    backbone from ``backbone_start`` (a classifier's or a stage 1's checkpoint, 'backbone.' keys), the head the
    release's classifier (``recipe.head == 'new'``: its own initialisation)."""
    recipe = recipe or RECIPES[DEFAULT]
    s = finetune_settings(recipe, SCALES['digits'], iters)
    head = ('' if recipe.head == 'new' else
            f"    head=dict(init_cfg=dict(_delete_=True, type='ReleaseHead', checkpoint={release!r})),\n")
    return f"""_base_ = {base!r}
model = dict(
    backbone=dict(attn_cfg={dict(_delete_=True, **kernel)!r},
                  init_cfg=dict(_delete_=True, type='Pretrained', checkpoint={backbone_start!r}, prefix='backbone.')),
{head})
custom_hooks = []
{_settings_text(s)}"""


def transfer_config(base: str, kernel, budget: int, teacher_ckpt: str, recipe: Optional[Recipe] = None,
                    prefix: Optional[str] = 'backbone.') -> str:
    """The recipe's stage 1 at the digits scale on the study's classifier, for a warm start of ``budget`` iterations:
    the teacher its softmax backbone with the softmax run's weights (a classifier's checkpoint: ``prefix``
    'backbone.'; a release: None)."""
    recipe = recipe or RECIPES[DEFAULT]
    s = stage_settings(recipe, SCALES['digits'], budget)['stage1']
    init = dict(type='Pretrained', checkpoint=teacher_ckpt, **({'prefix': prefix} if prefix else {}))
    student = {k: v for k, v in backbone_of(base).items() if k != 'drop_path_rate'}  # the teacher runs in eval mode
    teacher = dict(student, attn_cfg=dict(type='softmax'), init_cfg=init)
    return f"""_base_ = {base!r}
model = dict(type='AttentionTransfer', backbone=dict(attn_cfg={dict(_delete_=True, **kernel)!r}),
             teacher={teacher!r},
             train={s['train']!r}, loss={s['loss']!r})
custom_hooks = []
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = None
test_evaluator = None
test_cfg = None
{_settings_text(s)}"""


def stage1_tag(recipe: Recipe) -> str:
    """What a recipe's stage 1 adds to a run's key beside its groups: nothing for the default's loss and split (the
    runs of the default keep their keys), else its loss and split; recipes whose stage 1 is the same share it."""
    default = RECIPES[DEFAULT]
    if (recipe.loss, recipe.stage1_share) == (default.loss, default.stage1_share):
        return ''
    return f'/{recipe.loss}-{recipe.stage1_share:.2f}'


# ---------------------------------------------------------------------------------------------- the grid
BACKBONES = {  # the kernel study's two backbones, their kernels (a layout's own form of InLine) and its configs
    'xcit': ('configs/demo/study_xcit_t12_digits.py',
             ['poly:degree=3', 'poly:degree=1', 'relu', 'linear', 'inline:local_residual=False']),
    'pvt': ('configs/demo/study_pvt_v2_b0_digits.py', ['poly:degree=3', 'poly:degree=1', 'relu', 'linear', 'inline']),
    # the windowed layout (not a kernel study backbone: its from-scratch rows are the grid's own)
    'swin': ('configs/demo/study_swin_digits.py', ['poly:degree=3', 'poly:degree=1', 'relu', 'linear', 'inline']),
    # the token layout on a schedule twice as long (the carry-over test, docs/warm_start.md): x^3 and a bounded kernel
    'pvt600': ('configs/demo/study_pvt_v2_b0_digits_600.py', ['poly:degree=3', 'linear']),
}
SCRATCH_OF = {'pvt600': 600}  # a backbone's from-scratch iterations where they are not SCRATCH_ITERS
DEFAULT_BACKBONES = ('xcit', 'pvt')  # what the grid runs unless told (--backbones)
GROUP_CHOICES = (('kernel', ), ('kernel', 'qkv'), ('kernel', 'qkv', 'proj'), ('blocks', ))
# the kernels the recipes grid runs every recipe on: token attention's five, channel attention's two
RECIPE_KERNELS = {'pvt': ['poly:degree=3', 'poly:degree=1', 'linear', 'relu', 'inline'],
                  'xcit': ['poly:degree=3', 'linear'],
                  'swin': ['poly:degree=3', 'poly:degree=1', 'linear', 'relu', 'inline'],
                  'pvt600': ['poly:degree=3', 'linear']}
DETECTOR = 'configs/demo/maskrcnn_xcit_t12_poly3_demo.py'


def study_rows(path: str) -> Dict[tuple, dict]:
    """(config, kernel, seed) -> a from-scratch row of the kernel study's runs.csv (docs/results/study), in the
    grid's form (no checkpoint: its runs are read, not repeated)."""
    import csv

    from softfree_mm.engine.errors import UsageError
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    missing = sorted({'config', 'kernel', 'seed', 'status', 'top1_final', 'wall_s', 'cpu_s'}
                     - set(reader.fieldnames or ()))
    if missing:
        raise UsageError(f'--scratch-from {path}: no column {", ".join(missing)} (the kernel study\'s runs.csv)')
    out = {}
    for r in rows:
        top = float(r['top1_final']) if r.get('top1_final') else None
        out[(r['config'], r['kernel'], int(r['seed']))] = dict(
            status=r['status'], error=r.get('error', ''), top1_final=top, wall_s=float(r['wall_s'] or 0) or None,
            cpu_s=float(r['cpu_s'] or 0) or None, source='study', key=f'study/{r["config"]}/{r["kernel"]}/{r["seed"]}')
    return out


class Plan:
    """The grid's runs, in the order their inputs exist: softmax (and scratch) classifiers; swap evaluations,
    fine-tunes from the swap and stage-1 transfers; fine-tunes from the transfers; detectors."""

    def __init__(self, runner: Runner, root: str, seeds: Sequence[int], budgets: Sequence[int] = (30, 75),
                 recipe: str = DEFAULT, recipes: Sequence[str] = (),
                 recipe_kernels: Optional[Dict[str, Sequence[str]]] = None,
                 ablation_kernel: str = 'poly:degree=3', det_kernels: Sequence[str] = ('poly:degree=3', 'linear'),
                 backbones: Optional[Dict[str, tuple]] = None, scratch_from: Optional[str] = None,
                 ablation_seeds: Optional[Sequence[int]] = None, det_from: Optional[str] = None,
                 keep_from: Optional[str] = None, echo=print, teachers_only: bool = False):
        self.r, self.root, self.seeds = runner, root, list(seeds)
        self.teachers_only = teachers_only  # the kernels' from-scratch runs left 'not run' (--teachers-only)
        self.study = study_rows(scratch_from) if scratch_from else {}
        self.ablation_seeds = list(ablation_seeds) if ablation_seeds is not None else self.seeds
        self.budgets = list(budgets)
        self.recipe = RECIPES[recipe]
        # the other recipes measured against it, on the kernels of RECIPE_KERNELS (or recipe_kernels)
        self.recipes = [RECIPES[r] for r in recipes if r != recipe]
        self.recipe_kernels = dict(RECIPE_KERNELS if recipe_kernels is None else recipe_kernels)
        # the kernels parsed once, here (the grid's edge): every run below reads their configs
        self.ablation_kernel, self.det_kernels = Kernel(ablation_kernel), [Kernel(k) for k in det_kernels]
        self.recipe_kernels = {bb: [Kernel(k) for k in ks] for bb, ks in self.recipe_kernels.items()}
        # an earlier grid's detectors.csv (read here: a bad file is refused before any run): its rows are kept, the
        # detectors are not run again
        self.det_rows = read_detectors(det_from) if det_from else None
        self.backbones = {bb: (cfg, [Kernel(k) for k in ks])
                          for bb, (cfg, ks) in (backbones or {b: BACKBONES[b] for b in DEFAULT_BACKBONES}).items()}
        # an earlier grid's finished rows (--keep-from), kept instead of run again; its teachers are checked to be
        # the ones new runs get (softfree_mm/analysis/warm_start_keep.py)
        self.kept = Kept(keep_from) if keep_from else None
        if self.kept is not None and self.det_rows is None and 'xcit' in self.backbones:
            from softfree_mm.engine.errors import UsageError
            raise UsageError(f'--keep-from {keep_from}: give --det-from too (the detectors start from classifier '
                             'checkpoints, which kept rows do not have)')
        self.echo = echo
        self.rows: List[dict] = []

    def base(self, bb: str) -> str:
        return osp.join(self.root, self.backbones[bb][0])

    def transfer_iters(self, budget: int) -> int:
        return self.recipe.stage_iters(budget)[0]

    def needs_checkpoint(self, bb: str, kernel: str) -> bool:
        """The from-scratch runs whose weights the grid uses: the teachers and the detectors' scratch starts."""
        return kernel == 'softmax' or (bb == 'xcit' and kernel in self.det_kernels)

    def from_study(self, bb: str, kernel: str, seed: int) -> Optional[dict]:
        if self.needs_checkpoint(bb, kernel):
            return None
        return self.study.get((osp.splitext(osp.basename(self.backbones[bb][0]))[0], kernel, seed))

    # ---------------------------------------------------------------- the phases
    def scratch(self, bb: str, kernel: str, seed: int) -> dict:
        # a kept row first (softmax's included: teacher() trains it again where a new run needs its weights)
        got = (self.kept.run(row_key(bb, kernel, seed, 'scratch', SCRATCH_OF.get(bb, SCRATCH_ITERS)))
               if self.kept is not None else None)
        if got is not None:
            return got
        got = self.from_study(bb, kernel, seed)
        if got is not None:
            return got
        key = f'scratch/{bb}/{safe_name(kernel)}/seed{seed}'
        if self.teachers_only and not self.needs_checkpoint(bb, kernel):
            return dict(status='not run', error='--teachers-only', key=key)
        return self.r.train(key, kernel_config(self.base(bb), Kernel(kernel).cfg), [f'randomness.seed={seed}'])

    def teacher(self, bb: str, seed: int) -> dict:
        """The softmax classifier of ``seed`` trained (again) for its weights: where its row was kept, the same
        top-1 or a refusal (Kept.check_teacher)."""
        key = f'scratch/{bb}/softmax/seed{seed}'
        run = self.r.train(key, kernel_config(self.base(bb), Kernel('softmax').cfg), [f'randomness.seed={seed}'])
        if self.kept is not None:
            self.kept.check_teacher(bb, seed, run)
        return run

    def swap(self, bb: str, kernel: str, seed: int, softmax: dict) -> dict:
        key = f'swap/{bb}/{safe_name(kernel)}/seed{seed}'
        return self.r.test(key, kernel_config(self.base(bb), Kernel(kernel).cfg), softmax['checkpoint'],
                           [f'randomness.seed={seed}'])

    def finetune(self, key: str, bb: str, kernel: str, seed: int, iters: int, start: str, release: str) -> dict:
        return self.r.train(key, finetune_config(self.base(bb), Kernel(kernel).cfg, iters, start, release,
                                                 self.recipe), [f'randomness.seed={seed}'])

    def transfer(self, bb: str, kernel: str, seed: int, budget: int, groups, softmax: dict,
                 recipe: Optional[Recipe] = None) -> dict:
        recipe = dataclasses.replace(recipe or self.recipe, groups=tuple(groups))
        key = f'transfer/{bb}/{safe_name(kernel)}/{"+".join(groups)}{stage1_tag(recipe)}/{budget}/seed{seed}'
        return self.r.train(key, transfer_config(self.base(bb), Kernel(kernel).cfg, budget, softmax['checkpoint'],
                                                 recipe), [f'randomness.seed={seed}'])

    def transfer_finetune(self, bb, kernel, seed, budget, groups, stage1: dict, softmax: dict,
                          recipe: Optional[Recipe] = None) -> dict:
        recipe = recipe or self.recipe
        tag = stage1_tag(recipe) + ('' if recipe.head == 'release' else f'/head-{recipe.head}')
        key = f'transfer_ft/{bb}/{safe_name(kernel)}/{"+".join(groups)}{tag}/{budget}/seed{seed}'
        if stage1.get('status') == 'not run':  # --report-only
            return dict(status='not run', error='', key=key)
        if stage1.get('status') != 'ok':
            return dict(status='failed', error=f'stage 1 failed: {stage1.get("error")}', key=key)
        return self.r.train(key, finetune_config(self.base(bb), Kernel(kernel).cfg,
                                                 budget - recipe.stage_iters(budget)[0], stage1['checkpoint'],
                                                 softmax['checkpoint'], recipe), [f'randomness.seed={seed}'])

    def detector(self, kernel: str, start_kind: str, seed: int, classifier: dict) -> dict:
        key = f'det/{safe_name(kernel)}/{start_kind}/seed{seed}'
        return self.r.from_classifier(key, kernel_config(osp.join(self.root, DETECTOR), Kernel(kernel).cfg), seed,
                                      classifier)


def _row(run: dict, **fields) -> dict:
    """A classifiers.csv row; ``identity`` (the run's, or a kept row's: identities.csv, not a column) beside it."""
    return dict(fields, source=run.get('source', 'grid'), status=run.get('status'), error=run.get('error', ''),
                top1=top1(run),
                wall_s=run.get('wall_s'), cpu_s=run.get('cpu_s'), key=run.get('key'), identity=run.get('identity'))


def run_grid(plan: Plan) -> dict:
    """Every run of the grid (cached runs are read, not run; --keep-from rows are kept, not run); the rows of the
    classifiers, the detectors and the stage-1 curves, and the groups the ablation chose."""
    r, seeds, bbs = plan.r, plan.seeds, list(plan.backbones)
    large = plan.budgets[-1]
    kept = plan.kept
    # from scratch, in this code and on this machine: softmax (the teacher) and every kernel, the study's recipe
    tasks = [(bb, k, s) for s in seeds for bb in bbs for k in ('softmax', *plan.backbones[bb][1])]
    scratch = dict(zip(tasks, r.map(lambda t: plan.scratch(*t), tasks)))
    softmax = {(bb, s): scratch[(bb, 'softmax', s)] for bb in bbs for s in seeds}
    grid = [(bb, k, s) for s in seeds for bb in bbs for k in plan.backbones[bb][1]
            if softmax[(bb, s)].get('status') == 'ok']
    ft_tasks = [(bb, k, s, b) for bb, k, s in grid for b in plan.budgets]
    # which parameter groups stage 1 trains: compared at the larger budget (the smaller leaves stage 1 too few steps)
    abl = [(bb, plan.ablation_kernel, s, large, g) for bb in bbs for s in plan.ablation_seeds for g in GROUP_CHOICES
           if softmax[(bb, s)].get('status') == 'ok']
    # the runs take the recipe's own groups (its definition: what users run); the comparison is reported, and the
    # groups a variant trains (transfer-blocks) are measured against it by the rule of docs/warm_start.md
    chosen = tuple(plan.recipe.groups)
    main = [(bb, k, s, b, chosen) for bb, k, s in grid for b in plan.budgets]
    main = abl + [t for t in main if t not in abl]
    vts = {rec.name: [(bb, k, s, b, tuple(rec.groups)) for bb, k, s in grid for b in plan.budgets
                      if k in plan.recipe_kernels.get(bb, ())] for rec in plan.recipes}

    def tkey(t, rec=None):  # a warm start's row: what made it
        return row_key(t[0], t[1], t[2], 'transfer', t[3], (rec or plan.recipe).name, '+'.join(t[4]))

    keys = ([row_key(bb, k, s, 'swap', 0) for bb, k, s in grid]
            + [row_key(bb, k, s, 'swap', b) for bb, k, s, b in ft_tasks] + [tkey(t) for t in main]
            + [tkey(t, rec) for rec in plan.recipes for t in vts[rec.name]])
    if kept is not None:  # the teachers of the seeds with runs to make, trained again (and checked) for their weights
        need = sorted({(k[0], k[2]) for k in keys
                       if kept.run(k) is None and not softmax[(k[0], k[2])].get('checkpoint')})
        plan.echo(f'[warm-start] --keep-from: {sum(kept.run(k) is not None for k in keys)} of {len(keys)} runs kept; '
                  f'teachers {"a run would train" if plan.r.report_only else "trained"} again for their weights: '
                  f'{", ".join(f"{b} seed {s}" for b, s in need) or "none"}')
        softmax.update(zip(need, r.map(lambda t: plan.teacher(*t), need)))

    def keep(key, teacher, fn, stage1=False):
        got = (kept.stage1(key) if stage1 else kept.run(key)) if kept is not None else None
        if got is not None:
            return got
        if not teacher.get('checkpoint'):  # a kept teacher not trained again (--report-only)
            st = teacher.get('status')
            return dict(status='not run' if st in ('ok', 'not run') else 'failed', error=teacher.get('error', ''),
                        key='/'.join(map(str, key)))
        return fn()

    # swap: evaluated as it is, and fine-tuned at each budget; the groups ablation's stage 1
    swaps = dict(zip(grid, r.map(lambda t: keep(row_key(*t, 'swap', 0), softmax[(t[0], t[2])],
                                                lambda: plan.swap(*t, softmax[(t[0], t[2])])), grid)))
    swap_ft = dict(zip(ft_tasks, r.map(lambda t: keep(
        row_key(*t[:3], 'swap', t[3]), softmax[(t[0], t[2])], lambda: plan.finetune(
            f'swap_ft/{t[0]}/{safe_name(t[1])}/{t[3]}/seed{t[2]}', t[0], t[1], t[2], t[3],
            softmax[(t[0], t[2])]['checkpoint'], softmax[(t[0], t[2])]['checkpoint'])), ft_tasks)))
    stage1 = dict(zip(main, r.map(lambda t: keep(tkey(t), softmax[(t[0], t[2])],
                                                 lambda: plan.transfer(*t, softmax[(t[0], t[2])]), stage1=True), main)))
    stage2 = dict(zip(main, r.map(lambda t: keep(tkey(t), softmax[(t[0], t[2])], lambda: plan.transfer_finetune(
        *t, stage1[t], softmax[(t[0], t[2])])), main)))
    scores = {}
    for (bb, k, s, b, g), run in stage2.items():
        if (bb, k, s, b, g) in abl and top1(run) is not None:
            scores.setdefault(g, []).append(top1(run))
    plan.echo(f'[warm-start] stage-1 groups: {"+".join(chosen)}, the recipe\'s (mean top-1 after the fine-tune at '
              f'{large} iterations: '
              + ', '.join(f'{"+".join(g)} {sum(v) / len(v):.1f}' for g, v in scores.items()) + ')')
    # the other recipes, each on its kernels at every budget, stage 1 shared where two recipes' are the same
    variants = {}
    for rec in plan.recipes:
        vt = vts[rec.name]
        one = dict(zip(vt, r.map(lambda t: keep(tkey(t, rec), softmax[(t[0], t[2])], lambda: plan.transfer(
            *t, softmax[(t[0], t[2])], recipe=rec), stage1=True), vt)))
        two = dict(zip(vt, r.map(lambda t: keep(tkey(t, rec), softmax[(t[0], t[2])], lambda: plan.transfer_finetune(
            *t, one[t], softmax[(t[0], t[2])], recipe=rec)), vt)))
        variants[rec.name] = (one, two)
    det = []  # the detectors on XCiT from each start (none with --det-from: its rows are kept)
    if plan.det_rows is None and 'xcit' in plan.backbones:
        det = [('softmax', 'softmax', s, softmax[('xcit', s)]) for s in seeds]
        for k in [k for k in plan.det_kernels if k in plan.backbones['xcit'][1]]:
            for s in seeds:
                # a warm start that never began (no softmax classifier) stands for its teacher's status and error
                teacher = softmax[('xcit', s)] if softmax[('xcit', s)].get('status') != 'ok' else {}
                det += [(k, 'scratch', s, scratch[('xcit', k, s)]),
                        (k, 'swap', s, swap_ft.get(('xcit', k, s, large), teacher)),
                        (k, 'transfer', s, stage2.get(('xcit', k, s, large, chosen), teacher))]
    dets = r.map(lambda t: plan.detector(*t), det)

    rows = []
    for (bb, k, s), run in scratch.items():
        rows.append(_row(run, backbone=bb, kernel=k, seed=s, start='scratch', iters=SCRATCH_OF.get(bb, SCRATCH_ITERS),
                         transfer_iters=0, groups=''))
    for (bb, k, s), run in swaps.items():
        rows.append(_row(run, backbone=bb, kernel=k, seed=s, start='swap', iters=0, transfer_iters=0, groups=''))
    for (bb, k, s, b), run in swap_ft.items():
        rows.append(_row(run, backbone=bb, kernel=k, seed=s, start='swap', iters=b, transfer_iters=0, groups=''))
    for name, (one, two) in [(plan.recipe.name, (stage1, stage2)), *variants.items()]:
        rec = RECIPES[name]
        for (bb, k, s, b, g), run in two.items():
            rows.append(_row(run, backbone=bb, kernel=k, seed=s, start='transfer', recipe=name, iters=b,
                             transfer_iters=rec.stage_iters(b)[0], groups='+'.join(g),
                             transfer_loss=one[(bb, k, s, b, g)].get('loss_final'),
                             transfer_s_per_iter=one[(bb, k, s, b, g)].get('s_per_iter'),
                             transfer_wall_s=one[(bb, k, s, b, g)].get('wall_s'),
                             finetune_s_per_iter=run.get('s_per_iter')))
    det_rows = []
    for (k, start, s, cls), run in zip(det, dets):
        m = run.get('metrics', {})
        det_rows.append(dict(kernel=k, start=start, seed=s, start_top1=top1(cls), status=run.get('status'),
                             error=run.get('error', ''), wall_s=run.get('wall_s'),
                             bbox_mAP=m.get('coco/bbox_mAP'), segm_mAP=m.get('coco/segm_mAP'),
                             bbox_mAP_50=m.get('coco/bbox_mAP_50'), segm_mAP_50=m.get('coco/segm_mAP_50'),
                             identity=run.get('identity')))
    if plan.det_rows is not None:
        det_rows = list(plan.det_rows)
    curves = []
    for (bb, k, s, b, g), run in stage1.items():
        for c in (run['curves'] if run.get('kept') else transfer_curves(run)):
            curves.append(dict(c, backbone=bb, kernel=k, seed=s, iters=b, groups='+'.join(g)))
    return dict(rows=rows, detectors=det_rows, curves=curves, groups=chosen, scores=scores)
