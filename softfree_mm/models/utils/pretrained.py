"""``Pretrained`` loading of a backbone through its family's converter, mmdet's / mmseg's deprecated
``pretrained=PATH`` alias, ``init_cfg=dict(type='Scratch')`` and ``init_cfg=dict(type='ReleaseHead', ...)``."""
import warnings
from typing import Optional


PRETRAINED_KEYS = ('type', 'checkpoint', 'prefix', 'map_location')


class ScratchInit:
    """``init_cfg=dict(type='Scratch')``: train this module from its own initialisation, on purpose. The det / seg
    configs start their backbones from pretrained checkpoints; this is how a config says it does not. Registered
    in mmengine's weight initializers (softfree_mm/registry.py); it changes nothing (the constructors initialise).
    Keys a merged Pretrained base leaves behind (checkpoint, prefix, map_location) are ignored."""

    def __init__(self, checkpoint=None, prefix=None, map_location=None):
        pass

    def __call__(self, module):
        return module


# where a release file holds its linear classifier: mmpretrain's LinearClsHead, the official / timm models' head,
# torchvision's ResNets
HEAD_KEYS = (('head.fc.weight', 'head.fc.bias'), ('head.weight', 'head.bias'), ('fc.weight', 'fc.bias'))


class ReleaseHeadInit:
    """``init_cfg=dict(type='ReleaseHead', checkpoint=PATH_OR_URL)`` on a classifier head holding one
    ``nn.Linear`` (mmpretrain's LinearClsHead): the linear classifier of a release file (``head.fc.*`` in
    mmpretrain's layout, ``head.*`` in the official and timm ones). The warm start's stage 2 starts its head from the
    softmax release's, whose classes it keeps (what the small-scale evidence measured). A work dir stands for its
    last checkpoint; a file without such a head, or one of another shape, is one line naming both."""

    def __init__(self, checkpoint: str, map_location: str = 'cpu'):
        if not isinstance(checkpoint, str) or not checkpoint:
            raise ValueError(f"ReleaseHead: checkpoint must be a release's path or URL, got {checkpoint!r}")
        self.checkpoint, self.map_location = checkpoint, map_location

    def __call__(self, module):
        import os
        from urllib.parse import urlparse

        import torch

        from ..converters import fetch_release, read_checkpoint, resolve_checkpoint, unwrap_state_dict
        linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
        if len(linears) != 1:
            raise ValueError(f'ReleaseHead: {type(module).__name__} holds {len(linears)} linear layers; it loads one '
                             'linear classifier (a LinearClsHead)')
        fc = linears[0]
        path = fetch_release(self.checkpoint) if urlparse(self.checkpoint).scheme in ('http', 'https') else \
            resolve_checkpoint(self.checkpoint, 'ReleaseHead')
        if not os.path.isfile(path):
            from ..converters import missing_checkpoint_message
            raise FileNotFoundError(missing_checkpoint_message(path, 'ReleaseHead'))
        sd = unwrap_state_dict(read_checkpoint(path, self.map_location), backbone_only=False)
        keys = next((pair for pair in HEAD_KEYS if pair[0] in sd), None)
        if keys is None:
            raise ValueError(f'ReleaseHead: {self.checkpoint} holds no linear classifier (looked for '
                             f'{", ".join(k[0] for k in HEAD_KEYS)})')
        weight, bias = sd[keys[0]], sd.get(keys[1])
        if tuple(weight.shape) != tuple(fc.weight.shape) or (bias is None) != (fc.bias is None):
            raise ValueError(f'ReleaseHead: {self.checkpoint} holds a classifier of {tuple(weight.shape[::-1])} '
                             f'(in, out) features, {type(module).__name__} one of ({fc.in_features}, '
                             f'{fc.out_features}): the release and the classifier must have the same classes and width')
        with torch.no_grad():
            fc.weight.copy_(weight)
            if bias is not None:
                fc.bias.copy_(bias)
        return module


def init_from_cfg(module, convert_fn, prefer_ema: bool = False):
    """Handle a backbone's ``Pretrained`` init_cfg: load the checkpoint through the family's converter (unwrap,
    prefix, exact key report; a missing local file is a one-line error saying how to make it or opt out).
    Returns 'loaded' when it did, else None (mmengine's init applies, e.g. ``Scratch``)."""
    cfg = module.init_cfg
    if not (isinstance(cfg, dict) and cfg.get('type') == 'Pretrained'):
        return None
    name = type(module).__name__
    unknown = set(cfg) - set(PRETRAINED_KEYS)
    if unknown or not cfg.get('checkpoint'):
        raise ValueError(f"{name}: a Pretrained init_cfg takes 'checkpoint' (required), 'prefix', 'map_location'; "
                         f'got {sorted(cfg)}')
    from ..converters import load_pretrained
    load_pretrained(module, cfg['checkpoint'], convert_fn=convert_fn, prefix=cfg.get('prefix'),
                    map_location=cfg.get('map_location', 'cpu'), prefer_ema=prefer_ema)
    module._is_init = True
    return 'loaded'


def resolve_pretrained(owner: str, pretrained: Optional[str], init_cfg):
    """``init_cfg`` with mmdet's / mmseg's deprecated ``pretrained=PATH`` folded in (``dict(type='Pretrained',
    checkpoint=PATH)``); a FutureWarning once per class. Both at once is an error, as in mmdet and mmseg."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'{owner}: pretrained must be a checkpoint path (str) or None, got {pretrained!r}')
    if init_cfg is not None:
        raise ValueError(f'{owner}: pretrained={pretrained!r} and init_cfg={init_cfg!r} cannot both be given; use '
                         "init_cfg=dict(type='Pretrained', checkpoint=...) alone")
    if owner not in _WARNED_PRETRAINED:
        _WARNED_PRETRAINED.add(owner)
        warnings.warn(f"{owner}: 'pretrained' is deprecated (as in mmdet and mmseg), use "
                      f"init_cfg=dict(type='Pretrained', checkpoint={pretrained!r})", FutureWarning, stacklevel=3)
    return dict(type='Pretrained', checkpoint=pretrained)


_WARNED_PRETRAINED = set()
