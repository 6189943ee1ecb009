"""Checks of a config, its data paths and the CLI options that fail early, before the Runner builds anything.

The tools serve mmdet, mmseg and mmpretrain configs alike (the config's ``default_scope`` picks the registries).
Each problem is a :class:`UsageError` whose one line names the bad value and what is valid.
"""
import difflib
import functools
import importlib
import importlib.util
import os
import os.path as osp
import threading
from typing import Dict, Iterator, List, Optional, Tuple

from mmengine.config import Config

from .errors import UsageError, short_error

TASKS = {'mmdet': 'detection', 'mmseg': 'segmentation', 'mmpretrain': 'classification'}
DATALOADERS = {'train': ('train_dataloader', ), 'val': ('val_dataloader', ), 'test': ('test_dataloader', )}
EVALUATORS = {'val': 'val_evaluator', 'test': 'test_evaluator'}


# mmengine reads a config's ``mmdet::`` bases through pkg_resources and reloads that module on each read
# (mmengine.utils.is_installed): a read in another thread at that moment meets two classes of one name ('Expected str,
# Requirement, or Distribution'). The grids' runners read configs from their threads: one read at a time.
_READING = threading.RLock()


def read_config(path: str) -> Config:
    """``Config.fromfile(path)``, one read at a time in the process; a missing file or one mmengine cannot parse
    is a UsageError naming it."""
    if not osp.isfile(path):
        raise UsageError(f'config file not found: {path}')
    try:
        with _READING:
            return Config.fromfile(path)
    except Exception as e:  # mmengine reports syntax errors, missing bases and duplicate keys in many types
        raise UsageError(f'cannot read config {path}: {short_error(e)}') from None


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """The config with ``cfg_options`` merged, of a task these tools run (its default scope checked)."""
    cfg = read_config(path)
    if cfg_options:
        try:
            cfg.merge_from_dict(cfg_options)
        except Exception as e:
            problems = [f'{key}: {why}' for key, why in ((k, _option_problem(cfg, k)) for k in cfg_options) if why]
            why = '; '.join(problems) or f'{", ".join(cfg_options)}: {short_error(e)}'
            raise UsageError(f'--cfg-options could not be applied to {path}: {why}') from None
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        raise UsageError(f'config {path} has default_scope={scope!r}; these tools run '
                         f'{", ".join(repr(s) for s in TASKS)} configs')
    return cfg


def _option_problem(cfg: Config, key: str) -> Optional[str]:
    """Why the --cfg-options key ``a.b.c`` cannot be merged into ``cfg`` (None when its path looks fine)."""
    parts = key.split('.')
    node = cfg._cfg_dict
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None  # a new key: merging creates it
        path, rest = '.'.join(parts[:i + 1]), '.'.join(parts[i + 1:])
        if isinstance(node, list):
            if not parts[i + 1].isdigit():
                return (f'{path} is a list of {len(node)}, not a dict: use index keys such as {path}.0.{rest}, '
                        f'or give the whole value ({path}=[...])')
            if int(parts[i + 1]) >= len(node):
                return f'{path} is a list of {len(node)}: index {parts[i + 1]} is out of range'
        elif not isinstance(node, dict):
            return f'{path} is {node!r}, not a dict: give the whole value ({path}=...)'
    return None


# ------------------------------------------------------------------------------------------------ model checks
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


