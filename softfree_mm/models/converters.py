"""Official / timm checkpoint layouts -> ours: unwrapping, dispatch, and loading with an exact key report.

Each backbone file holds its own pure conversion function (``convert_<family>(state_dict) -> state_dict``),
next to the model it serves, as timm does; this module only unwraps files, dispatches by family name (or detects
the family), fetches and reads release files, and loads the result into a module, warning with the exact keys it
could not place.
"""
import hashlib
import importlib
import os
import re
from collections import OrderedDict
from typing import Callable, Dict, Optional
from urllib.parse import urlparse

import torch

# family name (as in tools/convert_checkpoint.py) -> (module, function)
_CONVERTERS = {
    'xcit': ('softfree_mm.models.backbones.xcit', 'convert_xcit'),
    'pvt': ('softfree_mm.models.backbones.pvt', 'convert_pvt'),
    'pvt_v2': ('softfree_mm.models.backbones.pvt', 'convert_pvt_v2'),
    'swin': ('softfree_mm.models.backbones.swin', 'convert_swin'),
    'cswin': ('softfree_mm.models.backbones.cswin', 'convert_cswin'),
    'soft': ('softfree_mm.models.backbones.soft', 'convert_soft'),
    # the official InLine releases (LeapLabTHU/InLine): their backbones' layouts plus the per-channel residual
    'inline_swin': ('softfree_mm.models.backbones.swin', 'convert_swin'),
    'inline_pvt': ('softfree_mm.models.backbones.pvt', 'convert_pvt'),
    'inline_cswin': ('softfree_mm.models.backbones.cswin', 'convert_cswin'),
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


_SMALL = dict(embed_dims=8, num_heads=(1, 1, 1, 1))
_SMALL4 = dict(embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1))
_PROBES = {  # family -> (class name, build arguments): a small model with every name a converted file may use
    'xcit': ('SoftFreeXCiT', dict(arch='t12', embed_dims=8, num_heads=1, norm_cfg=dict(type='BN'))),
    'pvt': ('SoftFreePVT', dict(arch='tiny', **_SMALL4)),
    'pvt_v2': ('SoftFreePVTv2', dict(arch='b0', **_SMALL4)),
    'swin': ('SoftFreeSwin', dict(arch='tiny', **_SMALL)),
    'cswin': ('SoftFreeCSWin', dict(arch='tiny', embed_dims=8, num_heads=(2, 2, 2, 2))),
    'soft': ('SoftFreeSOFT', dict(arch=dict(depths=(1, 1, 1, 1), **_SMALL4))),
    # InLine-Swin-B's layout holds both block kinds (InLine with the residual, softmax with the bias table)
    'inline_swin': ('SoftFreeSwin', dict(arch='inline_base', **_SMALL)),
    'inline_pvt': ('SoftFreePVT', dict(arch='inline_tiny', **_SMALL4)),
    'inline_cswin': ('SoftFreeCSWin', dict(arch='inline_tiny', embed_dims=8, num_heads=(2, 2, 2, 2))),
}
_PATTERNS: Dict[str, set] = {}


def _family_patterns(family: str) -> set:
    if family not in _PATTERNS:
        from .. import models
        cls_name, kwargs = _PROBES[family]
        _PATTERNS[family] = {_pattern(k) for k in getattr(models, cls_name)(**kwargs).state_dict()}
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


# ---------------------------------------------------------------------- release files
class ReleaseMetadata:
    """Stands in for the non-tensor objects official releases pickle next to their weights (the training
    script's ``argparse.Namespace`` or yacs ``CfgNode``): read as an OrderedDict (the items of a dict-like
    config, the attributes as attributes), so torch's weights-only unpickler can fill it; nothing is executed."""

    def __new__(cls, *args):
        return OrderedDict()


# what the seeds' release files hold besides tensors: timm-style savers (SOFT, CSWin) pickle the training args,
# Swin-style savers (InLine) the yacs config
RELEASE_METADATA = ('argparse.Namespace', 'yacs.config.CfgNode')


