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


def detector_config(name: str):
    """The model config of a ``backbone:kernel`` detector (one of DETECTORS), without pretrained weights, with
    BatchNorm in place of SyncBN (one process)."""
    import os.path as osp

    from ...engine.config_checks import load_config

    backbone, _, kernel = name.partition(':')
    if name not in DETECTORS:
        raise ValueError(f"detector: unknown detector {name!r}; valid: {', '.join(DETECTORS)}")
    root = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))  # the repository
    own = 'softmax' if kernel == 'mmdet' else kernel
    cfg = load_config(osp.join(root, 'configs', f'maskrcnn_{backbone}_{own}.py'))
    if kernel == 'mmdet':
        cfg.model.backbone = dict(MMDET_BACKBONES[backbone])
    else:
        cfg.model.backbone.pop('init_cfg', None)

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
                   device='cpu', repeats: int = 3, warmup: int = 2) -> Dict:
    """One training step of a detector, measured in this process (``detector`` mode runs each in a fresh one):
    data preprocessing, the loss, backward and an AdamW step (lr 1e-4, wd 0.05), ``warmup`` steps first;
    the median step time over ``repeats``, images/s, and the allocator's peak over the timed steps (weights,
    optimizer state and activations: everything the step holds; CPU: the profiler's peak of one step beyond what
    was allocated before it)."""
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
    backbone, _, kernel = name.partition(':')
    sec = statistics.median(times)
    return dict(detector=name, backbone=backbone, kernel=kernel, impl='mmdet' if kernel == 'mmdet' else 'ours',
                size=f'{size[0]}x{size[1]}', batch=batch, dtype=dtype, device=str(device), timer=timer(device),
                step_ms=sec * 1e3, images_per_s=batch / sec, peak_MiB=peak / 2 ** 20,
                params_M=sum(p.numel() for p in model.parameters()) / 1e6, loss=last[0])


def run_detectors(names: Sequence[str], size: Tuple[int, int] = DETECTOR_SIZE, batch: int = 2, dtype='fp32',
                  device='cpu', repeats: int = 3, log=None) -> List[Dict]:
    """Every detector in a fresh Python process (one's peak memory and caches do not reach the next), then the
    ratios (:func:`detector_ratios`)."""
    rows = []
    for name in names:
        spec = dict(name=name, size=list(size), batch=batch, dtype=dtype, device=str(device), repeats=repeats)
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
        ref, soft = by.get(f'{backbone}:mmdet'), by.get(f'{backbone}:softmax')
        if ref is not None and r is not ref:
            r['speed_vs_mmdet'] = r['images_per_s'] / ref['images_per_s']
            r['memory_vs_mmdet'] = r['peak_MiB'] / ref['peak_MiB']
        if soft is not None and r is not soft and r['kernel'] != 'mmdet':
            r['speed_vs_softmax'] = r['images_per_s'] / soft['images_per_s']
    return rows


DETECTOR_COLUMNS = ('detector', 'size', 'batch', 'dtype', 'step_ms', 'images_per_s', 'peak_MiB', 'speed_vs_mmdet',
                    'memory_vs_mmdet', 'speed_vs_softmax', 'params_M', 'error')

