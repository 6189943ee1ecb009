"""The warm start as users run it: one recipe definition, the scales it runs at, and the chain from a softmax release
to the main job.

**The recipe** (:class:`Recipe`, :data:`RECIPES`): what stage 1 trains and its loss (:class:`AttentionTransfer`),
the optimiser, the schedule's shape, the share of the budget stage 1 gets, how stage 2 starts (the backbone from
stage 1, the head from the release's classifier) and the learning rates, as multiples of the scale's from-scratch
classifier lr. **The scales** (:class:`Scale`, :data:`SCALES`): what differs between the shipped configs (ImageNet)
and the small-scale grid (digits), the named list :data:`SCALE_DIFFERENCES` and nothing else. The shipped configs take
the recipe through ``configs/_base_/transfer/recipe_<name>.py``, written by :func:`recipe_config_text` (a test checks
the committed files are current); the grid writes its child configs with the same function at the digits scale.

The chain the configs declare is :mod:`softfree_mm.engine.chain`; what of it runs, :mod:`softfree_mm.engine.chain_run`
(``tools/warm_start.py``).
"""
import os.path as osp
import textwrap
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from .errors import UsageError


from .recipes import DEFAULT, RECIPES, Recipe  # noqa: E402,F401  (the recipes: engine/recipes.py)
# the recipe each backbone layout takes, where that was measured and what it costs: layout_defaults.py
from .layout_defaults import LAYOUT_DEFAULTS, default_recipe  # noqa: E402,F401


@dataclass(frozen=True)
class Scale:
    """What differs between the scales the recipe runs at (with the task, the backbone preset and the release,
    which the classification config and the per-backbone set-up give)."""

    name: str
    scratch_lr: float  # the from-scratch classifier's lr at this scale's batch (the lr rule's unit)
    iters: int  # a warm start's iterations, both stages
    batch: int  # images per step, all processes
    checkpoint_every: int  # 0: at the end only
    log_every: int
    val_every: int  # stage 2's validation; 0: at the end only


SCALES: Dict[str, Scale] = {
    # 10 % of the 300-epoch ImageNet recipe: 30 epochs of 1251 iterations at 1024 images (8 GPUs x 128)
    'imagenet': Scale('imagenet', scratch_lr=1e-3, iters=37530, batch=1024, checkpoint_every=2500, log_every=50,
                      val_every=1251),
    # 25 % of the kernel study's 300 iterations at 32 digit crops (the grid also runs 10 %: iters=30)
    'digits': Scale('digits', scratch_lr=1e-3, iters=75, batch=32, checkpoint_every=0, log_every=5, val_every=0),
}
BATCH_RULES = ('linear', 'keep')  # --batch-scale: what a launch of another batch does with the scale's counts


def at_batch(scale: Scale, batch: int, rule: str) -> Scale:
    """``scale`` run at ``batch`` images a step: 'linear' scales the lr by batch / scale.batch and the iterations (and
    what is counted in them) by its inverse, so the run sees as many images; 'keep' keeps the lr and iterations."""
    if rule not in BATCH_RULES:
        raise UsageError(f'--batch-scale {rule!r}: known rules are {", ".join(BATCH_RULES)}')
    if rule == 'keep' or batch == scale.batch:
        return replace(scale, batch=batch)
    f = scale.batch / batch
    count = lambda n: max(1, round(n * f)) if n else 0  # noqa: E731
    return replace(scale, scratch_lr=scale.scratch_lr / f, iters=count(scale.iters), batch=batch,
                   checkpoint_every=count(scale.checkpoint_every), val_every=count(scale.val_every))


