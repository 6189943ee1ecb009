"""What a run is: its fully resolved config, what it starts from and how it steps, as one record and its hash.

A run is made by its config as mmengine resolves it (every ``--cfg-options`` and recipe option applied), by the
checkpoints it starts from and by its launch. :func:`record` writes that down canonically (sorted keys, tuples as
lists, other values by name): the config minus :data:`IGNORED` (keys that cannot change what the run computes, each
with its reason) and the hooks the tools add for the machine (:data:`MACHINE_HOOKS`), SyncBN written as BN (the tools
swap it for one process; the world size is recorded anyway), every checkpoint path (``load_from``, any
``init_cfg.checkpoint``) replaced by its *start*: a release by its file name and content hash (:func:`release_start`),
a run's work dir by that run's own record (:func:`run_start`), so that a change anywhere upstream changes every
identity downstream and moving a work root changes none; then the world size, the per-GPU batch and the
result-changing flags of tools/train.py (:func:`train_flags`). :func:`identity` is the hash of that record;
:func:`differences` names what two records disagree on, upstream runs included, by their resolved keys.

A run's work dir holds :data:`FILE` (:func:`write`, :func:`read`): the identity, the record and the library versions
it was made with (shown beside a refusal or a resume when they differ; never a reason to refuse). A file's content
hash is computed once and kept beside it (:func:`sha256_of`, ``<file>.sha256.json``).
"""
import hashlib
import json
import os.path as osp
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..files import write_json
from .errors import UsageError
from .file_hash import SIDECAR, remember_sha256, sha256_of  # noqa: F401  (a release's start: its content hash)
from .versions import LIBRARIES, version_changes, versions  # noqa: F401  (recorded beside the identity)

FILE = 'run_identity.json'

# keys that cannot change what a run computes (dotted; a key names its whole subtree), each with its reason
IGNORED: Dict[str, str] = {
    'work_dir': 'where the run writes (moving a work root changes no run)',
    'launcher': 'how its processes are started; how many there are is world_size',
    'resume': 'a resumed run is the run it resumes',
    'load_from': 'only while resuming: the run\'s own checkpoint it resumes from (otherwise its start, recorded)',
    'default_hooks.logger': 'how often it logs',
    'default_hooks.checkpoint': 'how often it saves and how many checkpoints it keeps',
    'default_hooks.timer': 'timing',
    'default_hooks.visualization': 'drawing predictions for the logs',
    'log_processor': 'how logged values are smoothed',
    'log_level': 'how much it logs',
    'visualizer': 'where logs and images go',
    'vis_backends': 'where logs and images go',
    'env_cfg': "the machine's settings (cudnn benchmark, worker start method, the distributed backend: "
               'tools/train.py sets gloo without CUDA)',
    'model_wrapper_cfg': 'DDP options (tools/train.py drops device_ids without CUDA)',
    'train_dataloader.num_workers': 'loader processes: the machine\'s (lowered to the CPUs Slurm gives a task)',
    'val_dataloader.num_workers': 'loader processes: the machine\'s',
    'test_dataloader.num_workers': 'loader processes: the machine\'s',
    'warm_start.recipe': "the recipe's name label: its settings are in the config",
}
# hooks tools/train.py adds for the machine (softfree_mm/engine/runner.py add_reliability_hooks), by type
MACHINE_HOOKS: Dict[str, str] = {
    'RNGStateHook': 'keeps the random state in checkpoints so that a resume reproduces the run',
    'NonFiniteLossHook': 'stops on a NaN / inf loss (its skip is --skip-nonfinite-loss, recorded in train_args)',
    'CheckpointOnSignalHook': 'saves and stops when a cluster job is warned before its time limit',
}
SYNC_BN = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')  # canonically BN: the tools swap them for one process
START_KINDS = (('release', 'sha256'), ('run', 'record'))  # the keys of a start record
ABSENT = '<absent>'


# ------------------------------------------------------------------------------------------------- starts
def release_start(name: str, sha256: Optional[str]) -> Dict:
    """A release file as a run's start: its file name and content hash (None: not known here yet)."""
    return {'release': name, 'sha256': sha256}


def run_start(rec: Dict) -> Dict:
    """The work dir of another run (or a checkpoint in it) as a run's start: that run's identity and record."""
    return {'run': identity(rec), 'record': rec}


def start_kind(value) -> Optional[str]:
    """'release' or 'run' for a start record, else None."""
    if isinstance(value, dict):
        for kind in START_KINDS:
            if set(value) == set(kind):
                return kind[0]
    return None


