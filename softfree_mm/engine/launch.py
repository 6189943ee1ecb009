"""What tools/train.py and tools/test.py share: config loading, checks that fail early with one line, CPU settings.

The same entry points serve mmdet (detection), mmseg (segmentation) and mmpretrain (classification) configs: the
config's ``default_scope`` decides the registries, mmengine's Runner does the rest.

Bad input (a config file that does not exist or does not parse, --cfg-options that cannot be applied, an unknown
attention kernel, a misspelt registry type, a missing data root, image folder or annotation file, a --launcher
started without its environment, a setting the Runner refuses while it builds its parts, a CUDA that is expected and
does not work) raises :class:`UsageError` with one line that names it; the tools print that line to stderr and exit
with status 2. Bad files met while running (an image, an annotation file, a checkpoint) and a non-finite loss are
softfree_mm.engine.reliability's; the same one line, exit status 2.
"""
import difflib
import functools
import importlib
import importlib.util
import os
import os.path as osp
from typing import Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.hooks import Hook

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
    except Exception as e:  # mmengine reports syntax errors, missing bases and duplicate keys in many types
        raise UsageError(f'cannot read config {path}: {short_error(e)}') from None
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


def check_pretrained(cfg: Config) -> None:
    """Every ``Pretrained`` init_cfg that names a local file names one that exists: a det / seg config whose backbone
    starts from a checkpoint made with a ``cls_*`` config says how to make it, or how to train from scratch on
    purpose (``model.backbone.init_cfg.type=Scratch``). URLs are fetched when the model is initialised."""
    from softfree_mm.models.converters import missing_checkpoint_message
    for path, node in _walk(cfg.get('model', {}), 'model'):
        if isinstance(node, dict) and node.get('type') == 'Pretrained':
            ckpt = node.get('checkpoint')
            if isinstance(ckpt, str) and '://' not in ckpt and not os.path.isfile(ckpt):
                raise UsageError(missing_checkpoint_message(ckpt, path))


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


def select_device(device: Optional[str], launcher: str) -> str:
    """'cuda' or 'cpu' (softfree_mm.engine.device): CUDA when it works; CPU when asked for, or for one process on a
    machine without GPUs; else UsageError naming why CUDA does not work."""
    from .device import DeviceError, check, requested
    try:
        return check(requested(device), launcher)
    except DeviceError as e:
        raise UsageError(str(e)) from None


def check_cuda_ops(cfg: Config) -> None:
    """A detector on CUDA needs nms / roi_align on CUDA: mmcv's own (compiled with CUDA) or torchvision's (the compat
    route). Names what is missing."""
    if cfg.default_scope != 'mmdet':
        return
    from softfree_mm import compat
    if compat.mmcv_has_cuda_ops():
        return
    if os.environ.get(compat.ROUTE_ENV) == '0':
        raise UsageError(f'mmcv {_mmcv_version()} has no CUDA ops and {compat.ROUTE_ENV}=0 turns the torchvision '
                         'route off: the detector cannot run nms / roi_align on CUDA; unset it, or build mmcv with '
                         'CUDA ops (MMCV_CUDA=1 bash tools/setup_env.sh)')
    try:
        cuda_ops = torch.ops.torchvision._cuda_version() > 0
    except Exception:
        cuda_ops = False
    if not cuda_ops:
        import torchvision
        raise UsageError(f'mmcv {_mmcv_version()} has no CUDA ops and torchvision {torchvision.__version__} none '
                         'either: the detector cannot run nms / roi_align on CUDA; install the torchvision built for '
                         f'torch {torch.__version__} (CUDA {torch.version.cuda})')


def _mmcv_version() -> str:
    try:
        import mmcv
        return mmcv.__version__
    except ImportError:
        return '(not installed)'


def enable_determinism_env(cfg: Config) -> None:
    """cuBLAS refuses deterministic mode unless its workspace is fixed before its first use."""
    if (cfg.get('randomness') or {}).get('deterministic'):
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')


SLURM_PORTS = (20000, 30000)  # below Linux's ephemeral range (32768-60999)


def slurm_master_port(job_id: str, step_id: str = '0') -> int:
    """A port every task of one Slurm job step computes alike and two jobs on one node do not share (unless their
    ids differ by a multiple of 10000)."""
    lo, hi = SLURM_PORTS
    return lo + (int(job_id) * 7 + int(step_id or 0)) % (hi - lo)


