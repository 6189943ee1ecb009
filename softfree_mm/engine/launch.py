"""What tools/train.py and tools/test.py share: config loading, checks that fail early with one line, CPU settings.

The same entry points serve mmdet (detection), mmseg (segmentation) and mmpretrain (classification) configs: the
config's ``default_scope`` decides the registries, mmengine's Runner does the rest.

Bad input (a config file that does not exist or does not parse, an unknown attention kernel, a model type no
registry knows, a missing data root or annotation file) raises :class:`UsageError` with one line that names it; the
tools print that line to stderr and exit with status 2.
"""
import difflib
import os
import os.path as osp
from typing import Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config

TASKS = {'mmdet': 'detection', 'mmseg': 'segmentation', 'mmpretrain': 'classification'}
DATALOADERS = {'train': ('train_dataloader', ), 'val': ('val_dataloader', ), 'test': ('test_dataloader', )}
EVALUATORS = {'val': 'val_evaluator', 'test': 'test_evaluator'}


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one line, exit status 2."""


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    if not osp.isfile(path):
        raise UsageError(f'config file not found: {path}')
    try:
        cfg = Config.fromfile(path)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except Exception as e:  # mmengine reports syntax errors, missing bases and duplicate keys in many types
        msg = ' '.join(str(e).split())
        raise UsageError(f'cannot read config {path}: {type(e).__name__}: {msg}') from None
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        raise UsageError(f'config {path} has default_scope={scope!r}; these tools run '
                         f'{", ".join(repr(s) for s in TASKS)} configs')
    return cfg


# ----------------------------------------------------------------------------------------------------- checks
def _walk(node, path='') -> Iterator[Tuple[str, object]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f'{path}.{k}' if path else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _walk(v, f'{path}[{i}]')


def check_attention(cfg: Config) -> None:
    """Every ``attn_cfg`` in the model names a registered kernel with valid arguments."""
    from softfree_mm.attention import normalize_cfg
    for path, node in _walk(cfg.get('model', {}), 'model'):
        if not (isinstance(node, dict) and 'attn_cfg' in node):
            continue
        attn = node['attn_cfg']
        items = list(enumerate(attn)) if isinstance(attn, (list, tuple)) else [(None, attn)]
        for i, one in items:
            where = f'{path}.attn_cfg' + ('' if i is None else f'[{i}]')
            try:
                normalize_cfg(one)
            except (KeyError, TypeError, ValueError) as e:
                msg = e.args[0] if e.args else str(e)
                raise UsageError(f'{where}: {msg}') from None


def check_model_types(cfg: Config) -> None:
    """The model and its backbone are types the config's scope can build (catches typos such as 'SoftFreeSwim')."""
    from mmengine.registry import MODELS
    import softfree_mm  # noqa: F401  (registers our backbones)
    scope = cfg.default_scope
    with MODELS.switch_scope_and_registry(scope) as registry:
        model = cfg.get('model', {})
        for path, node in (('model', model), ('model.backbone', model.get('backbone'))):
            if not isinstance(node, dict) or not isinstance(node.get('type'), str):
                continue
            if registry.get(node['type']) is None:
                names = set(registry.module_dict)
                parent = registry.parent
                while parent is not None:
                    names.update(parent.module_dict)
                    parent = parent.parent
                close = difflib.get_close_matches(node['type'], sorted(names), n=3, cutoff=0.6)
                hint = f'; did you mean {", ".join(close)}?' if close else ''
                raise UsageError(f"{path}.type={node['type']!r} is not a registered {scope} model{hint}")


def _datasets(node) -> Iterator[dict]:
    """A dataset config and the datasets it wraps (RepeatDataset, ConcatDataset, ClassBalancedDataset...)."""
    if isinstance(node, dict):
        yield node
        inner = node.get('dataset', None) or node.get('datasets', None)
        if isinstance(inner, dict):
            yield from _datasets(inner)
        elif isinstance(inner, (list, tuple)):
            for d in inner:
                yield from _datasets(d)