# What may differ between a grid config and the shipped config of the same backbone x kernel, by what it is (the keys
# a run reads; fnmatch patterns): everything else, the recipe, is the same at both scales.
SCALE_DIFFERENCES = {
    'the task: data, pipelines, classes, the classifier config\'s own training options': (
        'train_dataloader.*', 'val_dataloader.*', 'test_dataloader.*', 'val_evaluator.*', 'test_evaluator.*',
        'data_preprocessor.*', 'model.data_preprocessor.*', 'model.head.num_classes', 'model.head.topk',
        'model.train_cfg*', 'model.backbone.drop_path_rate', 'custom_hooks'),
    'the backbone preset (the grid\'s PVTv2 is the kernel study\'s, without spatial reduction)': (
        'model.backbone.arch', 'model.teacher.arch', 'model.head.in_channels', 'model.backbone.sr_ratios',
        'model.teacher.sr_ratios'),
    'the release (its file and layout) and the runs\' paths': (
        'model.teacher.init_cfg.checkpoint', 'model.teacher.init_cfg.prefix', 'model.head.init_cfg.checkpoint',
        'model.backbone.init_cfg.checkpoint', 'work_dir', 'load_from', 'resume', 'randomness.*'),
    'the batch': ('train_dataloader.batch_size', 'auto_scale_lr.base_batch_size'),
    'the iterations and what is counted in them': (
        'train_cfg.max_iters', 'train_cfg.val_interval', 'param_scheduler.*.begin', 'param_scheduler.*.end',
        'default_hooks.checkpoint.interval', 'default_hooks.logger.*', 'log_processor.*'),
    'the learning rates (multiples of the scale\'s from-scratch lr)': (
        'optim_wrapper.optimizer.lr', 'param_scheduler.*.eta_min'),
}
# the keys a run reads (the others are a config's own variables)
RUN_KEYS = ('model', 'train_cfg', 'val_cfg', 'test_cfg', 'optim_wrapper', 'param_scheduler', 'default_hooks',
            'custom_hooks', 'log_processor', 'train_dataloader', 'val_dataloader', 'test_dataloader', 'val_evaluator',
            'test_evaluator', 'data_preprocessor', 'randomness', 'auto_scale_lr', 'load_from', 'resume', 'work_dir')


def _schedule(floor: float, iters: int, recipe: Recipe) -> List[dict]:
    warm = max(1, round(iters * recipe.warmup))
    return [dict(type='LinearLR', start_factor=recipe.warmup_start, by_epoch=False, begin=0, end=warm),
            dict(type='CosineAnnealingLR', eta_min=floor, by_epoch=False, begin=warm, end=iters)]


def _hooks(scale: Scale, n: int) -> dict:
    return dict(checkpoint=dict(by_epoch=False, interval=scale.checkpoint_every or n, max_keep_ckpts=2),
                logger=dict(interval=scale.log_every))


def finetune_settings(recipe: Recipe, scale: Scale, n: int) -> dict:
    """The config keys of a supervised fine-tune of ``n`` iterations in the recipe's stage 2 (also what the grid's
    swap start runs: the release with the kernel swapped in, fine-tuned the same way)."""
    lr, floor = recipe.stage2_lr * scale.scratch_lr, recipe.floor * scale.scratch_lr
    return dict(
        head=recipe.head,
        train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=n, val_interval=scale.val_every or n),
        optim_wrapper=dict(optimizer=dict(lr=lr)),
        param_scheduler=_schedule(floor, n, recipe),
        default_hooks=_hooks(scale, n),
        log_processor=dict(by_epoch=False))


def stage_settings(recipe: Recipe, scale: Scale, total: Optional[int] = None) -> Dict[str, dict]:
    """The config keys of stage 1 and stage 2 (``{'stage1': {...}, 'stage2': {...}}``) at ``scale`` for a warm start
    of ``total`` iterations (default: the scale's)."""
    n1, n2 = recipe.stage_iters(total or scale.iters)
    lr1, floor = recipe.stage1_lr * scale.scratch_lr, recipe.floor * scale.scratch_lr
    hooks = lambda n: _hooks(scale, n)  # noqa: E731
    stage1 = dict(
        train=list(recipe.groups),
        loss=recipe.loss,
        train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=n1),
        optim_wrapper=dict(_delete_=True, type='OptimWrapper', optimizer=dict(recipe.stage1_optimizer, lr=lr1),
                           clip_grad=dict(max_norm=recipe.stage1_clip)),
        param_scheduler=_schedule(floor, n1, recipe),
        default_hooks=hooks(n1),
        log_processor=dict(by_epoch=False))
    return dict(stage1=stage1, stage2=finetune_settings(recipe, scale, n2))