def warm_start_hint(checkpoint: str, config: Optional[str]) -> Dict[str, str]:
    """What the missing-start line adds for a checkpoint a warm-start stage writes (``work_dirs/finetune_*`` or
    ``transfer_*``), read from that stage's config beside ``config``: the tool's launch options its scale needs
    (``--launcher pytorch --gpus N`` for N processes of the config's per-GPU batch), the cost of both stages and, when
    the stage runs its layout's default recipe measured on another layout, that note. Empty where unknown."""
    from . import warm_start as ws
    from .layout_defaults import default_origin, default_recipe, warm_start_cost
    name = next((part for part in reversed(os.path.normpath(checkpoint).split(os.sep))
                 if part.startswith(('finetune_', 'transfer_'))), None)
    path = os.path.join(os.path.dirname(config or ''), f'{name}.py') if name else ''
    if not (name and config and os.path.isfile(path)):
        return {}
    try:
        stage = Config.fromfile(path)
        recipe, scale = stage.warm_start['recipe'], ws.SCALES[stage.warm_start['scale']]
        per_gpu, backbone = int(stage.train_dataloader.batch_size), stage.model.backbone.to_dict()
        out = dict(cost=warm_start_cost(backbone['type']) if name.startswith('finetune_') else '')
        out['launch'] = (f' --launcher pytorch --gpus {scale.batch // per_gpu}'
                         if scale.batch > per_gpu and scale.batch % per_gpu == 0 else '')
        out['note'] = (default_origin(backbone) or '') if default_recipe(backbone) == recipe else ''
        return out
    except (KeyError, AttributeError, TypeError, ValueError, UsageError):  # not a chain stage: the plain line
        return {}


def check_pretrained(cfg: Config) -> None:
    """Every ``Pretrained`` init_cfg that names a local file names one that exists: a det / seg config whose backbone
    starts from a checkpoint made by another config (the warm start's, a ``cls_*`` one) says how to make it, the
    start from the config's ``softmax_release`` with the kernel swapped where it has one, or how to train from
    scratch on purpose (``model.backbone.init_cfg.type=Scratch``). URLs are fetched when the model is initialised."""
    from softfree_mm.models.converters import checkpoints_in, missing_checkpoint_message
    for path, node in _walk(cfg.get('model', {}), 'model'):
        if isinstance(node, dict) and node.get('type') in ('Pretrained', 'ReleaseHead'):
            ckpt = node.get('checkpoint')
            if not isinstance(ckpt, str) or '://' in ckpt or os.path.isfile(ckpt):
                continue
            if not (os.path.isdir(ckpt) and checkpoints_in(ckpt)):  # a stage's work dir: its last checkpoint
                raise UsageError(missing_checkpoint_message(ckpt, path, cfg.get('softmax_release'), cfg.filename,
                                                            **warm_start_hint(ckpt, cfg.filename)))


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


@functools.lru_cache(maxsize=None)
def registered_names(scope: str) -> frozenset:
    """Every name the registries of ``scope`` (and mmengine's root registries) know, plus the attention kernels."""
    from mmengine import registry as root
    from mmengine.registry import Registry
    from softfree_mm.attention import list_attentions
    import softfree_mm  # noqa: F401  (registers our backbones)
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    names = set(list_attentions())
    for module in (root, importlib.import_module(f'{scope}.registry')):
        for reg in vars(module).values():
            while isinstance(reg, Registry):
                reg.import_from_location()
                names.update(reg.module_dict)
                reg = reg.parent
    return frozenset(names)


def unknown_types(cfg: Config, keys=None) -> Iterator[Tuple[str, str]]:
    """(key path, type) of every dict under ``keys`` (default: the whole config) whose str 'type' no registry of
    the config's scope knows ('mmdet.Foo' is looked up in mmdet's registries)."""
    for key in (keys or [None]):
        top = cfg._cfg_dict if key is None else cfg.get(key)
        for path, node in _walk(top, key or ''):
            name = node.get('type') if isinstance(node, dict) else None
            if not isinstance(name, str):
                continue
            scope, _, short = name.rpartition('.')
            try:
                known = registered_names(scope if scope in TASKS else cfg.default_scope)
            except ImportError:
                continue
            if short not in known:
                yield f'{path}.type' if path else 'type', name


def check_types(cfg: Config) -> None:
    """No 'type' anywhere in the config is a near miss of a registered name (catches typos such as 'ImageNett',
    'AdamWW' before the Runner builds anything). Names without a close registered match are left alone: some
    'type' values are not registry names (mmcv ops such as 'RoIAlign' are looked up with getattr)."""
    for path, name in unknown_types(cfg):
        scope, _, short = name.rpartition('.')
        scope = scope if scope in TASKS else cfg.default_scope
        close = difflib.get_close_matches(short, sorted(registered_names(scope)), n=3, cutoff=0.8)
        if close:
            raise UsageError(f'{path}={name!r} is not registered in {scope} or mmengine; '
                             f'did you mean {", ".join(close)}?')



