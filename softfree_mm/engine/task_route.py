"""The task route of the warm start (``tools/warm_start.py CONFIG --from-task CHECKPOINT``): a trained softmax
detector or segmentor made softmax-free on its own training images, without ImageNet.

CONFIG is the kernel's det / seg config; CHECKPOINT the same model trained with softmax (ours, or mmdet's / mmseg's
Swin: our family's converter reads its backbone on load, as ``tools/convert_checkpoint.py --whole`` does). :func:`plan`
writes two stage configs into ``WORK_ROOT/task_route/`` (children of CONFIG, as the studies write theirs) and hands
them to the ImageNet route's machinery (:mod:`chain_run`: probe and resume, run identities, the refusal of another
run's work dir, the launchers and ``--submit``):

- stage 1, ``transfer_task_<name>``: :class:`AttentionTransfer` of the backbone's blocks on CONFIG's training set
  and pipeline (the task's resolution; labels are not read). Teacher: CONFIG's backbone with softmax, loaded from
  CHECKPOINT's ``backbone.*`` (a file in another layout with that layout's padding rule, so that the teacher computes
  the trained model's function); student: CONFIG's backbone with its kernel, started from the same weights.
- stage 2, ``finetune_task_<name>``: CONFIG's whole model fine-tuned on its task: the backbone from stage 1, every other
  part (neck, heads) from CHECKPOINT.

The recipe is the ImageNet route's (:mod:`recipes`): what stage 1 trains and its loss, the split of the budget, the
schedules, the learning rates as multiples of CONFIG's own lr. The budget: :data:`TASK_SHARE` of the images CONFIG's
schedule sees (``--iters`` N: N iterations instead), counted at CONFIG's batch (``auto_scale_lr.base_batch_size``);
a launch of another batch takes ``--batch-scale linear|keep`` as on the ImageNet route.
"""
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import chain_identity
from . import warm_start as ws
from .chain import Stage, load_config, plain, task_of
from .chain_run import Plan, Request, run_config
from .errors import UsageError, short_error

TASK_SHARE = 0.25  # both stages' images, as a share of CONFIG's schedule's (the recipe splits it: 1/3 and 2/3)
FOLDER = 'task_route'  # WORK_ROOT/task_route/: the stage configs
CHECKPOINTS = 15  # checkpoints over a long warm start (the ImageNet scale's: every 2500 of 37530 iterations)
_NOT_PARTS = ('backbone', 'data_preprocessor', 'train_cfg', 'test_cfg', 'init_cfg', 'type')


@dataclass
class TaskPlan(Plan):
    """A plan of the task route: what the dry run says of it besides the runs."""

    checkpoint: str = ''
    recipe_name: str = ''
    budget: str = ''  # where the warm start's length comes from
    notes: List[str] = field(default_factory=list)
    route: str = 'task'


def parts(model: dict) -> List[str]:
    """The model's parts besides its backbone (neck, rpn_head, roi_head, decode_head, auxiliary_head): what stage 2
    reads from the checkpoint."""
    def is_part(v):
        return (isinstance(v, dict) and 'type' in v) or (isinstance(v, list) and v and
                                                         all(isinstance(x, dict) for x in v))
    return [k for k, v in model.items() if k not in _NOT_PARTS and is_part(v)]


def read_task_checkpoint(checkpoint: str, model: dict, config: str) -> Dict:
    """CHECKPOINT's state dict; one line when it is missing, unreadable, or holds no weights of one of the model's
    parts (a classifier, another model)."""
    from softfree_mm.models.converters import read_checkpoint, unwrap_state_dict
    where = f'--from-task {checkpoint}'
    if not osp.isfile(checkpoint):
        raise UsageError(f'{where}: no such file (the trained softmax model of {osp.basename(config)})')
    try:
        sd = unwrap_state_dict(read_checkpoint(checkpoint), backbone_only=False)
    except Exception as e:  # noqa: BLE001  (not torch's, not weights only, no state dict)
        raise UsageError(f'{where}: not a weights-only torch checkpoint ({short_error(e, 200)})') from None
    wanted = ['backbone', *parts(model)]
    missing = [p for p in wanted if not any(k.startswith(p + '.') for k in sd)]
    if missing:
        held = sorted({k.split('.')[0] for k in sd})
        raise UsageError(f'{where}: holds no {", ".join(p + ".*" for p in missing)} weights: it is not a trained '
                         f'{model.get("type")} of {osp.basename(config)} (its parts: {", ".join(wanted)}; the '
                         f'file\'s: {", ".join(held[:8])})')
    return sd


