"""Which converter a checkpoint kind uses, and which kind a file is (by the names a small model of each uses): both
read from what the backbone families declare (``Family(checkpoints=...)`` and the class's ``_convert``).

Each family holds its pure conversion function (``convert_<family>(state_dict) -> state_dict``) beside its model,
as timm does; this module unwraps files and dispatches to those functions.
"""
import contextlib
import logging
from collections import OrderedDict
from typing import Callable, Dict, List

import torch

from ..family import FAMILIES

WRAPPER_KEYS = ('state_dict_ema', 'model_ema', 'state_dict', 'model', 'module')


def _kinds() -> Dict[str, type]:
    """Checkpoint kind -> the backbone class that declares it: every family's first kind (its plain layout), then
    the others, each in declaration order (detection prefers the plainer layout among equal fits)."""
    ranked = sorted(((i, f, kind, cls) for f, cls in enumerate(FAMILIES.values())
                     for i, kind in enumerate(cls.family.checkpoints)), key=lambda t: t[:2])
    return {kind: cls for _, _, kind, cls in ranked}


def list_converters() -> List[str]:
    return sorted(_kinds())


def checkpoint_class(family: str) -> type:
    """The backbone class whose files a checkpoint kind (``family``) names."""
    kinds = _kinds()
    if family not in kinds:
        raise ValueError(f'unknown checkpoint family {family!r}; valid: {", ".join(sorted(kinds))}')
    return kinds[family]


def get_converter(family: str) -> Callable[[Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]:
    return checkpoint_class(family)._convert


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


def convert_whole_model(state_dict: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """A whole detector or segmentor of an official release (mmdet 2.x Mask R-CNN, mmseg 0.x UperNet / Semantic FPN:
    a bare or wrapped state dict with 'backbone.*' beside 'neck.*', 'rpn_head.*', 'roi_head.*', 'decode_head.*', ...)
    -> the state dict of our mmdet 3 / mmseg 1 model, which ``load_from`` loads: the backbone's keys through
    ``family``'s converter, every other key unchanged (mmdet 3 and mmseg 1 kept the 2.x / 0.x names of FPN, the RPN
    and RoI heads, UperNet's and Semantic FPN's heads and the auxiliary FCN head). Pure."""
    sd = unwrap_state_dict(state_dict, backbone_only=False)
    backbone = OrderedDict((k[len('backbone.'):], v) for k, v in sd.items() if k.startswith('backbone.'))
    if not backbone:
        raise ValueError(f'the checkpoint holds no backbone.* keys (e.g. {sorted(sd)[:3]}): it is no whole detector '
                         'or segmentor; convert a backbone release without --whole')
    out = OrderedDict(('backbone.' + k, v) for k, v in get_converter(family)(backbone).items())
    out.update((k, v) for k, v in sd.items() if not k.startswith('backbone.'))
    return out


def _pattern(key: str) -> str:
    return '.'.join('#' if part.isdigit() else part for part in key.split('.'))


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
        cls = checkpoint_class(family)
        with _no_build_notes():
            probe = cls(**cls.family.checkpoints[family])
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
    for family in _kinds():
        out = get_converter(family)(state_dict)
        share = family_match(family, out)
        if best is None or share > best[0] + 1e-9:
            best = (share, family, out)
    return best[1], best[2]


def _is_nonpersistent(key: str) -> bool:
    return key.endswith('relative_position_index') or key.endswith('attn_mask')
