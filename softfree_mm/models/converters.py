"""Official / timm checkpoint layouts -> ours: unwrapping, dispatch, and loading with an exact key report.

Each backbone file holds its own pure conversion function (``convert_<family>(state_dict) -> state_dict``),
next to the model it serves, as timm does; this module only unwraps files, dispatches by family name (or detects
the family), fetches and reads release files, and loads the result into a module, warning with the exact keys it
could not place.
"""
import hashlib
import importlib
import math
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
    'swin': ('SoftFreeSwin', dict(arch='tiny', use_abs_pos_embed=True, **_SMALL)),  # mmdet / official ape files
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


def read_pretrained(module: torch.nn.Module, checkpoint: str, convert_fn: Optional[Callable] = None,
                    prefix: Optional[str] = None, map_location='cpu', prefer_ema: bool = False):
    """The state dict :func:`load_pretrained` puts into ``module``: ``checkpoint`` fetched (a release URL, once,
    cached), read, unwrapped (the EMA weights first with ``prefer_ema``), its ``prefix`` keys (e.g. 'backbone.')
    kept, converted when the layout is not ours."""
    from mmengine.runner.checkpoint import CheckpointLoader  # mim-style and other remote paths

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
    if convert_fn is not None:  # converters map official/timm names and leave names already ours unchanged
        sd = convert_fn(sd)
    return sd


def placement(module: torch.nn.Module, state_dict: Dict[str, torch.Tensor]):
    """``(missing, unexpected, mismatched)`` keys of loading ``state_dict`` into ``module`` (non-persistent
    buffers aside)."""
    own = module.state_dict()
    mismatched = [k for k, v in state_dict.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in state_dict and not _is_nonpersistent(k)]
    unexpected = [k for k in state_dict if k not in own]
    return missing, unexpected, mismatched


def load_pretrained(module: torch.nn.Module, checkpoint: str, convert_fn: Optional[Callable] = None,
                    prefix: Optional[str] = None, logger=None, map_location='cpu', prefer_ema: bool = False):
    """Load ``checkpoint`` into ``module`` (read as :func:`read_pretrained` does); a file of another architecture
    (depths, widths, heads) is one error naming it (:func:`check_arch`); otherwise shape mismatches are dropped
    and the exact lists of keys that were not placed are warned about.

    Returns ``(missing, unexpected, mismatched)``.
    """
    from mmengine.logging import print_log

    name = type(module).__name__
    sd = read_pretrained(module, checkpoint, convert_fn, prefix, map_location, prefer_ema)
    check_arch(module, sd, checkpoint)  # another depth / width / heads: one error, not a list of shape mismatches
    own = module.state_dict()
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


# ---------------------------------------------------------------------- the architecture a file holds
# Read from a converted state dict (our layout): per stage the number of blocks, the width, the heads where a
# tensor shows them (relative position bias tables, InLine's residual convs, SOFT's landmark convs, XCiT's
# temperatures), the MLP ratio, PVT's spatial reduction; and what else sizes a tensor (Swin's window, PVT v1's
# position table, XCiT's patch size). A model is described the same way from its own state dict (heads from its
# attributes), so that a file of another architecture is one error naming both and the arguments that fit the file.
_STAGE_FIELDS = ('depth', 'dim', 'heads', 'mlp', 'sr')


def _shape(t, dim=0):
    return None if t is None else int(t.shape[dim])


