"""``tools/train.py CONFIG --dry-run``: build what training would build (model and one backbone forward, pipelines,
dataset types, evaluators, optimizer wrapper, visualiser backends, start checkpoints that are here) without reading
the data set, so a config is checked in seconds. A problem is a :class:`~softfree_mm.engine.errors.UsageError`;
success returns one summary line per part.
"""
import importlib
import itertools
import os
from collections import Counter
from typing import List, Optional, Tuple

import torch
from mmengine.config import Config, ConfigDict

from .config_checks import DATALOADERS, EVALUATORS, _datasets, check_vis_backends
from .errors import UsageError, short_error

_RUNS = itertools.count()
PROBE_SIZE = (64, 64)  # the backbone forward: small, and a multiple of every stride (32)
# the attention paths are named from a forward at the classification size: an order is chosen per call from its
# shapes, and at 64x64 XCiT's channel attention sees fewer tokens than a head's channels, unlike at any real size
PATH_PROBE_SIZE = (224, 224)


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
        paths = attention_paths(backbone, torch.zeros(1, channels, *PATH_PROBE_SIZE))
        if paths:
            lines.append(f'attention paths at {PATH_PROBE_SIZE[0]}x{PATH_PROBE_SIZE[1]} (each call\'s, from its '
                         f'shapes): {describe_paths(paths)}')
    return lines, model


def attention_paths(backbone: torch.nn.Module, x: torch.Tensor) -> List[Tuple[str, str, str]]:
    """(layer, kernel name, the path its first call takes) for every attention layer, in call order, over one forward
    of ``backbone`` on ``x``; empty when the forward fails at that size (the probe forward has said what fails)."""
    from softfree_mm.attention import AttentionKernel
    paths = {}

    def record(name):
        def hook(kernel, args, kwargs):
            given = dict(zip(('q', 'k', 'v', 'hw', 'scale', 'bias', 'mask'), args), **kwargs)
            paths.setdefault(name, (kernel.name, kernel.describe_path(given['q'], given['k'], given['v'],
                                                                      given.get('bias'), given.get('mask'))))
        return hook
    hooks = [m.register_forward_pre_hook(record(n[:-len('.kernel')] if n.endswith('.kernel') else n),
                                         with_kwargs=True)
             for n, m in backbone.named_modules() if isinstance(m, AttentionKernel)]
    try:
        with torch.no_grad():
            backbone.eval()(x)
    except Exception:  # noqa: BLE001  (a size the backbone refuses: no path line)
        return []
    finally:
        for h in hooks:
            h.remove()
    return [(name, kernel, path) for name, (kernel, path) in paths.items()]


def describe_paths(paths: List[Tuple[str, str, str]]) -> str:
    """Runs of consecutive layers that take the same kernel and path: 'first..last (n layers): kernel path'."""
    runs: List[list] = []
    for name, kernel, path in paths:
        if runs and runs[-1][2:4] == [kernel, path]:
            runs[-1][1], runs[-1][4] = name, runs[-1][4] + 1
        else:
            runs.append([name, name, kernel, path, 1])
    return '; '.join((f'{a}' if n == 1 else f'{a}..{b} ({n} layers)') + f': {kernel} {path}'
                     for a, b, kernel, path, n in runs)


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


def _start_file(checkpoint) -> Tuple[Optional[str], str]:
    """(the local file of a start checkpoint, '') or (None, why it is not checked): a release URL is checked once
    it is in torch hub's cache (the run downloads it), a local path once it exists."""
    from urllib.parse import urlparse

    from softfree_mm.models.converters import release_file_name
    if not isinstance(checkpoint, str):
        return None, f'checkpoint={checkpoint!r} is not a path'
    if urlparse(checkpoint).scheme in ('http', 'https'):
        cached = os.path.join(torch.hub.get_dir(), 'checkpoints', release_file_name(checkpoint))
        if os.path.isfile(cached):
            return cached, ''
        return None, f'{checkpoint} is not downloaded yet (the run fetches it once, into {os.path.dirname(cached)})'
    if '://' in checkpoint:
        return None, f'{checkpoint} is a remote file (checked when the run loads it)'
    if os.path.isdir(checkpoint):  # a warm-start stage's work dir: its last checkpoint
        from softfree_mm.models.converters import checkpoints_in
        found = checkpoints_in(checkpoint)
        return (found[0], '') if found else (None, f'{checkpoint} holds no checkpoint yet, and the run needs it')
    if not os.path.isfile(checkpoint):
        return None, f'{checkpoint} is not there yet, and the run needs it'
    return checkpoint, ''


def backbone_starts(model) -> List[Tuple[str, torch.nn.Module, dict]]:
    """(place, backbone, init_cfg) of every softfree_mm backbone in ``model`` that starts from a Pretrained file."""
    from softfree_mm.models.backbones.base import SoftFreeBackbone
    out = []
    for name, m in model.named_modules():
        init = getattr(m, 'init_cfg', None)
        if isinstance(m, SoftFreeBackbone) and isinstance(init, dict) and init.get('type') == 'Pretrained':
            out.append((f'model.{name}.init_cfg' if name else 'model.init_cfg', m, init))
    return out