def recipe_options(recipe: Recipe, scale: Scale, total: Optional[int] = None) -> Dict[str, List[str]]:
    """--cfg-options that make a stage config of another recipe (at ``scale``, ``total`` iterations) run ``recipe``:
    what stage 1 trains and its loss, the split, the learning rates and schedules, stage 2's head."""
    out = length_options(recipe, scale, total or scale.iters)
    s = stage_settings(recipe, scale, total)
    lr1 = s['stage1']['optim_wrapper']['optimizer']['lr']
    out['stage1'] += [f"model.train={list(recipe.groups)!r}".replace(' ', ''), f'model.loss={recipe.loss}',
                      f'optim_wrapper.optimizer.lr={lr1}',
                      f"param_scheduler.1.eta_min={s['stage1']['param_scheduler'][1]['eta_min']}"]
    out['stage2'] += [f"optim_wrapper.optimizer.lr={s['stage2']['optim_wrapper']['optimizer']['lr']}",
                      f"param_scheduler.1.eta_min={s['stage2']['param_scheduler'][1]['eta_min']}"]
    if recipe.head == 'new':
        out['stage2'].append('model.head.init_cfg=None')
    return out


def length_options(recipe: Recipe, scale: Scale, total: int) -> Dict[str, List[str]]:
    """--cfg-options of each stage for a warm start of ``total`` iterations in all (the recipe's share and schedule
    shape at that length): {'stage1': [...], 'stage2': [...]}."""
    s = stage_settings(recipe, scale, total)
    out = {}
    for stage in ('stage1', 'stage2'):
        n = s[stage]['train_cfg']['max_iters']
        warm, cos = s[stage]['param_scheduler']
        out[stage] = [f'train_cfg.max_iters={n}', f'param_scheduler.0.end={warm["end"]}',
                      f'param_scheduler.1.begin={cos["begin"]}', f'param_scheduler.1.end={n}',
                      f'default_hooks.checkpoint.interval={scale.checkpoint_every or n}']
        if stage == 'stage2':
            out[stage].append(f'train_cfg.val_interval={scale.val_every or n}')
    return out


def recipe_config_text(recipe: Recipe, scale: Scale) -> str:
    """The base config the shipped stage configs take (``configs/_base_/transfer/recipe_<name>.py``)."""
    s = stage_settings(recipe, scale)
    n1, n2 = s['stage1']['train_cfg']['max_iters'], s['stage2']['train_cfg']['max_iters']
    lines = [
        f'# The warm-start recipe {recipe.name!r} at the {scale.name} scale:',
        *textwrap.wrap(recipe.description + '.', 116, initial_indent='# ', subsequent_indent='# '),
        '# Written by `python tools/warm_start.py --write-recipe-configs` from softfree_mm/engine/warm_start.py (the one',
        '# definition the small-scale grid takes too); do not edit: tests/tools/test_warm_start_chain.py checks it.',
        f'# {scale.iters} iterations of {scale.batch} images in all: stage 1 {n1}, stage 2 {n2}; learning rates '
        f'{recipe.stage1_lr:g}x and {recipe.stage2_lr:g}x',
        f'# the from-scratch classifier\'s ({scale.scratch_lr:g}), cosine to {recipe.floor:g}x, each after a linear '
        f'warm-up over {recipe.warmup:.0%} of its stage.',
        f'warm_start = {dict(recipe=recipe.name, scale=scale.name)!r}',
    ]
    for stage, prefix in (('stage1', 'stage1'), ('stage2', 'finetune')):
        for key, value in s[stage].items():
            lines.append(f'{prefix}_{key} = {value!r}')
    return '\n'.join(lines) + '\n'


def recipe_config_path(root: str, name: str = DEFAULT, scale: str = 'imagenet') -> str:
    """configs/_base_/transfer/recipe_<name>.py (ImageNet) or recipe_<name>_<scale>.py."""
    suffix = '' if scale == 'imagenet' else f'_{scale}'
    return osp.join(root, 'configs', '_base_', 'transfer', f'recipe_{name}{suffix}.py')


def write_recipe_configs(root: str) -> List[str]:
    """Every recipe at every scale, as the base configs the stage configs take."""
    out = []
    for name, recipe in RECIPES.items():
        for scale in SCALES:
            path = recipe_config_path(root, name, scale)
            with open(path, 'w') as f:
                f.write(recipe_config_text(recipe, SCALES[scale]))
            out.append(path)
    return out