def _by_block(sd, pattern) -> Dict[int, Dict[int, Dict[str, torch.Tensor]]]:
    """stage -> block -> {rest of the key: tensor} for the keys ``pattern`` matches (groups: stage, block, rest)."""
    out: Dict[int, Dict[int, Dict[str, torch.Tensor]]] = {}
    for k, v in sd.items():
        m = pattern.match(k)
        if m:
            out.setdefault(int(m.group(1) or 0), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
    return out


def _ratio(a, b):
    return None if a is None or not b else round(a / b, 4)


def _heads_from_residual(t):
    """InLine's residual: a grouped 1x1 conv (C, C / heads, 1)."""
    return None if t is None else int(t.shape[0]) // int(t.shape[1])


def _stage_info(blocks: Dict[int, Dict[str, torch.Tensor]], heads_of, extra=None) -> dict:
    """depth, dim, heads, mlp of one stage's blocks; ``heads_of(params)`` reads one block's heads (or None)."""
    if not blocks:
        return dict(depth=0, dim=None, heads=None, mlp=None, sr=None)
    first = blocks[min(blocks)]
    dim = _shape(first.get('norm1.weight'))
    heads = next((h for h in (heads_of(blocks[j]) for j in sorted(blocks)) if h is not None), None)
    info = dict(depth=max(blocks) + 1, dim=dim, heads=heads, mlp=_ratio(_shape(first.get('mlp.fc1.weight')), dim),
                sr=None)
    if extra:
        info.update(extra(first))
    return info


def _seq(value, depths):
    """A per-stage setting (one value, or one per stage whose entry may be one per block) as one list per stage."""
    stages = list(value) if isinstance(value, (list, tuple)) else [value] * len(depths)
    return [list(v) if isinstance(v, (list, tuple)) else [v] * d for v, d in zip(stages, depths)]


def _kind(cfg) -> str:
    return cfg if isinstance(cfg, str) else cfg.get('type') if isinstance(cfg, dict) else 'softmax'


def _inline_kinds(by, n, key) -> tuple:
    """Per stage, per block: 'inline' where the block holds InLine's residual (at ``key``), else not known."""
    return tuple(tuple('inline' if key in by.get(i, {}).get(j, {}) else None for j in range(max(by.get(i, {0: 0})) + 1))
                 for i in range(n))


def _preset_kinds(p) -> tuple:
    """Per stage, per block of a preset with one kernel per stage: 'inline' or 'softmax'."""
    cfgs = _seq(p.get('attn_cfg', 'softmax'), p['depths'])
    return tuple(tuple('inline' if _kind(c) == 'inline' else 'softmax' for c in cs) for cs in cfgs)


class _ArchSpec:
    """How one backbone class's architecture shows in its state dict, its presets, and the arguments that build
    another one."""
    cls_name = ''
    staged = True
    preset_fields = ('depth', 'dim', 'heads')  # the per-stage fields a preset fixes
    global_preset_fields = ()  # the same for whole-model settings
    arg_defaults: Dict[str, tuple] = {}  # whole-model setting -> (argument name, its default) outside the presets
    fills_heads = False  # heads the file does not show are assumed (SOFT's arch dict needs them all)

    _KEY = re.compile(r'^stages\.(\d+)\.blocks\.(\d+)\.(.*)$')

    def signature(self, stage: int, params: Dict[str, torch.Tensor]) -> bool:
        """A block of this family (so that another family's file is left to the key report)."""
        raise NotImplementedError

    def blocks(self, sd):
        by = _by_block(sd, self._KEY)
        if not by or not all(self.signature(i, b[min(b)]) for i, b in by.items()):
            return None
        return by

    def info(self, sd) -> Optional[dict]:
        raise NotImplementedError

    def preset_info(self, preset: dict) -> dict:
        raise NotImplementedError

    def model_info(self, module) -> Optional[dict]:
        info = self.info(module.state_dict())
        if info is not None:
            heads = module.num_heads if isinstance(module.num_heads, (list, tuple)) else (module.num_heads,)
            for st, h in zip(info['stages'], heads):
                st['heads'] = int(h)
        return info

    def overrides(self, info: dict, base: str, base_info: dict, heads) -> 'OrderedDict[str, object]':
        raise NotImplementedError

    def twin_note(self, base: str, twins: list) -> str:
        return 'the file may as well be a ' + ' or '.join(f'arch={n!r}' for n in twins) + ' variant'

    @property
    def zoo(self) -> Dict[str, dict]:
        from .. import models
        return getattr(models, self.cls_name).arch_zoo


class _SwinSpec(_ArchSpec):
    cls_name = 'SoftFreeSwin'
    arg_defaults = {'window': ('window_size', 7), 'mlp': ('mlp_ratio', 4.0)}

    def signature(self, i, p):
        return 'attn.qkv.weight' in p

    @staticmethod
    def _block_kind(p):
        if 'attn.kernel.residual.0.weight' in p:
            return 'inline'
        return 'softmax' if 'attn.relative_position_bias_table' in p else None

    @staticmethod
    def _heads(p):
        """From the relative position bias table ((2W-1)^2, heads) or InLine's residual."""
        t = p.get('attn.relative_position_bias_table')
        return _heads_from_residual(p.get('attn.kernel.residual.0.weight')) if t is None else _shape(t, 1)

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages, kinds, windows = [], [], set()
        for i in range(max(by) + 1):
            blocks = by.get(i, {})
            stages.append(_stage_info(blocks, self._heads))
            kinds.append(tuple(self._block_kind(blocks.get(j, {})) for j in range(stages[-1]['depth'])))
            for p in blocks.values():
                t = p.get('attn.relative_position_bias_table')
                if t is not None:
                    windows.add((math.isqrt(int(t.shape[0])) + 1) // 2)
        mlps = {s['mlp'] for s in stages if s['mlp'] is not None}
        return dict(stages=stages, kinds=tuple(kinds), window=windows.pop() if len(windows) == 1 else None,
                    mlp=mlps.pop() if len(mlps) == 1 else None)

    def preset_info(self, p):
        depths, e = p['depths'], p['embed_dims']
        cfgs, glob = _seq(p.get('attn_cfg', 'softmax'), depths), _seq(p.get('global_window', False), depths)
        kinds = tuple(tuple('inline' if _kind(c) == 'inline' else 'softmax' if _kind(c) == 'softmax' and not g
                            else None for c, g in zip(cs, gs)) for cs, gs in zip(cfgs, glob))
        return dict(stages=[dict(depth=d, dim=e * 2 ** i, heads=h) for i, (d, h) in
                            enumerate(zip(depths, p['num_heads']))], kinds=kinds)

    def overrides(self, info, base, base_info, heads):
        kw = OrderedDict()
        dims = [s['dim'] for s in info['stages']]
        depths = tuple(s['depth'] for s in info['stages'])
        if dims != [s['dim'] for s in base_info['stages']] and dims[0] is not None:
            kw['embed_dims'] = dims[0]
        if depths != tuple(s['depth'] for s in base_info['stages']):
            kw['depths'] = depths
            preset = self.zoo[base]
            if any(isinstance(v, (list, tuple)) for v in _flat_entries(preset.get('attn_cfg'))):
                # the preset sets its kernels block by block: give them for the file's blocks
                cfg, glob = [], []
                for i, ks in enumerate(info['kinds']):
                    first = _seq(preset['attn_cfg'], preset['depths'])[i][0] if i < len(preset['depths']) else 'softmax'
                    ks = [k or _kind(first) for k in ks]
                    cfg.append(ks[0] if len(set(ks)) == 1 else tuple(ks))
                    g = [k == 'inline' for k in ks]
                    glob.append(g[0] if len(set(g)) == 1 else tuple(g))
                kw['attn_cfg'], kw['global_window'] = tuple(cfg), tuple(glob)
        if heads is not None and list(heads) != [s['heads'] for s in base_info['stages']]:
            kw['num_heads'] = tuple(heads)
        return kw


def _flat_entries(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


class _CSWinSpec(_ArchSpec):
    cls_name = 'SoftFreeCSWin'
    arg_defaults = {'mlp': ('mlp_ratio', 4.0)}

    def signature(self, i, p):
        return 'qkv.weight' in p and any(k.startswith('branches.') for k in p)

    @staticmethod
    def _heads(p):
        branches = {k.split('.')[1] for k in p if k.startswith('branches.')}
        r = _heads_from_residual(p.get('branches.0.kernel.residual.0.weight'))
        return None if r is None else r * len(branches)

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [_stage_info(by.get(i, {}), self._heads) for i in range(max(by) + 1)]
        mlps = {s['mlp'] for s in stages if s['mlp'] is not None}
        return dict(stages=stages, mlp=mlps.pop() if len(mlps) == 1 else None,
                    kinds=_inline_kinds(by, len(stages), 'branches.0.kernel.residual.0.weight'))

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=p['embed_dims'] * 2 ** i, heads=h) for i, (d, h) in
                            enumerate(zip(p['depths'], p['num_heads']))], kinds=_preset_kinds(p))

    overrides = _SwinSpec.overrides  # the same arguments: embed_dims (stage 0), depths, num_heads


