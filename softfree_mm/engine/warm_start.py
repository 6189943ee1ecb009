"""The warm start as users run it: one recipe definition, the scales it runs at, and the chain from a softmax release
to the main job.

**The recipe** (:class:`Recipe`, :data:`RECIPES`): what stage 1 trains and its loss (:class:`AttentionTransfer`),
the optimiser, the schedule's shape, the share of the budget stage 1 gets, how stage 2 starts (the backbone from
stage 1, the head from the release's classifier) and the learning rates, as multiples of the scale's from-scratch
classifier lr. **The scales** (:class:`Scale`, :data:`SCALES`): what differs between the shipped configs (ImageNet)
and the small-scale grid (digits), the named list :data:`SCALE_DIFFERENCES` and nothing else. The shipped configs take
the recipe through ``configs/_base_/transfer/recipe_<name>.py``, written by :func:`recipe_config_text` (a test checks
the committed files are current); the grid writes its child configs with the same function at the digits scale.

**The chain** (:func:`chain`): a det / seg / cls config of a kernel without a release starts its backbone from a
stage's work dir (``init_cfg.checkpoint='work_dirs/finetune_<pair>'``: its last checkpoint); that stage's config is
the config of that name beside it, whose own start names the stage before; stage 1 starts from the release. The
configs declare the chain; ``tools/warm_start.py`` reads it.
"""
import os
import os.path as osp
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import UsageError


@dataclass(frozen=True)
class Recipe:
    """One warm-start recipe. Learning rates are multiples of the scale's from-scratch classifier lr."""

    name: str
    description: str
    groups: Tuple[str, ...] = ('kernel', 'qkv')  # what stage 1 trains (AttentionTransfer's ``train``)
    loss: str = 'blocks'  # AttentionTransfer's ``loss``: 'blocks', 'blocks+final', 'blocks+attn'
    stage1_share: float = 1 / 3  # of the warm start's iterations
    stage1_lr: float = 3.0
    stage2_lr: float = 0.1
    floor: float = 0.01  # where each stage's cosine ends
    warmup: float = 0.1  # each stage's linear warm-up, a share of its iterations, from warmup_start x the peak
    warmup_start: float = 0.01
    stage1_optimizer: Dict = field(default_factory=lambda: dict(type='AdamW', weight_decay=0.0, eps=1e-8,
                                                                betas=(0.9, 0.999)))
    stage1_clip: float = 5.0
    head: str = 'release'  # stage 2's head: the release's classifier ('release') or a new one ('new')

    def stage_iters(self, total: int) -> Tuple[int, int]:
        """(stage 1, stage 2) iterations of a warm start of ``total``."""
        first = max(1, round(total * self.stage1_share))
        if total - first < 1:
            raise UsageError(f'a warm start of {total} iterations leaves stage 2 none (stage 1: {first})')
        return first, total - first


RECIPES: Dict[str, Recipe] = {
    'transfer': Recipe('transfer', 'attention transfer of q, k, v and the kernel\'s own parameters, block by block '
                                   '(a third of the budget), then a fine-tune with the release\'s head'),
    # the variants the recipes grid measures against it (docs/warm_start.md): each one change
    'transfer-half': Recipe('transfer-half', 'the default with half of the budget in stage 1 instead of a third',
                            stage1_share=0.5),
    'transfer-final': Recipe('transfer-final', 'the default with final-feature distillation added to stage 1: the '
                                               'student\'s own end-to-end output against the teacher\'s',
                             loss='blocks+final'),
    'transfer-attn': Recipe('transfer-attn', 'the default with attention-weight matching added to stage 1 (64 '
                                             'sampled query rows per head; kernels with a score map only)',
                            loss='blocks+attn'),
    'transfer-blocks': Recipe('transfer-blocks', 'the default with whole blocks trained in stage 1 (attention, '
                                                 'MLP and norms) instead of q, k, v and the kernel', groups=('blocks', )),
    'transfer-newhead': Recipe('transfer-newhead', 'the default with a new head in stage 2 instead of the '
                                                   'release\'s', head='new'),
}
DEFAULT = 'transfer'  # the recipe the others are measured against (the rule's current default)
# The recipe each backbone layout's shipped configs take (its family's ``Family.mixes``), chosen by the rule of
# docs/warm_start.md on the recipes grid: final-feature distillation gains in token attention (PVTv2-b0) and nothing in
# channel attention (XCiT-T12); Swin-T and CSWin-T take token attention's.
LAYOUT_DEFAULTS: Dict[str, str] = {'tokens': 'transfer-final', 'channels': 'transfer'}


