"""Which converter a checkpoint family uses, and which family a file is (by the names a small model of each uses).

Each backbone file holds its family's pure conversion function (``convert_<family>(state_dict) -> state_dict``),
next to the model it serves, as timm does; this module unwraps files and dispatches to those functions.
"""
import contextlib
import importlib
import logging
from collections import OrderedDict
from typing import Callable, Dict

import torch

# family name (as in tools/convert_checkpoint.py) -> (module, function): ``convert_<family>`` in the backbone file
# of its name; the official InLine releases (LeapLabTHU/InLine) are their backbones' layouts plus the per-channel
# residual, converted by the same function
_CONVERTERS = {family: (f'softfree_mm.models.backbones.{family.split("_")[0]}', f'convert_{family}')
               for family in ('xcit', 'pvt', 'pvt_v2', 'swin', 'cswin', 'soft')}
_CONVERTERS.update({f'inline_{family}': _CONVERTERS[family] for family in ('swin', 'pvt', 'cswin')})
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


_SMALL = dict(embed_dims=8, num_heads=(1, 1, 1, 1))
_SMALL4 = dict(embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1))
_PROBES = {  # family -> (class name, build arguments): a small model with every name a converted file may use
    'xcit': ('SoftFreeXCiT', dict(arch='t12', embed_dims=8, num_heads=1, norm_cfg=dict(type='BN'))),
    'pvt': ('SoftFreePVT', dict(arch='tiny', **_SMALL4)),
    'pvt_v2': ('SoftFreePVTv2', dict(arch='b0', **_SMALL4)),
    'swin': ('SoftFreeSwin', dict(arch='tiny', use_abs_pos_embed=True, **_SMALL)),  # mmdet / official ape files
    'cswin': ('SoftFreeCSWin', dict(arch='tiny', embed_dims=8, num_heads=(2, 2, 2, 2))),
    'soft': ('SoftFreeSOFT', dict(arch=dict(depths=(1, 1, 1, 1), **_SMALL4))),
    # InLine-Swin-B's layout holds both block kinds (InLine with the residual, softmax with the bias table)
    'inline_swin': ('SoftFreeSwin', dict(arch='inline_base', **_SMALL)),
    'inline_pvt': ('SoftFreePVT', dict(arch='inline_tiny', **_SMALL4)),
    'inline_cswin': ('SoftFreeCSWin', dict(arch='inline_tiny', embed_dims=8, num_heads=(2, 2, 2, 2))),
}
_PATTERNS: Dict[str, set] = {}


class _BelowWarning(logging.Filter):
    def filter(self, record):
        return record.levelno >= logging.WARNING


@contextlib.contextmanager
def _no_build_notes():
    """mmengine's INFO notes of a probe model stay unlogged: they describe that model, not the user's, and a tool's
    output (``--print-arch``: one line) would otherwise hold them the first time a process builds each probe."""
    from mmengine.logging import MMLogger
    logger, drop = MMLogger.get_current_instance(), _BelowWarning()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _family_patterns(family: str) -> set:
    if family not in _PATTERNS:
        from ... import models
        cls_name, kwargs = _PROBES[family]
        with _no_build_notes():
            probe = getattr(models, cls_name)(**kwargs)
        _PATTERNS[family] = {_pattern(k) for k in probe.state_dict()}
    return _PATTERNS[family]


def unplaced_keys(family: str, state_dict: Dict[str, torch.Tensor]) -> list:
    """Converted keys whose name pattern (block indices as '#') no ``family`` backbone uses."""
    ours = _family_patterns(family)
    return [k for k in state_dict if not _is_nonpersistent(k) and _pattern(k) not in ours]


def family_match(family: str, state_dict: Dict[str, torch.Tensor]) -> float:
    """The share of converted keys whose name pattern our ``family`` backbone uses: near 1 for a checkpoint of
    that family, low for another family's file."""
    keys = [k for k in state_dict if not _is_nonpersistent(k)]
    return 1.0 - len(unplaced_keys(family, state_dict)) / max(len(keys), 1)


def detect_family(state_dict: Dict[str, torch.Tensor]):
    """(family, converted state dict) for the family whose converted names fit the file best; among equal fits the
    plainer layout (a softmax Swin file fits both 'swin' and 'inline_swin')."""
    best = None
    for family in ('xcit', 'pvt', 'pvt_v2', 'swin', 'cswin', 'soft', 'inline_swin', 'inline_pvt', 'inline_cswin'):
        out = get_converter(family)(state_dict)
        share = family_match(family, out)
        if best is None or share > best[0] + 1e-9:
            best = (share, family, out)
    return best[1], best[2]


def _is_nonpersistent(key: str) -> bool:
    return key.endswith('relative_position_index') or key.endswith('attn_mask')