class _PVTSpec(_ArchSpec):
    cls_name = 'SoftFreePVT'
    preset_fields = ('depth', 'dim', 'heads', 'mlp', 'sr')
    arg_defaults = {'positions': ('pretrain_img_size', 224)}

    def signature(self, i, p):
        return 'attn.q.weight' in p and 'attn.kv.weight' in p and 'mlp.dwconv.weight' not in p

    @staticmethod
    def _sr(p):
        t = p.get('attn.sr.weight')
        return dict(sr=1 if t is None else int(t.shape[-1]))

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [_stage_info(by.get(i, {}), lambda p: _heads_from_residual(p.get('attn.kernel.residual.0.weight')),
                              self._sr) for i in range(max(by) + 1)]
        pos = sd.get('stages.0.pos_embed')
        return dict(stages=stages, positions=_shape(pos, 1), linear=None,
                    kinds=_inline_kinds(by, len(stages), 'attn.kernel.residual.0.weight'))

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=c, heads=h, mlp=float(m), sr=r) for d, c, h, m, r in
                            zip(p['depths'], p['embed_dims'], p['num_heads'], p['mlp_ratios'], p['sr_ratios'])],
                    linear=bool(p.get('linear', False)), kinds=_preset_kinds(p))

    def overrides(self, info, base, base_info, heads):
        kw = OrderedDict()
        for field, arg in (('dim', 'embed_dims'), ('depth', 'depths'), ('mlp', 'mlp_ratios'), ('sr', 'sr_ratios')):
            vals = [s[field] for s in info['stages']]
            if field == 'sr' and info.get('linear'):
                continue
            if None not in vals and vals != [s[field] for s in base_info['stages']]:
                kw[arg] = tuple(_num(v) for v in vals)
        if heads is not None and list(heads) != [s['heads'] for s in base_info['stages']]:
            kw['num_heads'] = tuple(heads)
        if info.get('linear') is not None and info['linear'] != base_info.get('linear', False):
            kw['linear'] = info['linear']
        return kw


