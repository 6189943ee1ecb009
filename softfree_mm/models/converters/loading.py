"""Reading checkpoint files (official releases included, fetched once) and loading one into a backbone, with an
exact report of the keys it could not place."""
import hashlib
import os
import re
from collections import OrderedDict
from typing import Callable, Dict, Optional
from urllib.parse import urlparse

import torch

from ...files import download_torch_file
from .arch import check_arch
from .detect import _is_nonpersistent, unwrap_state_dict

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
    download_torch_file(src, path, lambda: ValueError(
        f'{url} did not give a checkpoint file (a web page came back); download it by hand and set '
        'model.backbone.init_cfg.checkpoint to the file'))
    return path


CHECKPOINT_NAME = re.compile(r'^(iter|epoch)_(\d+)\.pth$')  # mmengine's CheckpointHook's names: (unit, count)


def checkpoints_in(work_dir: str):
    """The checkpoints of a run's work dir, the one to take first first: the one its ``last_checkpoint`` names
    (written by mmengine, relative to where the run was started or absolute; the file of that name in the folder when
    the folder has moved), then the ``iter_*`` / ``epoch_*`` files, newest count first."""
    found = []
    marker = os.path.join(work_dir, 'last_checkpoint')
    if os.path.isfile(marker):
        with open(marker) as f:
            named = f.read().strip()
        for path in (named, os.path.join(work_dir, os.path.basename(named))) if named else ():
            if os.path.isfile(path):
                found.append(path)
                break
    counted = []
    for name in os.listdir(work_dir) if os.path.isdir(work_dir) else ():
        m = CHECKPOINT_NAME.match(name)
        if m:
            path = os.path.join(work_dir, name)
            counted.append((int(m.group(2)), os.path.getmtime(path), path))
    found += [p for _, _, p in sorted(counted, reverse=True) if not any(os.path.samefile(p, q) for q in found)]
    return found


def resolve_checkpoint(checkpoint: str, owner: str = 'backbone') -> str:
    """A checkpoint file, or the work dir of the run that writes it (a warm-start stage's folder: its last
    checkpoint, so that no config hard-codes an iteration count); a folder without one is one line naming it."""
    if not os.path.isdir(checkpoint):
        return checkpoint
    found = checkpoints_in(checkpoint)
    if not found:
        raise FileNotFoundError(missing_checkpoint_message(checkpoint, owner))
    return found[0]


def missing_checkpoint_message(checkpoint: str, owner: str = 'backbone', release: Optional[str] = None,
                               config: Optional[str] = None, launch: str = '', cost: str = '',
                               note: str = '') -> str:
    """One line for a pretrained checkpoint path that does not exist: how to make it, or how to opt out. A path in a
    ``work_dirs/<config name>/`` folder names the config that writes it: a ``finetune_*`` one (the warm start's
    stage 2) both stages and, given the config's ``softmax_release``, the start from that release with the kernel
    swapped; a ``transfer_*`` one stage 1; a ``cls_*`` one the ImageNet pretraining. The engine adds what it knows of
    the warm start: ``launch`` (the tool's options its scale needs), ``cost`` (of both stages), ``note`` (where the
    layout's default recipe was measured, when not on this layout)."""
    parts = os.path.normpath(checkpoint).split(os.sep)
    name = next((part for part in reversed(parts if os.path.splitext(parts[-1])[1] != '.pth' else parts[:-1])
                 if part.startswith(('finetune_', 'transfer_', 'cls_'))), None)
    kind, _, rest = (name or '').partition('_')
    what = 'holds no checkpoint yet' if os.path.isdir(checkpoint) else 'does not exist'
    if kind in ('finetune', 'transfer'):
        swap = (f'; or start from the softmax release with the kernel swapped: --cfg-options '
                f'model.backbone.init_cfg.checkpoint={release}' if release else '')
        target = config or f'configs/{name}.py'
        if os.path.isabs(target) and not os.path.relpath(target).startswith('..'):
            target = os.path.relpath(target)  # as the user would type it, from here
        stages = (f'stage 1 configs/transfer_{rest}.py, then stage 2 configs/finetune_{rest}.py'
                  if kind == 'finetune' else f'stage 1 configs/transfer_{rest}.py') + (f', {cost}' if cost else '')
        return (f'{owner}: pretrained checkpoint {checkpoint!r} {what}; make it with the warm start '
                f'(docs/warm_start.md): `python tools/warm_start.py {target}{launch}` runs what is missing ({stages}) '
                f'and then the config itself{swap}{"; note: " + note if note else ""}; or point model.backbone.init_cfg.checkpoint at your own file, or '
                'train the backbone from scratch on purpose with model.backbone.init_cfg.type=Scratch')
    make = {'cls': f'make it with `python tools/train.py configs/{name}.py` (ImageNet), '}.get(kind, '')
    return (f'{owner}: pretrained checkpoint {checkpoint!r} {what}; {make}point '
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
        checkpoint = resolve_checkpoint(checkpoint, name)
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
    roles = getattr(module, 'by_design_keys', ())  # keys the module and the file do not share by design
    by_design = [(what, [k for k in missing + unexpected if re.match(p, k)]) for what, p in roles]
    if any(keys for _, keys in by_design):
        print_log(f'{name}: loading {checkpoint}: as intended, ' +
                  '; '.join(f'{len(keys)} key(s) {what}' for what, keys in by_design if keys),
                  logger=logger or 'current', level=20)
    by_design = {k for _, keys in by_design for k in keys}
    for label, keys in (('missing in the checkpoint', [k for k in missing if k not in by_design]),
                        ('unexpected (not placed)', [k for k in unexpected if k not in by_design]),
                        ('skipped for a shape mismatch', mismatched)):
        if keys:
            print_log(f'{name}: loading {checkpoint}: {len(keys)} key(s) {label}: {sorted(keys)}',
                      logger=logger or 'current', level=30)
    return list(missing), list(unexpected), mismatched

