"""What the analysis tools share: a model from a config and a checkpoint, images through the config's test pipeline,
and one backbone forward per image with every attention call captured.

Bad input (config, checkpoint, image, split, layer) raises :class:`softfree_mm.engine.errors.UsageError` with one
line; the tools print it and exit with status 2.
"""
import os
import os.path as osp
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..engine import config_checks as checks
from ..engine.demo_data import make_demo
from ..engine.device import apply_device_settings
from ..engine.errors import UsageError, short_error

SPLITS = ('train', 'val', 'test')


def load_checked(config: str, cfg_options: Optional[dict] = None):
    """The checked config (kernels, model types); its default scope becomes the current one."""
    from mmengine.registry import init_default_scope

    cfg = checks.load_config(config, cfg_options)
    checks.check_attention(cfg)
    checks.check_model_types(cfg)
    apply_device_settings(cfg, 'none')
    init_default_scope(cfg.default_scope)
    return cfg


def check_checkpoint(checkpoint: str) -> None:
    if checkpoint != 'none' and not osp.isfile(checkpoint):
        raise UsageError(f'checkpoint not found: {checkpoint} (give a .pth file, or none for the initialised model)')


def build_model(cfg, checkpoint: str, config: str = '', device: str = 'cpu'):
    """The config's model in eval mode with the checkpoint's weights (``'none'``: ``init_weights``)."""
    from mmengine.registry import MODELS
    from mmengine.runner import load_checkpoint
    check_checkpoint(checkpoint)
    model_cfg = cfg.model
    if isinstance(model_cfg, dict) and cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)  # as the Runner merges it
    try:
        with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
            model = registry.build(model_cfg)
    except (KeyError, ValueError, TypeError) as e:
        raise UsageError(f'{config}: the model does not build: {short_error(e)}') from None
    if checkpoint == 'none':
        model.init_weights()
    else:
        try:
            load_checkpoint(model, checkpoint, map_location='cpu', strict=True, logger='silent')
        except Exception as e:  # missing / unexpected keys, shape mismatches, unreadable files
            raise UsageError(f'checkpoint {checkpoint} does not fit {config}: {short_error(e)}') from None
    return model.to(device).eval()


def _pipeline_cfg(cfg, split: str):
    loader = cfg.get(f'{split}_dataloader')
    if not loader:
        raise UsageError(f'--split {split}: the config has no {split}_dataloader (splits: '
                         f'{", ".join(s for s in SPLITS if cfg.get(f"{s}_dataloader"))})')
    return loader


def test_pipeline(cfg):
    """The test pipeline without annotation loading (one image file in, packed inputs out)."""
    from mmcv.transforms import Compose
    loader = cfg.get('test_dataloader') or cfg.get('val_dataloader')
    if not loader:
        raise UsageError('the config has no test_dataloader or val_dataloader: no test pipeline to read images with')
    steps = [t for t in _dataset_cfg(loader.dataset).get('pipeline', []) if 'LoadAnnotations' not in t['type']]
    return Compose(steps)


def _dataset_cfg(ds):
    while isinstance(ds, dict) and ds.get('pipeline') is None and isinstance(ds.get('dataset'), dict):
        ds = ds['dataset']
    return ds


def load_image(cfg, path: str) -> dict:
    if not osp.isfile(path):
        raise UsageError(f'image not found: {path}')
    import cv2
    if cv2.imread(path) is None:
        raise UsageError(f'not a readable image: {path}')
    return test_pipeline(cfg)(dict(img_path=path))


def build_dataset(cfg, split: str, config: str = ''):
    """The split's dataset (demo data written on demand); checked before any model is built."""
    from mmengine.registry import DATASETS
    if split not in SPLITS:
        raise UsageError(f'--split must be one of {", ".join(SPLITS)}, got {split!r}')
    loader = _pipeline_cfg(cfg, split)
    for root, subset in checks.demo_roots(cfg, (split, )):
        make_demo(root, subset)
    checks.check_data(cfg, (split, ))
    try:
        with DATASETS.switch_scope_and_registry(cfg.default_scope) as registry:
            ds = registry.build(loader.dataset)
    except Exception as e:
        raise UsageError(f'{config}: the {split} dataset does not build: {short_error(e)}') from None
    if len(ds) == 0:
        raise UsageError(f'{config}: the {split} dataset is empty')
    return ds


def dataset_samples(ds, num: int) -> Iterator[Tuple[str, dict]]:
    """(name, packed sample) for the first ``num`` samples of ``ds``."""
    for i in range(min(num, len(ds))):
        sample = ds[i]
        meta = sample['data_samples'].metainfo if hasattr(sample.get('data_samples'), 'metainfo') else {}
        yield osp.basename(meta.get('img_path', f'sample_{i}')), sample


def run_backbone(model, sample: dict, layers=None):
    """One image through the data preprocessor and the backbone with every attention call captured.
    Returns (the image as fed, RGB uint8 (H, W, 3), the capture)."""
    from mmengine.dataset import pseudo_collate

    from ..engine.hooks import AttentionCapture
    data = model.data_preprocessor(pseudo_collate([sample]), False)
    backbone = getattr(model, 'backbone', model)
    with AttentionCapture(backbone, layers=layers, prefix='backbone.' if backbone is not model else '') as cap:
        with torch.no_grad():
            backbone(data['inputs'])
    img = sample['inputs']
    img = img.numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    img = np.ascontiguousarray(img.transpose(1, 2, 0)[..., ::-1]) if img.ndim == 3 else img  # CHW BGR -> HWC RGB
    return img.astype(np.uint8), cap


def pick_layers(model, layer: Optional[str]) -> Optional[List[str]]:
    """--layer: a layer name (as listed by the tools) or an index into the list of attention layers."""
    from ..engine.hooks import attention_layers
    backbone = getattr(model, 'backbone', model)
    names = [n for n, _ in attention_layers(backbone, 'backbone.' if backbone is not model else '')]
    if not names:
        raise UsageError('the model holds no softfree_mm attention kernel')
    if layer is None:
        return None
    if layer.lstrip('-').isdigit():
        i = int(layer)
        if not -len(names) <= i < len(names):
            raise UsageError(f'--layer {layer}: the model has {len(names)} attention layers (0..{len(names) - 1})')
        return [names[i]]
    if layer not in names:
        raise UsageError(f'--layer {layer!r} is not an attention layer; layers: {", ".join(names)}')
    return [layer]


def positive(name: str, value, kind=int):
    if value is None or value <= 0:
        raise UsageError(f'{name} must be > 0, got {value!r}')
    return kind(value)


def out_paths(prefix: str, exts: Sequence[str] = ('csv', 'png')) -> List[str]:
    folder = osp.dirname(osp.abspath(prefix))
    os.makedirs(folder, exist_ok=True)
    return [f'{prefix}.{e}' for e in exts]