def _fits(m, checkpoint: str, path: str, init: dict, where: str) -> str:
    """``checkpoint`` (read from ``path`` as the run reads it) against the backbone ``m``: which of its weights it
    places; a file of another architecture is the run's own error (UsageError, one line)."""
    from softfree_mm.models.converters import check_arch, describe_arch, placement, read_pretrained
    try:
        sd = read_pretrained(m, path, type(m)._convert, init.get('prefix'), init.get('map_location', 'cpu'),
                             m._prefer_ema)
        info = check_arch(m, sd, checkpoint)
    except Exception as e:  # another architecture, a prefix that matches nothing, an unreadable file
        raise UsageError(f'{where}: {short_error(e)}') from None
    missing, unexpected, mismatched = placement(m, sd)
    own = len(m.state_dict())
    what = f' ({describe_arch(m, info)})' if info else ''
    line = (f'{checkpoint} fits {type(m).__name__}{what}: {own - len(missing) - len(mismatched)} of its {own} '
            'weights placed')
    extras = [f'{len(keys)} {label}' for keys, label in ((missing, 'left to their initialisation'),
                                                          (unexpected, 'in the file not placed'),
                                                          (mismatched, 'of another shape skipped')) if keys]
    return line + (f' ({", ".join(extras)})' if extras else '')


def check_starts_here(model) -> None:
    """Before a run: each backbone start file that is here (a local file, a release in torch hub's cache) holds the
    backbone's architecture; else one UsageError naming it (instead of a traceback when the weights load)."""
    for where, m, init in backbone_starts(model):
        path, _ = _start_file(init.get('checkpoint'))
        if path is not None:
            _fits(m, init['checkpoint'], path, init, where + '.checkpoint')


def check_start(cfg: Config, model) -> List[str]:
    """What the run starts from, where the files are here: each softfree_mm backbone's Pretrained checkpoint
    (read and converted as the run does; a file of another architecture is the run's own error) and ``load_from``
    / ``--resume`` (the whole model, as the run checks it). A start the run would stop for (a warm start not made
    yet) names how to make it and, where the config declares its ``softmax_release``, whether that other start,
    the release with the kernel swapped, is here and fits."""
    from softfree_mm.models.converters import check_model_checkpoint, missing_checkpoint_message

    from .checkpoints import check_checkpoint, load_state_dict_of
    from .config_checks import warm_start_hint
    lines = []
    release = cfg.get('softmax_release')
    for where, m, init in backbone_starts(model):
        path, why = _start_file(init.get('checkpoint'))
        if path is not None:
            try:
                lines.append(f'{where}: {_fits(m, init["checkpoint"], path, init, where + ".checkpoint")}')
            except UsageError as e:
                raise UsageError(f'--dry-run: {e}') from None
            continue
        if not (isinstance(init.get('checkpoint'), str) and why.endswith('the run needs it')):
            lines.append(f'{where}: not checked: {why}')
            continue
        lines.append(f'{where}: the run stops before training: '
                     + missing_checkpoint_message(init['checkpoint'], '', release, cfg.filename,
                                                  **warm_start_hint(init['checkpoint'], cfg.filename)).lstrip(': '))
        if release and release != init['checkpoint']:
            rpath, rwhy = _start_file(release)
            if rpath is None:
                lines.append(f'{where}: the other start, softmax_release: not checked: {rwhy}')
            else:
                try:
                    fits = _fits(m, release, rpath, dict(init, prefix=None), 'softmax_release')
                except UsageError as e:
                    raise UsageError(f'--dry-run: {e}') from None
                lines.append(f'{where}: the other start, softmax_release with this kernel swapped in: {fits}; '
                             f'--cfg-options model.backbone.init_cfg.checkpoint={release} takes it')
    path = cfg.get('load_from')
    key = 'resume' if cfg.get('resume') else 'load_from'
    if path and not os.path.isfile(path):
        lines.append(f'{key}: not checked: {path} is not there')
    elif path:
        state = load_state_dict_of(path)  # BadInput when unreadable
        try:
            check_model_checkpoint(model, state, path)
        except ValueError as e:
            _fail(key, e)
        check_checkpoint(path, model, 'resume' if cfg.get('resume') else 'load')  # BadInput when it is another model
        own = model.state_dict()
        fitting = sum(1 for k, v in state.items() if k in own and tuple(own[k].shape) == tuple(v.shape))
        lines.append(f'{key}: {path} fits the model: {fitting} of its {len(own)} weights')
    return lines


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
        lines += check_start(cfg, model)
    backends = check_vis_backends(cfg)
    if backends:
        lines.append(f'visualizer backends: {", ".join(backends)}')
    return lines