def data_roots(cfg: Config, phases=('train', 'val', 'test')) -> List[Tuple[str, str]]:
    """(what, path) pairs of every data root and annotation file the given phases read."""
    out = []
    for phase in phases:
        for key in DATALOADERS[phase]:
            loader = cfg.get(key)
            if not loader:
                continue
            for ds in _datasets(loader.get('dataset')):
                root = ds.get('data_root') or ''
                if root:
                    out.append((f'{key}.dataset.data_root', root))
                ann = ds.get('ann_file') or ''
                if ann:
                    out.append((f'{key}.dataset.ann_file', ann if osp.isabs(ann) else osp.join(root, ann)))
        ev = cfg.get(EVALUATORS.get(phase, ''), None)
        for e in (ev if isinstance(ev, (list, tuple)) else [ev]):
            if isinstance(e, dict) and e.get('ann_file') and not e.get('format_only', False):
                out.append((f'{EVALUATORS[phase]}.ann_file', e['ann_file']))
    return out


def check_data(cfg: Config, phases=('train', 'val', 'test')) -> None:
    for what, path in data_roots(cfg, phases):
        if not osp.exists(path):
            raise UsageError(f'{what}: {path} does not exist (see the README for the expected data layout, '
                             'or `python tools/make_demo_data.py` for the demo data)')


def demo_roots(cfg: Config, phases=('train', 'val', 'test')) -> List[Tuple[str, Optional[str]]]:
    """(``.../data/demo`` folder, demo set name or None for all) for every demo path the config reads: the tools
    write those on demand."""
    roots = set()
    for _, path in data_roots(cfg, phases):
        parts = osp.normpath(path).split(os.sep)
        for i in range(len(parts) - 1):
            if parts[i] == 'data' and parts[i + 1] == 'demo':
                roots.add((os.sep.join(parts[:i + 2]) or os.sep, parts[i + 2] if len(parts) > i + 2 else None))
    return sorted(roots, key=str)


# ----------------------------------------------------------------------------------------------- CPU settings
def _replace_syncbn(node) -> int:
    n = 0
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN', 'TorchSyncBN'):
            node['type'] = 'BN'
            n += 1
        for v in node.values():
            n += _replace_syncbn(v)
    elif isinstance(node, list):
        for v in node:
            n += _replace_syncbn(v)
    return n


def apply_device_settings(cfg: Config, launcher: str) -> List[str]:
    """Settings a machine without CUDA needs; returns a note for each change made."""
    notes = []
    if torch.cuda.is_available():
        return notes
    # SyncBN needs CUDA: plain BN (statistics per process) is the CPU stand-in
    if _replace_syncbn(cfg._cfg_dict.get('model')):
        notes.append('no CUDA: SyncBN -> BN')
    cfg.setdefault('env_cfg', {})
    cfg.env_cfg.setdefault('dist_cfg', {})
    if cfg.env_cfg.dist_cfg.get('backend', 'nccl') != 'gloo':
        cfg.env_cfg.dist_cfg.backend = 'gloo'
        notes.append('no CUDA: distributed backend gloo')
    if launcher != 'none':
        # DDP refuses device_ids for CPU modules
        wrapper = cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel')
        wrapper['device_ids'] = None
        cfg.model_wrapper_cfg = wrapper
        notes.append('no CUDA: DDP without device_ids')
    return notes


def enable_amp(cfg: Config) -> None:
    if not torch.cuda.is_available():
        raise UsageError('--amp needs CUDA (mmengine AmpOptimWrapper); this machine has none')
    wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper == 'AmpOptimWrapper':
        return
    if wrapper != 'OptimWrapper':
        raise UsageError(f'--amp works with optim_wrapper.type OptimWrapper, the config has {wrapper!r}')
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


def enable_auto_scale_lr(cfg: Config) -> None:
    asl = cfg.get('auto_scale_lr')
    if not asl or 'base_batch_size' not in asl:
        raise UsageError('--auto-scale-lr: the config has no auto_scale_lr=dict(base_batch_size=...)')
    cfg.auto_scale_lr.enable = True


def build_runner(cfg: Config):
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def short_error(e: BaseException) -> str:
    msg = ' '.join(str(e).split())
    return f'{type(e).__name__}: {msg}' if msg else type(e).__name__
