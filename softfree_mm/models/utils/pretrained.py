"""``Pretrained`` loading of a backbone through its family's converter, mmdet's / mmseg's deprecated
``pretrained=PATH`` alias, and ``init_cfg=dict(type='Scratch')``."""
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
