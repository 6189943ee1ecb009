"""``detector`` mode: one Mask R-CNN training step (loss, backward, AdamW step) with our backbones and with mmdet's
own in the same detector, each detector in a fresh process: images/s, peak memory and the ratios between them."""
import contextlib
import statistics
from typing import Dict, List, Sequence, Tuple

import torch

from .references import MMDET_BACKBONES
from .timing import DTYPES, in_fresh_process, peak_memory, synchronize, timed, timer

DETECTOR_KERNELS = ('softmax', 'poly3', 'inline')
DETECTORS = tuple(f'{b}:{k}' for b in MMDET_BACKBONES for k in DETECTOR_KERNELS + ('mmdet',))
DETECTOR_SIZE = (800, 1216)  # the official Mask R-CNN scale (1333 x 800) as the pipelines pad it, landscape
# what may follow a detector's kernel after '+': 'nosr' (PVTv2 without spatial reduction: every stage's keys are its
# tokens), 'explicit' / 'factorised' (the kernel's association order forced, as before the association rule chose it)
OPTIONS = ('nosr', 'explicit', 'factorised')


def _root() -> str:
    import os.path as osp
    return osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))  # the repository


def detector_names() -> Tuple[str, ...]:
    """Every ``backbone:kernel`` with a config (configs/maskrcnn_<backbone>_<kernel>.py), and ``backbone:mmdet``
    where mmdet has the backbone; each may add ``+option`` (OPTIONS)."""
    import glob
    import os.path as osp
    names = []
    for path in sorted(glob.glob(osp.join(_root(), 'configs', 'maskrcnn_*_*.py'))):
        stem = osp.basename(path)[len('maskrcnn_'):-len('.py')]
        for b in sorted({*MMDET_BACKBONES, 'xcit_s12', 'xcit_t12', 'cswin_t', 'pvt_v2_b0'}, key=len, reverse=True):
            if stem.startswith(b + '_'):
                names.append(f'{b}:{stem[len(b) + 1:]}')
                break
    return tuple(dict.fromkeys(names + [f'{b}:mmdet' for b in MMDET_BACKBONES]))


def parse_detector(name: str) -> Tuple[str, str, Tuple[str, ...]]:
    """'pvt_v2_b2:softmax+nosr' -> ('pvt_v2_b2', 'softmax', ('nosr',)); a clear error naming what is valid."""
    base, *options = name.split('+')
    bad = [o for o in options if o not in OPTIONS]
    if base not in detector_names() or bad or len(set(options)) != len(options):
        raise ValueError(f"detector: unknown detector {name!r}; valid: backbone:kernel of "
                         f"{', '.join(detector_names())}, each optionally with +{' / +'.join(OPTIONS)}")
    backbone, _, kernel = base.partition(':')
    if 'nosr' in options and not backbone.startswith('pvt'):
        raise ValueError(f"detector: {name!r}: +nosr is PVTv2's (its spatial reduction), not {backbone}'s")
    if {'explicit', 'factorised'} <= set(options) or (kernel == 'mmdet' and set(options) - {'nosr'}):
        raise ValueError(f"detector: {name!r}: one association order, and none for mmdet's own backbone")
    return backbone, kernel, tuple(options)


def _with_impl(attn, impl):
    """An attention config (a dict, a name, or one per stage) with ``impl`` forced on every kernel that has two
    association orders (softmax and the others keep theirs)."""
    if isinstance(attn, (list, tuple)):
        return [_with_impl(a, impl) for a in attn]
    cfg = dict(type=attn) if isinstance(attn, str) else dict(attn)
    from ...attention import AttentionKernel, kernel_class
    if kernel_class(cfg).order_products is not AttentionKernel.order_products:  # a kernel with two orders
        cfg['impl'] = impl
    return cfg


