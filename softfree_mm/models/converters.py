"""Official / timm checkpoint layouts -> ours: unwrapping, dispatch, and loading with an exact key report.

Each backbone file holds its own pure conversion function (``convert_<family>(state_dict) -> state_dict``),
next to the model it serves, as timm does; this module only unwraps files, dispatches by family name and
loads the result into a module, warning with the exact keys it could not place.
"""
import importlib
from collections import OrderedDict
from typing import Callable, Dict, Optional

import torch

# family name (as in tools/convert_checkpoint.py) -> (module, function)
_CONVERTERS = {
    'xcit': ('softfree_mm.models.backbones.xcit', 'convert_xcit'),
    'pvt': ('softfree_mm.models.backbones.pvt', 'convert_pvt'),
    'pvt_v2': ('softfree_mm.models.backbones.pvt', 'convert_pvt_v2'),
    'swin': ('softfree_mm.models.backbones.swin', 'convert_swin'),
    'cswin': ('softfree_mm.models.backbones.cswin', 'convert_cswin'),
}
WRAPPER_KEYS = ('state_dict_ema', 'model_ema', 'state_dict', 'model', 'module')


def list_converters():
    return sorted(_CONVERTERS)


def get_converter(family: str) -> Callable[[Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]:
    if family not in _CONVERTERS:
        raise ValueError(f'unknown checkpoint family {family!r}; valid: {", ".join(list_converters())}')
    mod, fn = _CONVERTERS[family]
    return getattr(importlib.import_module(mod), fn)


def unwrap_state_dict(obj, prefer_ema: bool = False, backbone_only: bool = True) -> Dict[str, torch.Tensor]:
    """A bare state dict from a checkpoint wrapped in 'model', 'state_dict', 'state_dict_ema' or bare.

    With ``prefer_ema`` the EMA weights are taken when present; otherwise 'state_dict' / 'model' come first.
    A leading 'module.' (DDP) is stripped. With ``backbone_only``, a whole-model checkpoint (a detector or
    segmentor: 'backbone.*' next to 'neck.*', 'roi_head.*', ...) gives its backbone: the 'backbone.*' keys, without
    the prefix.
    """
    order = WRAPPER_KEYS if prefer_ema else ('state_dict', 'model', 'module', 'state_dict_ema', 'model_ema')
    sd = obj
    if isinstance(obj, dict):
        for key in order:
            if key in obj and isinstance(obj[key], dict):
                sd = obj[key]
                break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError('checkpoint holds no state dict of tensors (looked for a bare dict or one under '
                         f"{list(WRAPPER_KEYS)})")
    out = OrderedDict()
    for k, v in sd.items():
        if k.startswith('module.'):
            k = k[len('module.'):]
        out[k] = v
    if backbone_only and any(k.startswith('backbone.') for k in out):
        out = OrderedDict((k[len('backbone.'):], v) for k, v in out.items() if k.startswith('backbone.'))
    return out


def _pattern(key: str) -> str:
    return '.'.join('#' if part.isdigit() else part for part in key.split('.'))


_PROBES = {  # family -> (class name, arch of the smallest preset): the names a converted file must mostly use
    'xcit': ('SoftFreeXCiT', 't12'), 'pvt': ('SoftFreePVT', 'tiny'), 'pvt_v2': ('SoftFreePVTv2', 'b0'),
    'swin': ('SoftFreeSwin', 'tiny'), 'cswin': ('SoftFreeCSWin', 'tiny'),
}


def family_match(family: str, state_dict: Dict[str, torch.Tensor]) -> float:
    """The share of converted keys whose name pattern (block indices as '#') our ``family`` backbone uses: near 1
    for a checkpoint of that family, low for another family's file."""
    from .. import models
    cls_name, arch = _PROBES[family]
    ours = {_pattern(k) for k in getattr(models, cls_name)(arch=arch).state_dict()}
    keys = [k for k in state_dict if not _is_nonpersistent(k)]
    return sum(_pattern(k) in ours for k in keys) / max(len(keys), 1)


def load_pretrained(module: torch.nn.Module, checkpoint: str, convert_fn: Optional[Callable] = None,
                    prefix: Optional[str] = None, logger=None, map_location='cpu'):
    """Load ``checkpoint`` into ``module``: unwrap, keep ``prefix`` keys (e.g. 'backbone.'), convert when the
    layout is not ours, drop shape mismatches, and warn with the exact lists of keys that were not placed.

    Returns ``(missing, unexpected, mismatched)``.
    """
    from mmengine.runner.checkpoint import CheckpointLoader  # loads files, http and mim-style paths
    from mmengine.logging import print_log

    raw = CheckpointLoader.load_checkpoint(checkpoint, map_location=map_location)
    sd = unwrap_state_dict(raw, backbone_only=not prefix)
    if prefix:
        if not prefix.endswith('.'):
            prefix += '.'
        sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
        if not sd:
            raise ValueError(f'checkpoint {checkpoint} has no key under prefix {prefix!r}')
    own = module.state_dict()
    if convert_fn is not None:  # converters map official/timm names and leave names already ours unchanged
        sd = convert_fn(sd)
    mismatched = [k for k, v in sd.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    for k in mismatched:
        sd.pop(k)
    missing, unexpected = module.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not _is_nonpersistent(k)]
    name = type(module).__name__
    for label, keys in (('missing in the checkpoint', missing), ('unexpected (not placed)', unexpected),
                        ('skipped for a shape mismatch', mismatched)):
        if keys:
            print_log(f'{name}: loading {checkpoint}: {len(keys)} key(s) {label}: {sorted(keys)}',
                      logger=logger or 'current', level=30)
    return list(missing), list(unexpected), mismatched


def _is_nonpersistent(key: str) -> bool:
    return key.endswith('relative_position_index') or key.endswith('attn_mask')