def read_checkpoint(path: str, map_location='cpu'):
    """A checkpoint file read with torch's weights-only unpickler; the metadata classes of the official releases
    (:data:`RELEASE_METADATA`) are read as plain dicts, nothing else is allowed."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as first:  # noqa: BLE001
        if 'Unsupported global' not in str(first) and 'was not an allowed global' not in str(first):
            raise
        with torch.serialization.safe_globals([(ReleaseMetadata, name) for name in RELEASE_METADATA]):
            return torch.load(path, map_location=map_location, weights_only=True)


def _drive_id(url: str) -> Optional[str]:
    m = re.search(r'drive\.google\.com/(?:file/d/([\w-]+)|(?:open|uc)\?(?:.*&)?id=([\w-]+))', url)
    return (m.group(1) or m.group(2)) if m else None


def release_file_name(url: str) -> str:
    """The cache file name of a release URL: the URL's file name, or (share links such as Tsinghua Cloud's
    ``/f/<id>/?dl=1`` or Google Drive's ``/file/d/<id>/view``) the id with '.pth'."""
    drive = _drive_id(url)
    if drive:
        return f'gdrive-{drive}.pth'
    parts = [p for p in urlparse(url).path.split('/') if p and p not in ('view', 'download')]
    name = parts[-1] if parts else hashlib.sha256(url.encode()).hexdigest()[:16]
    return name if '.' in name else name + '.pth'


def fetch_release(url: str) -> str:
    """Download a release URL once into torch hub's cache (``$TORCH_HOME/hub/checkpoints``) and return the path.
    Google Drive share links are fetched through Drive's direct-download address; a page that is not a checkpoint
    (Drive's quota or sign-in page) is a clear error naming the link to download by hand."""
    cache = os.path.join(torch.hub.get_dir(), 'checkpoints')
    path = os.path.join(cache, release_file_name(url))
    if os.path.isfile(path):
        return path
    os.makedirs(cache, exist_ok=True)
    drive = _drive_id(url)
    src = f'https://drive.usercontent.google.com/download?id={drive}&export=download&confirm=t' if drive else url
    tmp = path + '.part'
    torch.hub.download_url_to_file(src, tmp, progress=True)
    with open(tmp, 'rb') as f:
        head = f.read(2)
    if head not in (b'PK', b'\x80\x02', b'\x80\x03', b'\x80\x04', b'\x80\x05'):  # zip or pickle: a torch file
        os.remove(tmp)
        raise ValueError(f'{url} did not give a checkpoint file (a web page came back); download it by hand and set '
                         'model.backbone.init_cfg.checkpoint to the file')
    os.replace(tmp, path)
    return path


def missing_checkpoint_message(checkpoint: str, owner: str = 'backbone') -> str:
    """One line for a pretrained checkpoint path that does not exist: how to make it, or how to opt out."""
    make = ''
    for part in reversed(os.path.normpath(checkpoint).split(os.sep)[:-1]):
        if part.startswith('cls_'):
            make = f'make it with `python tools/train.py configs/{part}.py` (ImageNet), '
            break
    return (f'{owner}: pretrained checkpoint {checkpoint!r} does not exist; {make}point '
            'model.backbone.init_cfg.checkpoint at your own file, or train the backbone from scratch on purpose with '
            'model.backbone.init_cfg.type=Scratch')


def load_pretrained(module: torch.nn.Module, checkpoint: str, convert_fn: Optional[Callable] = None,
                    prefix: Optional[str] = None, logger=None, map_location='cpu', prefer_ema: bool = False):
    """Load ``checkpoint`` into ``module``: fetch a release URL (once, cached), unwrap (the EMA weights first with
    ``prefer_ema``), keep ``prefix`` keys (e.g. 'backbone.'), convert when the layout is not ours, drop shape
    mismatches, and warn with the exact lists of keys that were not placed.

    Returns ``(missing, unexpected, mismatched)``.
    """
    from mmengine.runner.checkpoint import CheckpointLoader  # mim-style and other remote paths
    from mmengine.logging import print_log

    name = type(module).__name__
    if urlparse(checkpoint).scheme in ('http', 'https'):
        raw = read_checkpoint(fetch_release(checkpoint), map_location)
    elif '://' not in checkpoint:
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(missing_checkpoint_message(checkpoint, name))
        raw = read_checkpoint(checkpoint, map_location)
    else:
        raw = CheckpointLoader.load_checkpoint(checkpoint, map_location=map_location)
    sd = unwrap_state_dict(raw, prefer_ema=prefer_ema, backbone_only=not prefix)
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
    for label, keys in (('missing in the checkpoint', missing), ('unexpected (not placed)', unexpected),
                        ('skipped for a shape mismatch', mismatched)):
        if keys:
            print_log(f'{name}: loading {checkpoint}: {len(keys)} key(s) {label}: {sorted(keys)}',
                      logger=logger or 'current', level=30)
    return list(missing), list(unexpected), mismatched


def _is_nonpersistent(key: str) -> bool:
    return key.endswith('relative_position_index') or key.endswith('attn_mask')