class _PVTv2Spec(_PVTSpec):
    cls_name = 'SoftFreePVTv2'
    global_preset_fields = ('linear',)
    arg_defaults = {}

    def signature(self, i, p):
        return 'attn.q.weight' in p and 'attn.kv.weight' in p and 'mlp.dwconv.weight' in p

    @staticmethod
    def _sr(p):
        t = p.get('attn.sr.weight')
        if t is not None and int(t.shape[-1]) == 1:  # linear SRA: a 1x1 conv after a 7x7 pool
            return dict(sr=None, linear=True)
        return dict(sr=1 if t is None else int(t.shape[-1]), linear=False)

    def info(self, sd):
        info = super().info(sd)
        if info is not None:
            flags = {s.pop('linear', None) for s in info['stages']} - {None}
            info['linear'] = flags.pop() if len(flags) == 1 else None
            info['positions'] = None
            if info['linear']:
                for s in info['stages']:
                    s['sr'] = None
        return info

    def model_info(self, module):
        info = super().model_info(module)
        if info is not None:
            info['linear'] = bool(module.linear)
        return info


class _XCiTSpec(_ArchSpec):
    cls_name = 'SoftFreeXCiT'
    staged = False
    arg_defaults = {'patch': ('patch_size', 16), 'mlp': ('mlp_ratio', 4.0)}
    _KEY = re.compile(r'^()blocks\.(\d+)\.(.*)$')

    def signature(self, i, p):
        return 'attn.temperature' in p

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stage = _stage_info(by[0], lambda p: _shape(p.get('attn.temperature')))
        convs = sum(1 for k in sd if re.match(r'^patch_embed\.proj\.\d+\.0\.weight$', k))
        return dict(stages=[stage], patch={4: 16, 3: 8}.get(convs), mlp=stage['mlp'])

    def preset_info(self, p):
        return dict(stages=[dict(depth=p['depth'], dim=p['embed_dims'], heads=p['num_heads'])])

    def overrides(self, info, base, base_info, heads):
        kw = OrderedDict()
        st, bs = info['stages'][0], base_info['stages'][0]
        for field, arg in (('dim', 'embed_dims'), ('depth', 'depth')):
            if st[field] is not None and st[field] != bs[field]:
                kw[arg] = st[field]
        if heads is not None and heads[0] != bs['heads']:
            kw['num_heads'] = heads[0]
        return kw