# ------------------------------------------------------------------------------------------------- flags
def train_flags(args: Iterable[str] = ()) -> Dict:
    """The tools/train.py options that change a run's result (``--amp``, ``--amp-dtype``, ``--auto-scale-lr``,
    ``--skip-nonfinite-loss``) from its arguments (a list, or one string as --train-args gives it); the others
    (``--device``, ``--resume``) are not part of a run."""
    import argparse
    import shlex
    if isinstance(args, str):
        args = shlex.split(args)
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument('--amp', action='store_true')
    p.add_argument('--amp-dtype', default='auto')
    p.add_argument('--auto-scale-lr', action='store_true')
    p.add_argument('--skip-nonfinite-loss', action='store_true')
    known, _ = p.parse_known_args(list(args))
    return {'amp': known.amp, 'amp_dtype': known.amp_dtype if known.amp else None,
            'auto_scale_lr': known.auto_scale_lr, 'skip_nonfinite_loss': known.skip_nonfinite_loss}


def undo_train_flags(cfg: Dict) -> Tuple[Dict, Dict]:
    """A config as tools/train.py ran it (mmengine saves it in each checkpoint) -> (the config as it was given, the
    flags that changed it): ``--amp`` (AmpOptimWrapper, its dtype, dynamic loss scale), ``--auto-scale-lr``
    (auto_scale_lr.enable), ``--skip-nonfinite-loss`` (NonFiniteLossHook's skip). ``amp_dtype`` is the dtype the
    run resolved (``auto`` resolves per machine). The argument is left as it is."""
    import copy
    cfg = copy.deepcopy(_plain(cfg))
    flags = train_flags()
    wrapper = cfg.get('optim_wrapper')
    if isinstance(wrapper, dict) and wrapper.get('type') == 'AmpOptimWrapper':
        flags['amp'], flags['amp_dtype'] = True, wrapper.pop('dtype', None) or 'auto'
        wrapper['type'] = 'OptimWrapper'
        if wrapper.get('loss_scale') == 'dynamic':
            wrapper.pop('loss_scale')
    scale = cfg.get('auto_scale_lr')
    if isinstance(scale, dict) and scale.get('enable'):
        flags['auto_scale_lr'], scale['enable'] = True, False
    for hook in cfg.get('custom_hooks') or ():
        if isinstance(hook, dict) and hook.get('type') == 'NonFiniteLossHook' and hook.get('skip'):
            flags['skip_nonfinite_loss'] = True
    return cfg, flags


# ------------------------------------------------------------------------------------------------ the record
def _plain(value):
    if hasattr(value, 'to_dict'):
        value = value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_ADDRESS = re.compile(r' at 0x[0-9a-fA-F]+')


def canonical(value):
    """A config value as JSON: dict keys as strings (``_delete_`` markers left out), tuples as lists, a class or
    function by its qualified name, anything else by its repr (without memory addresses)."""
    if hasattr(value, 'to_dict') and not isinstance(value, type):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items() if k != '_delete_'}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, type) or callable(value):
        return f'{getattr(value, "__module__", "?")}.{getattr(value, "__qualname__", repr(value))}'
    return _ADDRESS.sub('', repr(value))


def _walk_starts(node, path: str, under_init: bool, found: Dict[str, str]) -> None:
    if isinstance(node, dict):
        if under_init and isinstance(node.get('checkpoint'), str):
            found[f'{path}.checkpoint'] = node['checkpoint']
        for k, v in node.items():
            _walk_starts(v, f'{path}.{k}' if path else str(k), k == 'init_cfg', found)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _walk_starts(v, f'{path}.{i}', under_init, found)


def checkpoint_paths(cfg) -> Dict[str, str]:
    """Every checkpoint a run with this config starts from: {dotted key: path} for ``load_from`` (unless the run
    resumes) and every ``init_cfg.checkpoint`` anywhere (backbone, teacher, head, a config's own variables)."""
    d = _plain(cfg)
    found: Dict[str, str] = {}
    if isinstance(d.get('load_from'), str) and not d.get('resume'):
        found['load_from'] = d['load_from']
    _walk_starts(d, '', False, found)
    return found


def _drop(d: Dict, dotted: str) -> None:
    *parents, last = dotted.split('.')
    for k in parents:
        d = d.get(k) if isinstance(d, dict) else None
        if not isinstance(d, dict):
            return
    d.pop(last, None)