def detector_config(name: str):
    """The model config of a ``backbone:kernel[+option...]`` detector (:func:`parse_detector`), without pretrained
    weights, with BatchNorm in place of SyncBN (one process)."""
    import os.path as osp

    from ...engine.config_checks import load_config

    backbone, kernel, options = parse_detector(name)
    own = 'softmax' if kernel == 'mmdet' else kernel
    cfg = load_config(osp.join(_root(), 'configs', f'maskrcnn_{backbone}_{own}.py'))
    if kernel == 'mmdet':
        cfg.model.backbone = dict(MMDET_BACKBONES[backbone])
    else:
        cfg.model.backbone.pop('init_cfg', None)
    if 'nosr' in options:
        cfg.model.backbone['sr_ratios'] = [1] * len(cfg.model.backbone.get('sr_ratios', [8, 4, 2, 1]))
    for impl in ('explicit', 'factorised'):
        if impl in options:
            cfg.model.backbone['attn_cfg'] = _with_impl(cfg.model.backbone['attn_cfg'], impl)

    def no_sync(node):
        if isinstance(node, dict):
            for key, val in node.items():
                if key == 'norm_cfg' and isinstance(val, dict) and val.get('type') == 'SyncBN':
                    node[key] = dict(val, type='BN')
                else:
                    no_sync(val)
        elif isinstance(node, (list, tuple)):
            for val in node:
                no_sync(val)

    no_sync(cfg.model)
    return cfg


