"""``tools/train.py CONFIG --dry-run``: check a config without its data set.

Builds what training would build and reads no image or annotation file: the model (every attention kernel and its
fit to the backbone are checked while it is built), one forward of the backbone on a small image (the kernels run),
the data pipelines of every dataloader (each transform built), the dataset types, the evaluators (without their
annotation files), the optimizer wrapper with its parameter-wise settings, and the visualiser's backends. A problem
is a :class:`~softfree_mm.engine.launch.UsageError` naming it (one line, exit status 2); success returns one summary
line per part.
"""
import importlib
import itertools
from collections import Counter
from typing import List, Tuple

import torch
from mmengine.config import Config, ConfigDict

from .launch import DATALOADERS, EVALUATORS, UsageError, _datasets, check_vis_backends, short_error

_RUNS = itertools.count()
PROBE_SIZE = (64, 64)  # the backbone forward: small, and a multiple of every stride (32)


def _fail(part: str, e: Exception):
    raise UsageError(f'--dry-run: {part}: {short_error(e)}') from None


def _as_dict(node):
    return node.to_dict() if isinstance(node, ConfigDict) else node


def check_model(cfg: Config) -> Tuple[List[str], torch.nn.Module]:
    from mmengine.registry import MODELS

    from softfree_mm.attention import AttentionKernel
    try:
        model = MODELS.build(cfg.model)
    except Exception as e:  # a kernel that does not fit the backbone, a bad argument anywhere in the model
        _fail('model', e)
    params = sum(p.numel() for p in model.parameters())
    kernels = Counter(m.name for m in model.modules() if isinstance(m, AttentionKernel))
    kinds = ', '.join(f'{name} x{n}' for name, n in kernels.items()) or 'none'
    lines = [f'model {type(model).__name__}: {params / 1e6:.2f} M parameters; attention kernels: {kinds}']
    backbone = getattr(model, 'backbone', None)
    if isinstance(backbone, torch.nn.Module):
        channels = cfg.model.get('backbone', {}).get('in_channels', 3)
        x = torch.zeros(1, channels, *PROBE_SIZE)
        try:
            with torch.no_grad():
                outs = backbone.eval()(x)
        except Exception as e:
            _fail(f'backbone {type(backbone).__name__} forward on a {PROBE_SIZE[0]}x{PROBE_SIZE[1]} image', e)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        shapes = ' '.join('x'.join(str(s) for s in o.shape[1:]) for o in outs if isinstance(o, torch.Tensor))
        lines.append(f'backbone {type(backbone).__name__} forward {PROBE_SIZE[0]}x{PROBE_SIZE[1]}: {shapes}')
    return lines, model


def check_pipelines(cfg: Config) -> List[str]:
    from mmengine.dataset import Compose
    from mmengine.registry import DATASETS
    lines = []
    for phase, keys in DATALOADERS.items():
        for key in keys:
            loader = cfg.get(key)
            if not loader:
                continue
            for i, ds in enumerate(_datasets(loader.get('dataset'))):
                where = f'{key}.dataset' + ('' if not i else f' (wrapped dataset {i})')
                kind = ds.get('type')
                with DATASETS.switch_scope_and_registry(cfg.default_scope) as registry:
                    known = not isinstance(kind, str) or registry.get(kind) is not None
                if not known:
                    raise UsageError(f'--dry-run: {where}.type={kind!r} is not a registered {cfg.default_scope} '
                                     'dataset')
                pipeline = ds.get('pipeline')
                if not pipeline:
                    continue
                try:
                    transforms = Compose([_as_dict(t) for t in pipeline])
                except Exception as e:
                    _fail(f'{where}.pipeline', e)
                lines.append(f'{where} ({kind}): pipeline of {len(transforms.transforms)} transforms built')
    return lines


def check_evaluators(cfg: Config) -> List[str]:
    from mmengine.registry import METRICS
    lines = []
    for phase, key in EVALUATORS.items():
        ev = cfg.get(key)
        if not ev:
            continue
        metrics = ev if isinstance(ev, (list, tuple)) else [ev]
        names = []
        for i, metric in enumerate(metrics):
            metric = dict(_as_dict(metric))
            if metric.get('type') == 'Evaluator':  # an explicit Evaluator wrapping metrics
                continue
            if 'ann_file' in metric:
                metric['ann_file'] = None  # no annotation file is read (the metric then takes the dataset's)
            try:
                METRICS.build(metric)
            except Exception as e:
                _fail(f'{key}' + (f'[{i}]' if isinstance(ev, (list, tuple)) else ''), e)
            names.append(str(metric.get('type')))
        lines.append(f'{key}: {", ".join(names)} built')
    return lines


def check_optimizer(cfg: Config, model) -> List[str]:
    if not cfg.get('optim_wrapper'):
        return []
    from mmengine.optim import build_optim_wrapper
    try:
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    except Exception as e:
        _fail('optim_wrapper', e)
    groups = len(wrapper.optimizer.param_groups)
    return [f'optim_wrapper: {type(wrapper).__name__}({type(wrapper.optimizer).__name__}), {groups} parameter groups']


def dry_run(cfg: Config) -> List[str]:
    """The checks above in the config's default scope; the summary lines (UsageError on the first problem)."""
    from mmengine.logging import MMLogger
    from mmengine.registry import DefaultScope
    # the builders' INFO lines (one per parameter group...) would bury the summary: warnings and errors only
    name = f'softfree_mm_dry_run_{next(_RUNS)}'  # a new instance becomes mmengine's current logger
    MMLogger.get_instance(name, log_level='WARNING')
    scope = cfg.default_scope
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope(scope):
        lines, model = check_model(cfg)
        lines += check_pipelines(cfg)
        lines += check_evaluators(cfg)
        lines += check_optimizer(cfg, model)
    backends = check_vis_backends(cfg)
    if backends:
        lines.append(f'visualizer backends: {", ".join(backends)}')
    return lines