def _sync_bn_as_bn(node) -> None:
    if isinstance(node, dict):
        if node.get('type') in SYNC_BN:
            node['type'] = 'BN'
        for v in node.values():
            _sync_bn_as_bn(v)
    elif isinstance(node, list):
        for v in node:
            _sync_bn_as_bn(v)


def _set(d: Dict, dotted: str, value) -> None:
    """Set a dotted key whose parents exist (one under an ignored key is gone: nothing to set)."""
    *parents, last = dotted.split('.')
    for k in parents:
        if isinstance(d, list) and k.isdigit() and int(k) < len(d):
            d = d[int(k)]
        elif isinstance(d, dict) and k in d:
            d = d[k]
        else:
            return
    if isinstance(d, list):
        d[int(last)] = value
    elif isinstance(d, dict):
        d[last] = value


def record(cfg, starts: Mapping[str, Dict], world_size: int, train_args: Optional[Dict] = None) -> Dict:
    """The canonical record of a run: ``cfg`` (mmengine's resolved Config or its dict, every option applied) as
    canonical JSON less :data:`IGNORED` and :data:`MACHINE_HOOKS`, SyncBN as BN, each checkpoint path replaced by
    ``starts[path]`` (a :func:`release_start` or :func:`run_start`; every path of :func:`checkpoint_paths` must be
    there); the world size (processes), the per-GPU batch, and ``train_args`` (:func:`train_flags`; default: none
    given). Pure: reads nothing."""
    paths = checkpoint_paths(cfg)
    missing = sorted(k for k, p in paths.items() if p not in starts)
    if missing:
        raise ValueError(f'record(): no start given for {", ".join(f"{k}={paths[k]!r}" for k in missing)}')
    c = canonical(cfg)
    resuming = bool(c.get('resume'))
    for key in IGNORED:
        if key != 'load_from' or resuming or c.get('load_from') is None:  # None: no start, as when absent
            _drop(c, key)
    hooks = [h for h in c.get('custom_hooks') or () if not (isinstance(h, dict) and h.get('type') in MACHINE_HOOKS)]
    if hooks:
        c['custom_hooks'] = hooks
    else:
        c.pop('custom_hooks', None)
    _sync_bn_as_bn(c)
    for key, path in paths.items():
        _set(c, key, canonical(starts[path]))
    loader = c.get('train_dataloader') if isinstance(c.get('train_dataloader'), dict) else {}
    return {'config': c, 'world_size': int(world_size) if world_size is not None else None,
            'batch_per_gpu': loader.get('batch_size'), 'train_args': dict(train_args or train_flags())}