class _SOFTSpec(_ArchSpec):
    cls_name = 'SoftFreeSOFT'
    fills_heads = True

    def signature(self, i, p):
        return ('attn.v.weight' if i < 3 else 'attn.kv.weight') in p

    @staticmethod
    def _heads(p):
        conv = p.get('attn.kernel.v_conv.weight')
        if conv is not None:
            return _shape(conv)
        lm, dim = p.get('attn.kernel.landmark_conv.weight'), _shape(p.get('norm1.weight'))
        return None if lm is None or not dim else dim // int(lm.shape[0])

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [_stage_info(by.get(i, {}), self._heads) for i in range(max(by) + 1)]
        for s in stages:
            s['mlp'] = None  # fixed at 4 in stages 1-3; stage 4's is not a preset setting
        return dict(stages=stages)

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=c, heads=h) for d, c, h in
                            zip(p['depths'], p['embed_dims'], p['num_heads'])])

    def overrides(self, info, base, base_info, heads):
        same = all(s[f] == b[f] for s, b in zip(info['stages'], base_info['stages']) for f in ('depth', 'dim'))
        same = same and len(info['stages']) == len(base_info['stages'])
        if same and list(heads) == [b['heads'] for b in base_info['stages']]:
            return OrderedDict()
        arch = dict(embed_dims=tuple(s['dim'] for s in info['stages']),
                    depths=tuple(s['depth'] for s in info['stages']),
                    num_heads=tuple(heads))
        if self.zoo[base].get('normalized'):
            arch['normalized'] = True
        return OrderedDict(arch=arch)

    def twin_note(self, base, twins):
        return 'add normalized=True for a SOFT-Norm file (the file does not show which)'


_SPECS = {s.cls_name: s for s in (_SwinSpec(), _CSWinSpec(), _PVTSpec(), _PVTv2Spec(), _XCiTSpec(), _SOFTSpec())}