# -------------------------------------------------------------------------------------------------- CLI checks
LAUNCH_ENV = {'pytorch': ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'),
              'slurm': ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'),
              'mpi': ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK', 'OMPI_COMM_WORLD_SIZE', 'MASTER_ADDR')}
LAUNCH_HOW = {'pytorch': 'start it with torchrun: bash tools/dist_{tool}.sh ...',
              'slurm': 'start it with srun: bash tools/slurm_{tool}.sh ...',
              'mpi': 'start it with mpirun'}


def check_launcher(launcher: str, tool: str = 'train') -> None:
    """The environment variables the launcher's process-group start-up reads are set."""
    missing = [name for name in LAUNCH_ENV.get(launcher, ()) if name not in os.environ]
    if missing:
        how = LAUNCH_HOW[launcher].format(tool=tool)
        raise UsageError(f'--launcher {launcher}: {", ".join(missing)} not set in the environment; {how} '
                         '(or use --launcher none for one process)')



# ------------------------------------------------------------------------------------------------- data checks
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
                prefix = ds.get('data_prefix')
                items = prefix.items() if isinstance(prefix, dict) else [('', prefix)]
                for name, sub in items:
                    if sub and isinstance(sub, str) and ds.get('backend_args') is None:  # local files only
                        out.append((f'{key}.dataset.data_prefix' + (f'.{name}' if name else ''), osp.join(root, sub)))
        ev = cfg.get(EVALUATORS.get(phase, ''), None)
        for e in (ev if isinstance(ev, (list, tuple)) else [ev]):
            if isinstance(e, dict) and e.get('ann_file') and not e.get('format_only', False):
                out.append((f'{EVALUATORS[phase]}.ann_file', e['ann_file']))
    return out


def check_data(cfg: Config, phases=('train', 'val', 'test')) -> None:
    for what, path in data_roots(cfg, phases):
        if '://' not in path and not osp.exists(path):
            raise UsageError(f'{what}: {path} does not exist (see the README for the expected data layout, '
                             'or `python tools/make_demo_data.py` for the demo data; `tools/train.py CONFIG '
                             '--dry-run` checks the config without data)')


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


# ------------------------------------------------------------------------------------------ visualiser checks
# mmengine's visualiser backends that need a package mmengine does not require: (module, what to install)
VIS_BACKEND_PACKAGES = {
    'TensorboardVisBackend': ('tensorboard', 'pip install -e .[tensorboard] (or pip install tensorboard)'),
    'WandbVisBackend': ('wandb', 'pip install wandb'),
    'MLflowVisBackend': ('mlflow', 'pip install mlflow'),
    'ClearMLVisBackend': ('clearml', 'pip install clearml'),
    'NeptuneVisBackend': ('neptune', 'pip install neptune'),
    'DVCLiveVisBackend': ('dvclive', 'pip install dvclive'),
    'AimVisBackend': ('aim', 'pip install aim'),
}


def check_vis_backends(cfg: Config) -> List[str]:
    """The visualiser's backends can be created: a backend whose package is missing is an error naming the
    package and how to install it (mmengine would fail at the first logged value, after the model is built).
    Returns the backend types."""
    vis = cfg.get('visualizer') or {}
    backends = vis.get('vis_backends') or [] if isinstance(vis, dict) else []
    kinds = []
    for i, backend in enumerate(backends):
        kind = backend.get('type') if isinstance(backend, dict) else None
        if not isinstance(kind, str):
            continue
        kinds.append(kind)
        module, how = VIS_BACKEND_PACKAGES.get(kind.rpartition('.')[2], (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise UsageError(f'visualizer.vis_backends[{i}].type={kind!r} needs the {module} package, which is not '
                             f'installed: {how}')
    return kinds