def apply_cluster_settings(cfg: Config, launcher: str) -> List[str]:
    """What a cluster job needs from the environment: a MASTER_PORT of its own under Slurm (two jobs on one node
    would both take 29500), and no more data-loading workers than the CPUs Slurm gave each task."""
    notes = []
    if launcher == 'slurm' and 'MASTER_PORT' not in os.environ and os.environ.get('SLURM_JOB_ID', '').isdigit():
        step = os.environ.get('SLURM_STEP_ID', '0')
        port = slurm_master_port(os.environ['SLURM_JOB_ID'], step if step.isdigit() else '0')
        os.environ['MASTER_PORT'] = str(port)
        notes.append(f'MASTER_PORT={port} (from SLURM_JOB_ID)')
    cpus = os.environ.get('SLURM_CPUS_PER_TASK', '')
    if cpus.isdigit():
        most = max(1, int(cpus) - 1)  # one CPU for the training process itself
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            loader = cfg.get(key)
            if loader and loader.get('num_workers', 0) > most:
                notes.append(f'{key}.num_workers {loader.num_workers} -> {most} (SLURM_CPUS_PER_TASK={cpus})')
                loader.num_workers = most
    return notes


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


AMP_DTYPES = ('auto', 'float16', 'bfloat16')


def amp_dtype(requested: str = 'auto') -> str:
    """The autocast dtype of --amp: bfloat16 where the GPU has it (no overflow at 65504, the loss scaler idle),
    else float16 with dynamic loss scaling; or the one asked for."""
    if requested not in AMP_DTYPES:
        raise UsageError(f'--amp-dtype {requested!r}: valid values are {", ".join(AMP_DTYPES)}')
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if requested == 'auto':
        return 'bfloat16' if bf16 else 'float16'
    if requested == 'bfloat16' and not bf16:
        raise UsageError(f'--amp-dtype bfloat16: {torch.cuda.get_device_name()} has no bfloat16; use float16')
    return requested


def enable_amp(cfg: Config, dtype: str = 'auto') -> str:
    if not torch.cuda.is_available():
        raise UsageError('--amp needs CUDA (mmengine AmpOptimWrapper); this machine has none')
    wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise UsageError(f'--amp works with optim_wrapper.type OptimWrapper, the config has {wrapper!r}')
    dtype = amp_dtype(dtype)
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.dtype = dtype
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    return dtype


def add_reliability_hooks(cfg: Config, skip_nonfinite_loss: bool = False) -> None:
    """The RNG-state hook (kill-and-resume reproduces) and the non-finite-loss guard, unless the config has them."""
    hooks = list(cfg.get('custom_hooks') or [])
    names = {h.get('type') for h in hooks if isinstance(h, dict)}
    if 'RNGStateHook' not in names:
        hooks.append(dict(type='RNGStateHook'))
    if 'NonFiniteLossHook' not in names:
        hooks.append(dict(type='NonFiniteLossHook', skip=skip_nonfinite_loss))
    elif skip_nonfinite_loss:
        for h in hooks:
            if isinstance(h, dict) and h.get('type') == 'NonFiniteLossHook':
                h['skip'] = True
    cfg.custom_hooks = hooks


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


class _RunStarted(Hook):
    """Marks the end of the Runner's lazy building: Runner.train() / test() build loops, dataloaders, datasets,
    evaluators, optimizer and schedulers before they call the before_run hooks."""

    def __init__(self):
        self.started = False

    def before_run(self, runner) -> None:
        self.started = True


def run(runner, method: str, config: str):
    """``runner.train()`` or ``runner.test()``; an error before the run starts is a config error (UsageError),
    one after it propagates unchanged. SOFTFREE_MM_TRACEBACK=1 re-raises config errors too."""
    from .reliability import BadInput, NonFiniteLoss, data_file_error
    mark = _RunStarted()
    runner.register_hook(mark, priority='LOWEST')
    try:
        return getattr(runner, method)()
    except (BadInput, NonFiniteLoss):
        raise
    except Exception as e:
        line = None if os.environ.get('SOFTFREE_MM_TRACEBACK') else data_file_error(e)
        if line:
            raise BadInput(line) from None
        if mark.started or os.environ.get('SOFTFREE_MM_TRACEBACK'):
            raise
        msg = short_error(e)
        if isinstance(e, TypeError) and 'None is not a callable' in msg:  # what mmengine says for an unknown optimizer
            keys = ('optim_wrapper', 'param_scheduler')
            unknown = [f'{path}={name!r}' for path, name in unknown_types(runner.cfg, keys)]
            if unknown:
                msg += f' (not a registered type: {", ".join(unknown)})'
        raise UsageError(f'{config}: {msg} (SOFTFREE_MM_TRACEBACK=1 shows the traceback)') from None


def finish_dist() -> None:
    """Wait for every process, then tear the process group down (a rank left with a live group may abort on
    exit)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


RANK_ENV = ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK')


def print_error(line: str, every_rank: bool = False) -> None:
    """``error: line`` on stderr: once for a job (rank 0) when every process meets the same error (a config or
    device error, a non-finite loss all ranks agreed on), on each rank for an error of its own (a bad file in its
    shard of the data)."""
    import sys
    rank = next((os.environ[k] for k in RANK_ENV if k in os.environ), '0')
    if every_rank or rank == '0':
        print(f'error: {line}', file=sys.stderr)


def short_error(e: BaseException) -> str:
    msg = ' '.join(str(e).split())
    return f'{type(e).__name__}: {msg}' if msg else type(e).__name__