def detector_batch(size: Tuple[int, int], batch: int, seed: int = 0):
    """``batch`` random images of ``size`` (uint8, as the pipelines give them) with 5 ground-truth boxes each and
    masks that do not fill their boxes."""
    import numpy as np
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    g = torch.Generator().manual_seed(seed)
    h, w = size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8))
        s = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0),
                                        pad_shape=(h, w), batch_input_shape=(h, w)))
        xy = torch.rand(5, 2, generator=g) * torch.tensor([w * 0.6, h * 0.6])
        wh = (0.1 + 0.3 * torch.rand(5, 2, generator=g)) * torch.tensor([w, h])
        boxes = torch.cat([xy, xy + wh], 1)
        masks = np.zeros((5, h, w), np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.round().int().tolist()):
            masks[i, y1:y2, x1:(x1 + x2) // 2 + 1] = 1
        s.gt_instances = InstanceData(bboxes=boxes, labels=torch.randint(0, 80, (5,), generator=g),
                                      masks=BitmapMasks(masks, h, w))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def detector_point(name: str, size: Tuple[int, int] = DETECTOR_SIZE, batch: int = 2, dtype: str = 'fp32',
                   device='cpu', repeats: int = 3, warmup: int = 2, profile: str = '') -> Dict:
    """One training step of a detector, measured in this process (``detector`` mode runs each in a fresh one):
    data preprocessing, the loss, backward and an AdamW step (lr 1e-4, wd 0.05), ``warmup`` steps first;
    the median step time over ``repeats``, images/s, and the allocator's peak over the timed steps (weights,
    optimizer state and activations: everything the step holds; CPU: the profiler's peak of one step beyond what
    was allocated before it). ``profile``: a folder where one more step's torch.profiler table is written
    (:func:`_profile`)."""
    import importlib

    import softfree_mm  # noqa: F401  (registers, applies compat)

    cfg = detector_config(name)
    importlib.import_module('mmdet.utils').register_all_modules(init_default_scope=True)
    from mmdet.registry import MODELS

    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model = model.to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    dt = DTYPES[dtype]
    amp = (torch.autocast(torch.device(device).type, dtype=dt) if dt in (torch.bfloat16, torch.float16)
           else contextlib.nullcontext())
    raw = detector_batch(size, batch)
    last = [float('nan')]

    def step():
        data = model.data_preprocessor(raw, True)
        with amp:
            losses = model(**data, mode='loss')
        total = sum(v.sum() if torch.is_tensor(v) else sum(x.sum() for x in v)
                    for k, v in losses.items() if 'loss' in k)
        optim.zero_grad(set_to_none=True)
        total.float().backward()
        optim.step()
        last[0] = float(total.detach())

    for _ in range(warmup):
        step()
    dev = torch.device(device)
    if dev.type == 'cuda':
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    times = [timed(step, device) for _ in range(repeats)]
    if dev.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(dev)
    else:
        peak = peak_memory(step, device)
    backbone, kernel, _ = parse_detector(name)
    sr = cfg.model.backbone.get('sr_ratios')
    layout = 'no reduction' if sr is not None and all(r == 1 for r in sr) else ''
    sec = statistics.median(times)
    prof = _profile(step, device, name, dtype, profile) if profile else None
    return dict(detector=name, backbone=backbone, kernel=kernel, layout=layout, profile=prof, impl='mmdet' if kernel == 'mmdet' else 'ours',
                size=f'{size[0]}x{size[1]}', batch=batch, dtype=dtype, device=str(device), timer=timer(device),
                step_ms=sec * 1e3, images_per_s=batch / sec, peak_MiB=peak / 2 ** 20,
                params_M=sum(p.numel() for p in model.parameters()) / 1e6, loss=last[0])


def _profile(step, device, name: str, dtype: str, folder: str, rows: int = 25) -> str:
    """One more step under torch.profiler: its top ``rows`` operators by self time (CUDA time on a GPU) as a
    table in ``folder``/profile_<name>_<dtype>.txt; the file's path."""
    import os
    import os.path as osp

    from torch.profiler import ProfilerActivity, profile as run_profile
    cuda = torch.device(device).type == 'cuda'
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with run_profile(activities=acts) as prof:
        step()
        if cuda:
            synchronize(torch.device(device))
    key = 'self_cuda_time_total' if cuda else 'self_cpu_time_total'
    os.makedirs(folder, exist_ok=True)
    path = osp.join(folder, f"profile_{name.replace(':', '_').replace('+', '_')}_{dtype}.txt")
    with open(path, 'w') as f:
        f.write(f'# one Mask R-CNN training step of {name} ({dtype}, {device}): top {rows} operators by '
                f'{key.replace("_", " ")}\n')
        f.write(prof.key_averages().table(sort_by=key, row_limit=rows))
    return path


def run_detectors(names: Sequence[str], size: Tuple[int, int] = DETECTOR_SIZE, batch: int = 2, dtype='fp32',
                  device='cpu', repeats: int = 3, log=None, profile: str = '') -> List[Dict]:
    """Every detector in a fresh Python process (one's peak memory and caches do not reach the next), then the
    ratios (:func:`detector_ratios`)."""
    rows = []
    for name in names:
        spec = dict(name=name, size=list(size), batch=batch, dtype=dtype, device=str(device), repeats=repeats,
                    profile=profile)
        row = in_fresh_process('detector', spec, dict(detector=name, size=f'{size[0]}x{size[1]}'))
        rows.append(row)
        if log:
            log(row)
    return detector_ratios(rows)


def detector_ratios(rows: List[Dict]) -> List[Dict]:
    """Per row: ``speed_vs_mmdet`` (its images/s over mmdet's backbone's in the same detector) and
    ``memory_vs_mmdet`` (its peak over mmdet's); ``speed_vs_softmax`` (over our softmax backbone's). The targets:
    softmax >= 1.0 of mmdet with no more memory; poly3 >= 0.8 of our softmax."""
    by = {r['detector']: r for r in rows if 'images_per_s' in r}
    for r in rows:
        if 'images_per_s' not in r:
            continue
        backbone = r['detector'].split(':')[0]
        # our softmax backbone of the same layout (PVTv2 without reduction: softmax+nosr)
        ref = by.get(f'{backbone}:mmdet')
        soft = by.get(f'{backbone}:softmax+nosr' if r.get('layout') == 'no reduction' else f'{backbone}:softmax')
        if ref is not None and r is not ref and r.get('layout') == ref.get('layout'):
            r['speed_vs_mmdet'] = r['images_per_s'] / ref['images_per_s']
            r['memory_vs_mmdet'] = r['peak_MiB'] / ref['peak_MiB']
        if soft is not None and r is not soft and r['kernel'] != 'mmdet':
            r['speed_vs_softmax'] = r['images_per_s'] / soft['images_per_s']
    return rows


DETECTOR_COLUMNS = ('detector', 'size', 'batch', 'dtype', 'step_ms', 'images_per_s', 'peak_MiB', 'speed_vs_mmdet',
                    'memory_vs_mmdet', 'speed_vs_softmax', 'params_M', 'layout', 'profile', 'error')