def teacher_of(backbone: dict, checkpoint: str, sd: Dict) -> Tuple[dict, List[str]]:
    """(stage 1's teacher: CONFIG's backbone with softmax, loaded from CHECKPOINT's backbone.*, notes). A file in
    another layout than ours (mmdet's, mmseg's, the official downstream code's) was trained with that layout's padding
    rule: the teacher takes it, and a student without it is named in a note."""
    from softfree_mm.models.converters import checkpoint_class, detect_family
    from softfree_mm.models.family import FAMILIES
    teacher = {k: v for k, v in backbone.items() if k not in ('attn_cfg', 'init_cfg')}
    teacher.update(attn_cfg=dict(type='softmax'),
                   init_cfg=dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.'))
    own = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    cls = FAMILIES.get(str(backbone.get('type')).split('.')[-1])
    if cls is None:
        raise UsageError(f"--from-task {checkpoint}: the config's backbone {backbone.get('type')!r} is none of the "
                         f'package\'s ({", ".join(FAMILIES)}): attention transfer works on their blocks')
    if cls._convert is None or set(cls._convert(own)) == set(own):
        return teacher, []
    kind = detect_family(own)[0]
    rule = checkpoint_class(kind).family.downstream_padding.get(kind, {})
    teacher.update(rule)
    differ = {k: backbone.get(k) for k, v in rule.items() if backbone.get(k) != v}
    notes = [f'{osp.basename(checkpoint)} is a {kind} file of another layout (converted on load), trained with the '
             f'padding rule {rule}: the teacher takes it; the student has {differ} (set model.backbone '
             f'{", ".join(f"{k}={v!r}" for k, v in rule.items())} to keep it)'] if differ else []
    return teacher, notes


def check_teacher(teacher: dict, checkpoint: str) -> None:
    """CHECKPOINT's backbone against the teacher, before any run: another architecture (depths, widths, heads) or
    another family (most of the teacher's weights not placed) is one line."""
    from mmengine.registry import DefaultScope

    from softfree_mm.models.converters import check_arch, placement, read_pretrained

    from ..registry import MODELS
    with DefaultScope.overwrite_default_scope('softfree_mm'):
        m = MODELS.build({k: v for k, v in teacher.items() if k != 'init_cfg'})
    try:
        sd = read_pretrained(m, checkpoint, type(m)._convert, 'backbone.')
        check_arch(m, sd, checkpoint)
    except Exception as e:  # noqa: BLE001  (another architecture, an unreadable file)
        raise UsageError(f'--from-task {checkpoint}: {short_error(e)}') from None
    missing, _, mismatched = placement(m, sd)
    own, lost = len(m.state_dict()), len(missing) + len(mismatched)
    if 2 * lost > own:
        raise UsageError(f'--from-task {checkpoint}: its backbone is no {teacher["type"]}: {own - lost} of the '
                         f'teacher\'s {own} weights placed (e.g. missing {missing[:3]})')


def training_set_size(cfg, config: str) -> int:
    """Images in CONFIG's training set (its dataset built as the run builds it)."""
    import contextlib
    import importlib
    import io

    from mmengine.registry import DATASETS, DefaultScope
    scope = cfg.get('default_scope') or 'mmdet'
    try:
        importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
        with DefaultScope.overwrite_default_scope(scope), contextlib.redirect_stdout(io.StringIO()):  # pycocotools
            return len(DATASETS.build(plain(cfg.train_dataloader.dataset)))
    except Exception as e:  # noqa: BLE001  (no data here, another format: the length is then the user's)
        raise UsageError(f"{config}: its schedule is in epochs and its training set cannot be read to count its "
                         f"images ({short_error(e, 200)}): give the warm start's length, --iters N") from None


def task_scale(cfg, config: str, request: Request) -> Tuple[ws.Scale, str]:
    """The recipe's scale on CONFIG's task: its lr, its batch (auto_scale_lr.base_batch_size, else stage 1's launch),
    the warm start's iterations (TASK_SHARE of its schedule's images, or --iters); and where the length comes from."""
    per_gpu = int(cfg.train_dataloader.batch_size)
    base = int((cfg.get('auto_scale_lr') or {}).get('base_batch_size') or 0) or request.world_size('stage1') * per_gpu
    if request.iters:
        total, how = request.iters, f'--iters {request.iters} at {base} images a step'
    else:
        loop = cfg.get('train_cfg') or {}
        if loop.get('max_iters'):
            images, sched = int(loop['max_iters']) * base, f'{loop["max_iters"]} iterations x {base} images'
        elif loop.get('max_epochs'):
            size = training_set_size(cfg, config)
            images, sched = int(loop['max_epochs']) * size, f'{loop["max_epochs"]} epochs x {size} images'
        else:
            raise UsageError(f"{config}: train_cfg names neither max_iters nor max_epochs: give the warm start's "
                             'length, --iters N')
        total = max(2, round(TASK_SHARE * images / base))
        how = f'{TASK_SHARE:.0%} of its schedule\'s {images:,} images ({sched}) at {base} a step'
    logger = (cfg.get('default_hooks') or {}).get('logger') or {}
    scale = ws.Scale('task', scratch_lr=float(cfg.optim_wrapper.optimizer.lr), iters=total, batch=base,
                     checkpoint_every=total // CHECKPOINTS if total >= 10 * CHECKPOINTS else 0,
                     log_every=int(logger.get('interval') or 50), val_every=0)
    return scale, how


def stage_settings(recipe: ws.Recipe, scale: ws.Scale, request: Request, per_gpu: int, names) -> Dict[str, dict]:
    """Each stage's keys at its launch's batch: the scale's, or another one by --batch-scale (one line otherwise)."""
    out = {}
    for role, name in zip(('stage1', 'stage2'), names):
        world = request.world_size(role)
        batch = world * per_gpu
        if batch != scale.batch and request.batch_scale is None:
            raise UsageError(f'{name} would run {world} x {per_gpu} = {batch} images a step, its config counts its '
                             f'lr and schedule for {scale.batch} (auto_scale_lr.base_batch_size): launch processes x '
                             f'batch = {scale.batch}, or choose --batch-scale linear (lr x {batch}/{scale.batch}, '
                             f'iterations x {scale.batch}/{batch}) or --batch-scale keep')
        at = ws.at_batch(scale, batch, request.batch_scale or 'keep')
        out[role] = ws.stage_settings(recipe, at)[role]
    return out


def _write(path: str, config: str, values: Dict) -> str:
    """A child config of ``config`` setting ``values``; the file is rewritten only when its text changes."""
    text = '\n'.join([f'# The task route\'s stage of {osp.basename(config)}: written by tools/warm_start.py '
                      '--from-task (softfree_mm/engine/task_route.py) on each run; edits are lost.',
                      f'_base_ = {osp.abspath(config)!r}', *(f'{k} = {v!r}' for k, v in values.items())]) + '\n'
    old = open(path).read() if osp.isfile(path) else None
    if old != text:
        os.makedirs(osp.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
    return path


def _init(part: dict, checkpoint: str, prefix: str) -> dict:
    """``part``'s init_cfg replaced by a Pretrained of ``prefix`` (``_delete_`` only where the config sets one, a
    dict or None: mmengine keeps the marker where the key is absent)."""
    init = dict(type='Pretrained', checkpoint=checkpoint, prefix=prefix)
    return dict(init, _delete_=True) if 'init_cfg' in part else init


def _from_checkpoint(name: str, part, checkpoint: str):
    """A model part loaded from CHECKPOINT's ``name.*``; a list of parts (it replaces the config's whole list) each
    from ``name.<i>.*``."""
    if isinstance(part, list):
        return [dict(p, init_cfg=dict(type='Pretrained', checkpoint=checkpoint, prefix=f'{name}.{i}.'))
                for i, p in enumerate(part)]
    return dict(init_cfg=_init(part, checkpoint, f'{name}.'))


def stage_configs(config: str, cfg, checkpoint: str, teacher: dict, recipe: ws.Recipe, s: Dict[str, dict],
                  folder: str, names, stage1_dir: str) -> Tuple[str, str]:
    """The two stage configs, written into ``folder``."""
    model = plain(cfg.model)
    declared = dict(warm_start=dict(recipe=recipe.name, scale='task', route='task'))
    keys = lambda role: {k: v for k, v in s[role].items() if k not in ('train', 'loss', 'head')}  # noqa: E731
    student = dict(model['backbone'], init_cfg=dict(type='Scratch'))  # AttentionTransfer gives it the teacher's weights
    stage1 = dict(declared, model=dict(_delete_=True, type='AttentionTransfer', backbone=student, teacher=teacher,
                                       train=list(recipe.groups), loss=recipe.loss,
                                       data_preprocessor=model.get('data_preprocessor')),
                  **keys('stage1'), val_dataloader=None, val_evaluator=None, val_cfg=None, test_dataloader=None,
                  test_evaluator=None, test_cfg=None)
    start = _init(model['backbone'], stage1_dir, 'backbone.')
    heads = {} if recipe.head == 'new' else {p: _from_checkpoint(p, model[p], checkpoint) for p in parts(model)}
    stage2 = dict(declared, model=dict(backbone=dict(init_cfg=start), **heads), **keys('stage2'))
    return (_write(osp.join(folder, names[0] + '.py'), config, stage1),
            _write(osp.join(folder, names[1] + '.py'), config, stage2))


def plan(request: Request, root: str, checkpoint: str) -> TaskPlan:
    """The task route's two runs with their configs (written into WORK_ROOT/task_route/) and records; every bad input
    is one line before any run."""
    from .layout_defaults import default_recipe
    config = request.config
    if request.release:
        raise UsageError(f'--release {request.release}: the ImageNet route\'s start; the task route starts from '
                         f'--from-task {checkpoint}')
    if request.options.get('main'):
        raise UsageError('--cfg-options: the task route runs no main job (stage 2 is the fine-tuned model): give '
                         '--stage2-options')
    if request.recipe is not None and request.recipe not in ws.RECIPES:
        raise UsageError(f'--recipe {request.recipe!r} is no recipe; known: {", ".join(ws.RECIPES)}')
    cfg = load_config(config)
    task = task_of(cfg)
    if task not in ('det', 'seg'):
        raise UsageError(f'--from-task {checkpoint}: {config} is a {task or cfg.model.get("type")} config; the task '
                         'route starts from a detection or segmentation config and its trained softmax model (a '
                         'classifier takes the ImageNet route: no --from-task)')
    model = plain(cfg.model)
    sd = read_task_checkpoint(checkpoint, model, config)
    checkpoint = osp.abspath(checkpoint)  # the stage configs and every run read it from wherever they start
    teacher, notes = teacher_of(model['backbone'], checkpoint, sd)
    del sd
    check_teacher(teacher, checkpoint)
    recipe = ws.RECIPES[request.recipe or default_recipe(model['backbone'])]
    scale, how = task_scale(cfg, config, request)
    name = osp.splitext(osp.basename(config))[0]
    names = (f'transfer_task_{name}', f'finetune_task_{name}')
    dirs = [osp.join(request.work_root, n) for n in names]
    s = stage_settings(recipe, scale, request, int(cfg.train_dataloader.batch_size), names)
    paths = stage_configs(config, cfg, checkpoint, teacher, recipe, s, osp.join(request.work_root, FOLDER), names,
                          dirs[0])
    opts = request.options
    runs = [Stage(names[0], paths[0], dirs[0], checkpoint, 'model.teacher.init_cfg.checkpoint',
                  list(opts.get('stage1', ())), 'stage1'),
            Stage(names[1], paths[1], dirs[1], dirs[0], 'model.backbone.init_cfg.checkpoint',
                  list(opts.get('stage2', ())), 'stage2')]
    cfgs = [run_config(r) for r in runs]
    records = chain_identity.records(runs, cfgs, request)
    return TaskPlan(request, root, runs, cfgs, records, checkpoint, checkpoint=checkpoint, recipe_name=recipe.name,
                    budget=how, notes=notes)
