"""What made a run of the warm-start chain, written beside its checkpoints and read back without unpickling.

A fingerprint is a small JSON object in the run's work dir (:data:`FILE`), written when the run starts: the config,
the backbone it trains, where it starts, the chain's release (its name and sha256), the recipe and scale, the length,
the lr rule's values, the launch (world size x per-GPU batch) and the batch rule. Two fingerprints are the same run
when every field both know is equal (:func:`differences`). A work dir made before fingerprints is adopted once from
the config mmengine saved in its checkpoint's meta, read with ``weights_only=True`` (:func:`from_checkpoint`): the
fields that config cannot tell (recipe label, release hash, world size, batch rule) are left unknown.
"""
import hashlib
import json
import os
import os.path as osp
from typing import Dict, List, Optional

from .chain import backbone_pair, describe_pair, plain
from .errors import UsageError

FILE = 'warm_start_run.json'
VERSION = 1
# the fields in the order a refusal names them; 'backbone' is named alone when it differs (the most telling)
FIELDS = ('backbone', 'config', 'start', 'release', 'release_sha256', 'recipe', 'scale', 'loss', 'train', 'head',
          'length', 'lr', 'world_size', 'batch_per_gpu', 'batch_scale')
NOT_IN_A_CHECKPOINT = ('config', 'release_sha256', 'recipe', 'scale', 'world_size', 'batch_scale')


def reference_name(reference: Optional[str]) -> Optional[str]:
    """What a start is called whatever folder it sits in: a URL's file name, a file's name, a work dir's name."""
    if not isinstance(reference, str):
        return None
    if '://' in reference:
        from softfree_mm.models.converters import release_file_name
        return release_file_name(reference)
    return osp.basename(osp.normpath(reference))


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def _length(cfg) -> str:
    loop = cfg.get('train_cfg') or {}
    if loop.get('max_iters') is not None:
        return f"{int(loop['max_iters'])} iters"
    return f"{int(loop.get('max_epochs') or 0)} epochs"


def _lr_rule(cfg) -> str:
    """The peak lr and each scheduler's span and ends, as one string."""
    opt = (cfg.get('optim_wrapper') or {}).get('optimizer') or {}
    parts = [f"lr {opt.get('lr')}"]
    schedulers = cfg.get('param_scheduler') or []
    for s in schedulers if isinstance(schedulers, (list, tuple)) else [schedulers]:
        ends = ''.join(f' {k}={s[k]}' for k in ('start_factor', 'eta_min', 'milestones', 'gamma') if k in s)
        parts.append(f"{s.get('type')} {s.get('begin', 0)}-{s.get('end')}{ends}")
    return '; '.join(parts)


def head_start(cfg) -> Optional[str]:
    """Where stage 2's head starts: 'release' (ReleaseHead), 'new', None for a model without a head's init_cfg."""
    head = cfg.model.get('head')
    if not isinstance(head, dict) or 'init_cfg' not in head:
        return None
    init = head.get('init_cfg') or {}
    return 'release' if init.get('type') == 'ReleaseHead' else 'new'


def of_config(cfg, role: str, start: Optional[str]) -> Dict:
    """The fields a run's config tells (as the run reads it); ``start`` is what its backbone reads (stage 1: 'the
    release', whose name and hash are fields of their own)."""
    model = cfg.model
    loader = cfg.get('train_dataloader') or {}
    start = 'the release' if role == 'stage1' else reference_name(start)
    fp = dict(backbone=describe_pair(backbone_pair(cfg)), start=start, length=_length(cfg),
              lr=_lr_rule(cfg), batch_per_gpu=loader.get('batch_size'))
    if role == 'stage1':
        fp.update(loss=model.get('loss'), train=plain(model.get('train')))
    if role == 'stage2':
        fp.update(head=head_start(cfg))
    return fp