def _num(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _spec(target) -> Optional[_ArchSpec]:
    """The spec of a module, a class, a class name or a converter family (None when no spec knows it)."""
    if isinstance(target, str):
        return _SPECS.get(_PROBES[target][0] if target in _PROBES else target)
    for cls in (target if isinstance(target, type) else type(target)).__mro__:
        if cls.__name__ in _SPECS:
            return _SPECS[cls.__name__]
    return None


def arch_of(target, state_dict: Dict[str, torch.Tensor]) -> Optional[dict]:
    """What a converted state dict holds, read for ``target`` (a backbone module, class, class name or converter
    family): ``{'stages': [{'depth', 'dim', 'heads', 'mlp', 'sr'}, ...], ...}`` with None where the file does not
    show a value; None when the file holds no block of that family."""
    spec = _spec(target)
    return None if spec is None else spec.info(state_dict)


def _differs(a, b) -> bool:
    """Both known and different (ratios compared to 1e-3)."""
    if a is None or b is None:
        return False
    return abs(a - b) > 1e-3 if isinstance(a, float) or isinstance(b, float) else a != b


def _variant(arch) -> set:
    """The preset family words of an arch ('inline', 'norm', 'li'), to rank presets the file cannot tell apart."""
    if isinstance(arch, dict):
        return {'norm'} if arch.get('normalized') else set()
    return set(arch.split('_')) & {'inline', 'norm', 'li'} if isinstance(arch, str) else set()


def _kind_clashes(info, pinfo) -> int:
    fk, pk = info.get('kinds') or (), pinfo.get('kinds') or ()
    return sum(a is not None and b is not None and a != b for fs, ps in zip(fk, pk) for a, b in zip(fs, ps))


def _fits(spec, info, pinfo) -> bool:
    if len(info['stages']) != len(pinfo['stages']):
        return False
    if any(_differs(s.get(f), p.get(f)) for s, p in zip(info['stages'], pinfo['stages']) for f in spec.preset_fields):
        return False
    return not any(_differs(info.get(f), pinfo.get(f)) for f in spec.global_preset_fields) and \
        not _kind_clashes(info, pinfo)


def _agreement(spec, info, pinfo) -> int:
    return sum(s.get(f) is not None and not _differs(s.get(f), p.get(f))
               for s, p in zip(info['stages'], pinfo['stages']) for f in spec.preset_fields)


def _image_size(tokens: Optional[int]) -> Optional[int]:
    """The input size of a square stage-1 position table (stride 4); None when it is not square."""
    if tokens is None:
        return None
    side = math.isqrt(tokens)
    return side * 4 if side * side == tokens else None


def fitting_args(target, info: dict, model=None):
    """``(presets, kwargs, notes)``: the presets of ``target``'s class the file fits (several where the file cannot
    tell them apart, e.g. SOFT and SOFT-Norm), and the keyword arguments that build a model the file fits: the
    first fitting preset, or (none fits) the closest preset with the file's depths / widths / heads. ``model``
    (the module a file is loaded into) ranks equal fits by its own preset family and lends its heads where the
    file does not show them."""
    spec = _spec(target)
    zoo = spec.zoo
    pinfos = {n: spec.preset_info(p) for n, p in zoo.items()}
    want = _variant(getattr(model, 'arch', None)) if model is not None else None

    def rank(n):  # the file's block kinds, then the model's preset family, then the model's own preset
        return (_kind_clashes(info, pinfos[n]), 0 if want is None else len(want ^ _variant(n)),
                0 if model is None or getattr(model, 'arch', None) == n else 1)
    fits = [n for n in zoo if _fits(spec, info, pinfos[n])]
    notes = []
    if fits:
        best = min(rank(n) for n in fits)
        fits = [n for n in fits if rank(n) == best]
        base = fits[0]
    else:
        base = min(zoo, key=lambda n: (rank(n)[0], -_agreement(spec, info, pinfos[n])) + rank(n)[1:])
        twins = [n for n in zoo if n != base and pinfos[n] == pinfos[base]]
        if twins and model is None:  # presets with the same tensors: say which else it may be
            notes.append(spec.twin_note(base, twins))
    own = spec.model_info(model) if model is not None else None
    heads = []
    for i, s in enumerate(info['stages']):
        h = s['heads']
        for other in (own, pinfos[base]):  # a stage of the same width lends its heads
            if h is None and other is not None and i < len(other['stages']) and \
                    other['stages'][i]['dim'] == s['dim']:
                h = other['stages'][i]['heads']
        heads.append(h)
    kw = OrderedDict(arch=base)
    if not fits:
        unknown = [i for i, h in enumerate(heads) if h is None]
        if unknown and spec.fills_heads:  # the closest preset's head width
            for i in unknown:
                b = pinfos[base]['stages'][min(i, len(pinfos[base]['stages']) - 1)]
                width = b['dim'] // b['heads']
                dim = info['stages'][i]['dim']
                heads[i] = dim // width if dim and dim % width == 0 else b['heads']
        which = f"stage{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))}"
        if unknown and spec.fills_heads:
            notes.append(f"the file does not show the heads of {which} (assumed: "
                         f"{', '.join(str(heads[i]) for i in unknown)}, at the head width of arch={base!r})")
        elif unknown:
            notes.append(f'the file does not show the heads of {which} (give num_heads)')
        kw.update(spec.overrides(info, base, pinfos[base], None if unknown and not spec.fills_heads else heads))
    for field, (arg, default) in spec.arg_defaults.items():
        value = info.get(field)
        if field == 'positions':
            if value is not None and _image_size(value) is None:
                notes.append(f'{arg}: a position table of {value} tokens (not a square grid)')
            value = _image_size(value)
        if value is not None and _differs(value, default):
            kw[arg] = _num(value)
    return fits, kw, notes


def _fmt(v) -> str:
    if isinstance(v, dict):
        return 'dict(' + format_args(v) + ')'
    if isinstance(v, (tuple, list)):
        return '(' + ', '.join(_fmt(x) for x in v) + (',)' if len(v) == 1 else ')')
    return repr(_num(v))


def format_args(kwargs: dict) -> str:
    """Keyword arguments as a config writes them: ``arch='small', depths=(2, 2, 8, 2)``."""
    return ', '.join(f'{k}={_fmt(v)}' for k, v in kwargs.items())


def _fit_text(spec, fits, kw, notes) -> str:
    """``SoftFreeSwin(arch='small')``, with the presets the file cannot tell apart, or the note that none fits."""
    text = f'{spec.cls_name}({format_args(kw)})'
    if len(fits) > 1:
        text += ' or ' + ' or '.join(f'arch={n!r}' for n in fits[1:]) + ' (the file does not show which)'
    elif not fits:
        text += ' (no preset has this architecture)'
    return text + ''.join(f'; {n}' for n in notes)


def describe_arch(target, info: dict) -> str:
    """One phrase for what the file holds: depths, widths, heads (? where not shown), and what else sizes it."""
    st = info['stages']

    def seq(field):
        vals = ['?' if s.get(field) is None else str(_num(s[field])) for s in st]
        return vals[0] if len(vals) == 1 else '(' + ', '.join(vals) + ')'
    if len(st) == 1:
        parts = [f"{st[0]['depth']} blocks", f'width {seq("dim")}', f'{seq("heads")} heads']
    else:
        parts = [f'depths {seq("depth")}', f'widths {seq("dim")}', f'heads {seq("heads")}']
    if any(s.get('mlp') is not None for s in st) and len({s.get('mlp') for s in st}) > 1:
        parts.append(f'MLP ratios {seq("mlp")}')
    elif st[0].get('mlp') is not None:
        parts.append(f"MLP ratio {_num(st[0]['mlp'])}")
    if any(s.get('sr') is not None for s in st):
        parts.append(f'spatial reduction {seq("sr")}')
    if info.get('linear'):
        parts.append('linear SRA')
    if info.get('window') is not None:
        parts.append(f"window {info['window']}")
    if info.get('positions') is not None:
        size = _image_size(info['positions'])
        parts.append(f"position tables for {size}x{size} inputs" if size else
                     f"a {info['positions']}-token position table")
    if info.get('patch') is not None:
        parts.append(f"patch size {info['patch']}")
    return ', '.join(parts)


def arch_report(family: str, state_dict: Dict[str, torch.Tensor]) -> Optional[str]:
    """'SoftFreeSwin(arch='small'): depths (2, 2, 18, 2), ...' for a converted file of ``family`` (None when the
    file holds no block of it)."""
    spec = _spec(family)
    info = None if spec is None else spec.info(state_dict)
    if info is None:
        return None
    fits, kw, notes = fitting_args(family, info)
    return f'{_fit_text(spec, fits, kw, notes)}: the file holds {describe_arch(family, info)}'


def _stage_text(s: Optional[dict], extra) -> str:
    if s is None:
        return 'no stage'
    text = f"{s['depth']} block{'' if s['depth'] == 1 else 's'} of {'?' if s['dim'] is None else s['dim']} channels"
    more = [f"{s['heads']} head{'' if s['heads'] == 1 else 's'}"] if s.get('heads') is not None else []
    if 'mlp' in extra and s.get('mlp') is not None:
        more.append(f"MLP ratio {_num(s['mlp'])}")
    if 'sr' in extra and s.get('sr') is not None:
        more.append(f"spatial reduction {s['sr']}")
    return text + (f" ({', '.join(more)})" if more else '')


_GLOBAL_TEXT = {'window': lambda v: f'window {v}', 'linear': lambda v: 'linear SRA' if v else 'strided SRA',
                'positions': lambda v: f'a position table of {v} tokens', 'patch': lambda v: f'patch size {v}'}


def arch_differences(module, state_dict: Dict[str, torch.Tensor]) -> Optional[list]:
    """Lines naming what the file holds against what ``module`` has, stage by stage, where they differ (depth,
    width, heads where the file shows them, MLP ratio, spatial reduction; Swin's window, PVT's position table,
    XCiT's patch size); [] when they agree, None when ``module`` has no spec or the file no block of its family."""
    spec = _spec(module)
    info = None if spec is None else spec.info(state_dict)
    if info is None:
        return None
    own = spec.model_info(module)
    rows = []
    fs, ms = info['stages'], own['stages']
    for i in range(max(len(fs), len(ms))):
        f, m = (fs[i] if i < len(fs) else None), (ms[i] if i < len(ms) else None)
        bad = [k for k in _STAGE_FIELDS if f is not None and m is not None and _differs(f.get(k), m.get(k))]
        if f is None or m is None or bad:
            where = f'stage {i}: ' if spec.staged else ''
            rows.append(f'{where}{_stage_text(f, bad)} in the file, {_stage_text(m, bad)} in the model')
    for k, text in _GLOBAL_TEXT.items():
        if _differs(info.get(k), own.get(k)):
            rows.append(f'{text(info[k])} in the file, {text(own[k])} in the model')
    return rows


def check_arch(module, state_dict: Dict[str, torch.Tensor], checkpoint: str) -> Optional[dict]:
    """Raise one ValueError when the converted ``state_dict`` holds another architecture than ``module`` (see
    :func:`arch_differences`), naming per stage what differs and the arguments that fit the file; returns the
    file's architecture (None when not known)."""
    rows = arch_differences(module, state_dict)
    if not rows:
        return None if rows is None else arch_of(module, state_dict)
    spec = _spec(module)
    info = spec.info(state_dict)
    fits, kw, notes = fitting_args(module, info, module)
    raise ValueError(f'{spec.cls_name}: checkpoint {checkpoint} holds another architecture than this model '
                     f'(arch={_fmt(getattr(module, "arch", None))}):\n  ' + ';\n  '.join(rows) +
                     f';\n  the file fits {_fit_text(spec, fits, kw, notes)}')


def check_model_checkpoint(model: torch.nn.Module, state_dict: Dict[str, torch.Tensor], checkpoint: str) -> list:
    """:func:`check_arch` for each softfree_mm backbone inside a whole model (a detector's ``backbone``) against
    its keys in a whole-model state dict (``load_from``, ``--resume``), converted as its Pretrained loading does.
    Returns ``[(module name, the file's architecture)]`` for the backbones the file has keys of."""
    found = []
    for name, m in model.named_modules():
        if not name or _spec(m) is None:
            continue
        sub = OrderedDict((k[len(name) + 1:], v) for k, v in state_dict.items() if k.startswith(name + '.'))
        if sub:
            convert = getattr(type(m), '_convert', None)
            found.append((name, check_arch(m, convert(sub) if convert else sub, checkpoint)))
    return found
