"""The warm-start chain as the configs declare it: from a det / seg / cls config back to the release.

A det / seg / cls config of a kernel without a release starts its backbone from a stage's work dir
(``init_cfg.checkpoint='work_dirs/finetune_<pair>'``: its last checkpoint); that stage's config is the config of that
name beside it, whose own start names the stage before; stage 1's teacher starts from the release. :func:`chain`
reads it; :mod:`softfree_mm.engine.chain_run` decides what of it runs.
"""
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import UsageError

ROLES = ('stage1', 'stage2', 'main')  # a run's place in the chain (a classifier's chain ends with stage 2)
ROLE_NAMES = {'stage1': 'stage 1 (transfer)', 'stage2': 'stage 2 (fine-tune)', 'main': 'the main job'}
TASKS = {'ImageClassifier': 'cls', 'EncoderDecoder': 'seg', 'CascadeEncoderDecoder': 'seg'}


@dataclass
class Stage:
    """One run of the chain: its config, its work dir, the start it reads (the previous run's work dir, or the
    release) and the option that points it there, and the other options it is given."""

    name: str
    config: str
    work_dir: str
    reads: str
    read_key: str
    options: List[str] = field(default_factory=list)
    role: str = 'main'


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


def starts_of(cfg) -> Tuple[Optional[str], Optional[str]]:
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


def _name(config: str) -> str:
    return osp.splitext(osp.basename(config))[0]


_PARSED: Dict[tuple, object] = {}


def load_config(config: str):
    """``config_checks.read_config(config)``, parsed once per file version (a copy each call: the caller may change
    it)."""
    import copy

    from .config_checks import read_config
    if not osp.isfile(config):
        read_config(config)  # the one-line error
    key = (osp.abspath(config), os.stat(config).st_mtime_ns)
    if key not in _PARSED:
        _PARSED[key] = read_config(config)
    return copy.deepcopy(_PARSED[key])


def _classifier_chain(config: str, name: str, root: str) -> str:
    """A classifier from scratch: its warm start is the fine-tune config of the same pair."""
    pair = name[len('cls_'):] if name.startswith('cls_') else None
    candidate = pair and _stage_config(f'finetune_{pair}', osp.dirname(config), root)
    if not candidate:
        raise UsageError(f'{config}: no warm start leads to this classifier (no finetune_{pair or name}.py beside '
                         'it or under configs/); train it with tools/train.py')
    return candidate


def _stages_before(stage_cfg: str, work_root: str, root: str, options) -> List[Stage]:
    """The stages from ``stage_cfg`` back to stage 1, last first."""
    runs, current = [], stage_cfg
    while current is not None:
        backbone_start, teacher_start = starts_of(load_config(current))
        own = _name(current)
        if teacher_start is not None:  # stage 1: the teacher reads the release
            runs.append(Stage(own, current, osp.join(work_root, own), teacher_start,
                              'model.teacher.init_cfg.checkpoint', list(options.get('stage1', ())), 'stage1'))
            return runs
        prev = _stage_config(backbone_start, osp.dirname(current), root) if backbone_start else None
        if prev is None:
            raise UsageError(f'{current}: a warm-start stage whose backbone starts from {backbone_start!r}, not from '
                             "stage 1's work dir (work_dirs/transfer_<pair>)")
        runs.append(Stage(own, current, osp.join(work_root, own), osp.join(work_root, _name(prev)),
                          'model.backbone.init_cfg.checkpoint', list(options.get('stage2', ())), 'stage2'))
        current = prev
    return runs


def chain(config: str, work_root: str = 'work_dirs', root: Optional[str] = None,
          options: Optional[Dict[str, Sequence[str]]] = None) -> List[Stage]:
    """The runs from the release to ``config``: stage 1, stage 2, then the config itself (for a classification config,
    its warm start's stage 2 is the classifier: the chain ends there). Each run's work dir is ``work_root/<config
    name>``; each reads the previous one's (``--cfg-options <its start key>=<that work dir>``). ``options``: extra
    --cfg-options per run ('stage1', 'stage2', 'main'). Bad input is a UsageError naming it."""
    root = root or osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    options = options or {}
    cfg = load_config(config)
    task = task_of(cfg)
    if task is None:
        raise UsageError(f'{config}: a {cfg.model.get("type")} config; the warm start runs before a detection, '
                         'segmentation or classification config (det / seg / cls)')
    name = _name(config)
    start, _ = starts_of(cfg)
    stage_cfg = _stage_config(start, osp.dirname(config), root) if start else None
    if task == 'cls' and stage_cfg is None:
        return chain(_classifier_chain(config, name, root), work_root, root, options)
    if stage_cfg is None:
        what = f'starts from {start}' if start else 'starts from no checkpoint'
        raise UsageError(f'{config}: nothing to warm-start: its backbone {what} (a release, or its own); train it '
                         f'with `python tools/train.py {config}`')
    role = 'stage2' if task == 'cls' else 'main'  # a classifier that starts from a stage is stage 2
    last = Stage(name, config, osp.join(work_root, name), osp.join(work_root, _name(stage_cfg)),
                 'model.backbone.init_cfg.checkpoint', list(options.get(role, ())), role)
    runs = [*reversed(_stages_before(stage_cfg, work_root, root, options)), last]
    if len(runs) - (task != 'cls') != 2:
        raise UsageError(f'{config}: its chain has {len(runs) - (task != "cls")} stages, the warm start two '
                         '(transfer, then fine-tune)')
    return runs


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


def backbone_pair(cfg) -> dict:
    """The backbone (type, arch, attention) a config trains."""
    bb = cfg.model.get('backbone', {})
    return dict(type=bb.get('type'), arch=bb.get('arch'), attn_cfg=plain(bb.get('attn_cfg')))


def plain(value):
    """A config value as plain dicts and lists (``_delete_`` markers left out)."""
    if hasattr(value, 'to_dict'):
        value = value.to_dict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k != '_delete_'}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def describe_pair(pair: dict) -> str:
    attn = pair.get('attn_cfg')
    if isinstance(attn, dict):  # its type first, the options in name order
        attn = ', '.join(f'{k}={attn[k]}' for k in sorted(attn, key=lambda k: (k != 'type', k)))
    return f"{pair.get('type')} {pair.get('arch')} with {attn}"