def make(cfg, role: str, config: str, start: Optional[str], release: Dict, launch: Dict) -> Dict:
    """The whole fingerprint of a run this command would make: ``release`` {'release', 'release_sha256'},
    ``launch`` {'recipe', 'scale', 'world_size', 'batch_scale'}."""
    fp = dict(version=VERSION, config=osp.splitext(osp.basename(config))[0], **of_config(cfg, role, start))
    fp.update(release)
    if role != 'main':
        fp.update(recipe=launch.get('recipe'), scale=launch.get('scale'))
    fp.update(world_size=launch.get('world_size'), batch_scale=launch.get('batch_scale'))
    return fp


def read(work_dir: str) -> Optional[Dict]:
    """The fingerprint of a work dir, None when it has none; an unreadable one is a UsageError naming it."""
    path = osp.join(work_dir, FILE)
    if not osp.isfile(path):
        return None
    try:
        with open(path) as f:
            fp = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f'{path}: not a fingerprint the chain can read ({e}); move the folder away or give the '
                         'chain another --work-root') from None
    if not isinstance(fp, dict):
        raise UsageError(f'{path}: not a fingerprint (a JSON object); move the folder away or give the chain another '
                         '--work-root')
    return fp


def write(work_dir: str, fp: Dict) -> str:
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, FILE)
    tmp = path + '.part'
    with open(tmp, 'w') as f:
        json.dump(fp, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def read_meta(path: str) -> Dict:
    """A checkpoint's ``meta``, read with ``weights_only=True`` (nothing is executed; mmengine's own types are
    allowed by softfree_mm.compat), memory-mapped where torch can (the optimiser is not read into memory)."""
    import torch

    import softfree_mm.compat  # noqa: F401  (mmengine's own types in the weights-only unpickler)
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except (TypeError, RuntimeError):  # a torch without mmap, a file of the legacy format
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    return (ckpt.get('meta') if isinstance(ckpt, dict) else None) or {}


def from_checkpoint(path: str, role: str) -> Optional[Dict]:
    """A pre-fingerprint run's fingerprint, from the config mmengine saved in its checkpoint's meta (read with
    ``weights_only=True``, mmap'ed: nothing is executed, the optimiser is not read into memory); None when the
    checkpoint holds no config that can be read."""
    from mmengine.config import Config
    try:
        cfg = Config.fromstring(read_meta(path)['cfg'], '.py')
    except Exception:  # noqa: BLE001  (no meta, a config that needs files no longer there, another format)
        return None
    init = (cfg.model.get('teacher') if role == 'stage1' else cfg.model.get('backbone')) or {}
    start = (init.get('init_cfg') or {}).get('checkpoint')
    fp = dict(of_config(cfg, role, start), adopted_from=osp.basename(path))
    head = (cfg.model.get('head') or {}).get('init_cfg') or {}
    if role == 'stage1' or (role == 'stage2' and fp.get('head') == 'release'):
        fp['release'] = reference_name(start if role == 'stage1' else head.get('checkpoint'))
    return fp


def differences(theirs: Dict, ours: Dict) -> List[str]:
    """The fields both know and that differ (the release's name only when neither hash is known)."""
    out = [k for k in FIELDS if theirs.get(k) is not None and ours.get(k) is not None and theirs[k] != ours[k]]
    if 'release_sha256' not in out and theirs.get('release_sha256') and ours.get('release_sha256') \
            and 'release' in out:
        out.remove('release')  # the same file under another name
    return out


def _describe(fp: Dict, keys: List[str]) -> str:
    others = [k for k in keys if k != 'backbone']
    if 'backbone' in keys or not others:
        return fp.get('backbone') or '?'
    return f"{fp.get('backbone')} ({', '.join(f'{k}={fp[k]}' for k in others)})"


def refusal(work_dir: str, theirs: Dict, ours: Dict, keys: List[str], source: str) -> str:
    """One line: what ``work_dir`` holds, what this command would make there, and the way out."""
    shown = ['backbone'] if 'backbone' in keys else keys
    return (f"{work_dir} holds a checkpoint of {_describe(theirs, shown)}, not of this run's {_describe(ours, shown)} "
            f'({source}): give the chain another --work-root, or move that folder away')