def default_recipe(backbone_type: str) -> str:
    """The name of the recipe a backbone family's warm start takes by default (its layout's)."""
    import softfree_mm.models  # noqa: F401  (declares the families)
    from softfree_mm.models.family import FAMILIES
    name = backbone_type.split('.')[-1]
    if name not in FAMILIES:
        raise UsageError(f'no backbone family {backbone_type!r}; known: {", ".join(FAMILIES)}')
    return LAYOUT_DEFAULTS[FAMILIES[name].family.mixes]


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


def _schedule(peak: float, floor: float, iters: int, recipe: Recipe) -> List[dict]:
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
        param_scheduler=_schedule(lr, floor, n, recipe),
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
        param_scheduler=_schedule(lr1, floor, n1, recipe),
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


# ---------------------------------------------------------------------------------------------- the chain
@dataclass
class Stage:
    """One run of the chain: its config, its work dir, the start it reads (the previous stage's work dir, or the
    release) and the option that points it there."""

    name: str
    config: str
    work_dir: str
    reads: str
    read_key: str
    options: List[str] = field(default_factory=list)
    kind: str = 'stage'  # 'stage' (stage 1 or 2) or 'main'

    def as_dict(self):
        return asdict(self)


TASKS = {'ImageClassifier': 'cls', 'EncoderDecoder': 'seg', 'CascadeEncoderDecoder': 'seg'}


def task_of(cfg) -> Optional[str]:
    """'cls', 'seg' or 'det' from the model's type (mmdet's detectors are every other type of its registry);
    None for anything else (stage 1's AttentionTransfer, a model of no task)."""
    model_type = str(cfg.model.get('type', '')).split('.')[-1]
    if model_type in TASKS:
        return TASKS[model_type]
    if model_type == 'AttentionTransfer':
        return None
    try:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
        register_all_modules(init_default_scope=False)
        if MODELS.get(model_type) is not None:
            return 'det'
    except ImportError:
        pass
    return None


def _start(cfg) -> Tuple[Optional[str], Optional[str]]:
    """(init_cfg.checkpoint of the backbone, and of the teacher for a stage-1 config)."""
    init = cfg.model.get('backbone', {}).get('init_cfg') or {}
    teacher = (cfg.model.get('teacher') or {}).get('init_cfg') or {}
    return (init.get('checkpoint') if init.get('type') == 'Pretrained' else None,
            teacher.get('checkpoint') if teacher.get('type') == 'Pretrained' else None)


def _stage_config(reference: str, config_dir: str, root: str) -> Optional[str]:
    """The config a start names by its work dir ('work_dirs/finetune_xcit_s12_poly3' -> finetune_xcit_s12_poly3.py
    beside the config, else under the repository's configs/), or None when the start is a file or a URL."""
    if not isinstance(reference, str) or '://' in reference or reference.endswith('.pth'):
        return None
    name = osp.basename(osp.normpath(reference))
    for folder in (config_dir, osp.join(root, 'configs'), osp.join(root, 'configs', 'demo')):
        path = osp.join(folder, name + '.py')
        if osp.isfile(path):
            return path
    return None


def chain(config: str, work_root: str = 'work_dirs', root: Optional[str] = None,
          options: Optional[Dict[str, Sequence[str]]] = None) -> List[Stage]:
    """The runs from the release to ``config``: stage 1, stage 2, then the config itself (for a classification config,
    its warm start's stage 2 is the classifier: the chain ends there). Each run's work dir is ``work_root/<config
    name>``; each reads the previous one's (``--cfg-options <its start key>=<that work dir>``). ``options``: extra
    --cfg-options per run ('stage1', 'stage2', 'main'). Bad input is a UsageError naming it."""
    from mmengine.config import Config
    root = root or osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    options = options or {}
    if not osp.isfile(config):
        raise UsageError(f'{config}: no such config file')
    cfg = Config.fromfile(config)
    task = task_of(cfg)
    if task is None:
        raise UsageError(f'{config}: a {cfg.model.get("type")} config; the warm start runs before a detection, '
                         'segmentation or classification config (det / seg / cls)')
    name = osp.splitext(osp.basename(config))[0]
    runs = []
    start, _ = _start(cfg)
    stage_cfg = _stage_config(start, osp.dirname(config), root) if start else None
    if task == 'cls' and stage_cfg is None:
        # a classifier from scratch: its warm start is the fine-tune config of the same pair
        pair = name[len('cls_'):] if name.startswith('cls_') else None
        candidate = pair and _stage_config(f'finetune_{pair}', osp.dirname(config), root)
        if not candidate:
            raise UsageError(f'{config}: no warm start leads to this classifier (no finetune_{pair or name}.py beside '
                             'it or under configs/); train it with tools/train.py')
        return chain(candidate, work_root, root, options)
    if stage_cfg is None:
        what = f'starts from {start}' if start else 'starts from no checkpoint'
        raise UsageError(f'{config}: nothing to warm-start: its backbone {what} (a release, or its own); train it '
                         f'with `python tools/train.py {config}`')
    # the config itself: a det / seg one is the main job, a classifier from a stage is stage 2
    runs.append(Stage(name, config, osp.join(work_root, name), osp.join(work_root, _name(stage_cfg)),
                      'model.backbone.init_cfg.checkpoint',
                      list(options.get('stage2' if task == 'cls' else 'main', ())),
                      kind='stage' if task == 'cls' else 'main'))
    current = stage_cfg
    while current is not None:
        c = Config.fromfile(current)
        backbone_start, teacher_start = _start(c)
        own = _name(current)
        if teacher_start is not None:  # stage 1: the teacher reads the release
            runs.append(Stage(own, current, osp.join(work_root, own), teacher_start,
                              'model.teacher.init_cfg.checkpoint', list(options.get('stage1', ()))))
            break
        prev = _stage_config(backbone_start, osp.dirname(current), root) if backbone_start else None
        if prev is None:
            raise UsageError(f'{current}: a warm-start stage whose backbone starts from {backbone_start!r}, not from '
                             "stage 1's work dir (work_dirs/transfer_<pair>)")
        runs.append(Stage(own, current, osp.join(work_root, own), osp.join(work_root, _name(prev)),
                          'model.backbone.init_cfg.checkpoint', list(options.get('stage2', ()))))
        current = prev
    runs.reverse()
    if len(runs) - (task != 'cls') != 2:
        raise UsageError(f'{config}: its chain has {len(runs) - (task != "cls")} stages, the warm start two '
                         '(transfer, then fine-tune)')
    return runs