def identity(rec: Dict) -> str:
    """The sha256 (hex) of a record's canonical JSON; its first 16 characters name a run in messages."""
    text = json.dumps(rec, sort_keys=True, separators=(',', ':'), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def start_at(rec: Dict, key: str):
    """The value at a dotted config key of a record (a start record at a checkpoint key), None when absent."""
    node = rec.get('config')
    for k in key.split('.'):
        if isinstance(node, list) and k.isdigit() and int(k) < len(node):
            node = node[int(k)]
        elif isinstance(node, dict) and k in node:
            node = node[k]
        else:
            return None
    return node


# ------------------------------------------------------------------------------------------- differences
def _short(value, limit: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(',', ':'))
    return text if len(text) <= limit else text[:limit - 3] + '...'


def show(value, label: Optional[str] = None, by_name: bool = False) -> str:
    """A value as a refusal shows it: a release by name (and hash), a run by its identity (and ``label``)."""
    if value is ABSENT:
        return ABSENT
    kind = start_kind(value)
    if kind == 'release':
        sha = value['sha256']
        if by_name:
            return f"{value['release']} (sha256 not known here yet: compared by its file name)"
        return f"{value['release']} (sha256 {sha[:12]})" if sha else value['release']
    if kind == 'run':
        return f"{label + ' ' if label else ''}run {value['run'][:16]}"
    return _short(value)


class _Diff:
    def __init__(self, upstream: Sequence[str], new_keys_only: bool):
        self.upstream, self.new_keys_only, self.out = list(upstream), new_keys_only, []

    def label(self, depth: int) -> Optional[str]:
        return self.upstream[depth] if depth < len(self.upstream) else None

    def add(self, prefix: str, key: str, old, new, depth: int, by_name: bool = False):
        label = self.label(depth)
        self.out.append((prefix + key, show(old, label, by_name), show(new, label, by_name)))

    def record(self, old: Dict, new: Dict, prefix: str, depth: int):
        keys = ['world_size', 'batch_per_gpu', 'train_args']
        keys += sorted(k for k in set(old) | set(new) if k not in keys and k != 'config')
        for k in keys:
            if self.new_keys_only and k not in new:
                continue
            self.value(old.get(k, ABSENT), new.get(k, ABSENT), prefix, k, depth)
        self.value(old.get('config', {}), new.get('config', {}), prefix, '', depth)

    def value(self, old, new, prefix: str, key: str, depth: int):
        if old == new:
            return
        kinds = start_kind(old), start_kind(new)
        if kinds[0] and kinds[0] == kinds[1]:
            return self.start(old, new, prefix, key, depth, kinds[0])
        if isinstance(old, dict) and isinstance(new, dict) and not any(kinds):
            for k in sorted(set(old) | set(new)):
                if self.new_keys_only and k not in new:
                    continue
                self.value(old.get(k, ABSENT), new.get(k, ABSENT), prefix, f'{key}.{k}' if key else k, depth)
            return
        if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) \
                and any(isinstance(v, (dict, list)) for v in old + new):
            for i, (a, b) in enumerate(zip(old, new)):
                self.value(a, b, prefix, f'{key}.{i}', depth)
            return
        self.add(prefix, key, old, new, depth)

    def start(self, old, new, prefix: str, key: str, depth: int, kind: str):
        if kind == 'release':
            if old['sha256'] and new['sha256']:
                if old['sha256'] != new['sha256']:
                    self.add(prefix, key, old, new, depth)
            elif old['release'] != new['release']:
                self.add(prefix, key, old, new, depth, by_name=True)
            return
        if old['run'] == new['run']:
            return
        if not isinstance(old.get('record'), dict) or not isinstance(new.get('record'), dict):
            return self.add(prefix, key, old, new, depth)
        label = self.label(depth)
        self.record(old['record'], new['record'], f"{label}'s " if label else f"{prefix}{key} -> the run's ",
                    depth + 1)


def differences(old: Dict, new: Dict, upstream: Sequence[str] = (), new_keys_only: bool = False
                ) -> List[Tuple[str, str, str]]:
    """What two records disagree on, as (dotted key, old value, new value) shown for a message, in a stable order:
    the launch (world size, per-GPU batch, train flags), then the config's keys in sorted order, a start where it
    sits. A run start whose identities differ is compared inside: its keys are named ``"<upstream[0]>'s <key>"``
    (``upstream``: names of the runs above, nearest first, e.g. ["stage 2 (fine-tune)", "stage 1 (transfer)"]). A
    release whose sha256 is known on both sides is compared by hash, else by file name (the value says so).
    ``new_keys_only``: keys absent from ``new`` are not compared (a record adopted from a saved config)."""
    d = _Diff(upstream, new_keys_only)
    d.record(old, new, '', 0)
    return d.out


def describe(diffs: List[Tuple[str, str, str]], most: int = 5) -> str:
    """The first ``most`` differences as 'key: old -> new; ...' (and how many more)."""
    text = '; '.join(f'{k}: {a} -> {b}' for k, a, b in diffs[:most])
    return text + (f' (and {len(diffs) - most} more)' if len(diffs) > most else '')


# ------------------------------------------------------------------------------------------ the work dir file
def write(work_dir: str, rec: Dict, **extra) -> str:
    """``work_dir/run_identity.json``: {'identity', 'record', 'versions'} and ``extra`` (e.g. adopted_from),
    written atomically."""
    data = dict(identity=identity(rec), record=rec, versions=versions(), **extra)
    path = osp.join(work_dir, FILE)
    write_json(data, path, indent=1, sort_keys=True)
    return path


def read(work_dir: str) -> Optional[Dict]:
    """A work dir's run_identity.json, None when it has none; one that cannot be read is a UsageError naming it."""
    path = osp.join(work_dir, FILE)
    if not osp.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f'{path}: not a run identity that can be read ({" ".join(str(e).split())}); move that '
                         'folder away or give the tool another work folder (the chain: --work-root; a grid: '
                         '--work-dir)') from None
    if not isinstance(data, dict) or not isinstance(data.get('record'), dict) or 'identity' not in data:
        raise UsageError(f'{path}: not a run identity (a JSON object with identity and record); move that folder '
                         'away or give the tool another work folder (the chain: --work-root; a grid: --work-dir)')
    return data