def _name(config: str) -> str:
    return osp.splitext(osp.basename(config))[0]


def stage_state(stage: Stage, max_iters: Optional[int]) -> Tuple[str, Optional[str], Optional[int]]:
    """('done' | 'partial' | 'missing', its last checkpoint, the iteration it holds)."""
    import torch

    from softfree_mm.models.converters import checkpoints_in
    found = checkpoints_in(stage.work_dir) if osp.isdir(stage.work_dir) else []
    if not found:
        return 'missing', None, None
    meta = torch.load(found[0], map_location='cpu', weights_only=False).get('meta', {})
    it = meta.get('iter')
    return ('done' if max_iters is not None and it is not None and it >= max_iters else 'partial'), found[0], it


def check_release(stage1_cfg) -> Optional[str]:
    """Before any run: stage 1's release, where it is here (a local file or work dir, a release in torch hub's
    cache), holds the teacher's architecture; a file of another one is a UsageError naming both. Returns what was
    checked (None: nothing here to check yet)."""
    from mmengine.registry import DefaultScope

    from ..registry import MODELS
    from .dry_run import _fits, _start_file
    init = (stage1_cfg.model.get('teacher') or {}).get('init_cfg') or {}
    path, _ = _start_file(init.get('checkpoint'))
    if path is None:
        return None
    teacher = dict(stage1_cfg.model.teacher.to_dict() if hasattr(stage1_cfg.model.teacher, 'to_dict')
                   else stage1_cfg.model.teacher)
    teacher.pop('init_cfg', None)
    with DefaultScope.overwrite_default_scope('softfree_mm'):
        model = MODELS.build(teacher)
    return _fits(model, init['checkpoint'], path, dict(init), 'the release (stage 1\'s teacher)')


def checkpoint_pair(path: str) -> Optional[dict]:
    """The backbone (type, arch, attention) the checkpoint at ``path`` was trained with, from the config text
    mmengine saves in its meta (None when it holds none)."""
    import torch
    from mmengine.config import Config
    meta = torch.load(path, map_location='cpu', weights_only=False).get('meta', {})
    text = meta.get('cfg')
    if not isinstance(text, str):
        return None
    try:
        cfg = Config.fromstring(text, '.py')
    except Exception:  # noqa: BLE001  (a config that needs files no longer there)
        return None
    return backbone_pair(cfg)


def backbone_pair(cfg) -> dict:
    bb = cfg.model.get('backbone', {})
    attn = bb.get('attn_cfg')
    return dict(type=bb.get('type'), arch=bb.get('arch'), attn_cfg=_plain(attn))


def _plain(value):
    if hasattr(value, 'to_dict'):
        value = value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != '_delete_'}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def describe_pair(pair: dict) -> str:
    attn = pair.get('attn_cfg')
    if isinstance(attn, dict):  # its type first, the options in name order
        attn = ', '.join(f'{k}={attn[k]}' for k in sorted(attn, key=lambda k: (k != 'type', k)))
    return f"{pair.get('type')} {pair.get('arch')} with {attn}"


def work_root_of(path: str) -> str:
    return os.path.abspath(path)
