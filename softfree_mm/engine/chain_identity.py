"""The warm-start chain's runs by their identities (:mod:`softfree_mm.engine.run_identity`): what each run of a plan
is, and whether a work dir holds that run.

- :func:`records`: each run's record, top-down and before anything runs: stage 1 from its config and the release's
  start (its content hash), stage 2 with stage 1's *planned* record as its backbone's start, the main job with stage
  2's. A change anywhere upstream (recipe, length, a stage's option, the release) changes every record below it, so
  the decision from the end cannot stop at a finished main job of another chain.
- :func:`held`: what a work dir holds: the record in its ``run_identity.json``, else one adopted from the config
  mmengine saved in its checkpoint (read weights-only), for a work dir made before identities (none, or the old
  fingerprint ``warm_start_run.json``): its starts are known by name only, its world size is read from its mmengine
  log (``GPU number: N``) or the old fingerprint, never assumed.
- :func:`refusal`: the one line naming the first differing resolved keys (old -> new) and the way out.
"""
import glob
import json
import os.path as osp
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from . import run_identity as ri
from .chain import ROLE_NAMES, Stage
from .chain_release import reference_name, start_of
from .errors import UsageError

OLD_FINGERPRINT = 'warm_start_run.json'  # what this chain wrote before run identities
_WORLD = re.compile(r'(?:GPU number|World size|world_size)["\']?\s*[:=]\s*(\d+)')
_HEAD = 1 << 18  # a log's environment block is at its start: its first 256 KiB are read


def records(runs: List[Stage], cfgs: list, request) -> List[Dict]:
    """Each run's record as this command would make it (``request``: chain_run.Request)."""
    flags = ri.train_flags(request.train_args)
    out: List[Dict] = []
    for r, c in zip(runs, cfgs):
        starts = {}
        for path in ri.checkpoint_paths(c).values():
            starts[path] = ri.run_start(out[-1]) if out and path == r.reads else start_of(path, request.work_root)
        out.append(ri.record(c, starts, request.world_size(r.role), flags))
    return out


def upstream(runs: List[Stage], i: int) -> List[str]:
    """The names of the runs above run ``i``, nearest first (how a refusal names their keys)."""
    return [ROLE_NAMES[runs[j].role] for j in range(i - 1, -1, -1)]


@dataclass
class Held:
    """What a work dir holds: its record, where it was read ('its run_identity.json' or 'adopted from ...'), the
    versions it was made with, and for an adopted one the checkpoint it was adopted from."""

    record: Dict
    source: str
    versions: Optional[Dict] = None
    adopted_from: Optional[str] = None


def world_sizes(work_dir: str) -> List[int]:
    """The world sizes a run's mmengine logs (each start or resume writes one, ``<time>/<time>.log``) and the old
    fingerprint name, sorted; [] when none does."""
    sizes = set()
    for log in sorted(glob.glob(osp.join(work_dir, '*', '*.log')) + glob.glob(osp.join(work_dir, '*.log'))):
        try:
            with open(log, errors='replace') as f:
                sizes.update(int(n) for n in _WORLD.findall(f.read(_HEAD)))
        except OSError:
            continue
    try:
        with open(osp.join(work_dir, OLD_FINGERPRINT)) as f:
            old = json.load(f).get('world_size')
        if isinstance(old, int):
            sizes.add(old)
    except (OSError, ValueError, AttributeError):
        pass
    return sorted(sizes)


def _adopted(stage: Stage, cfg, ours: Dict, checkpoint: str) -> Optional[Dict]:
    """The record of a run made before identities, from the config its checkpoint saved (None: none to read); its
    starts are this command's where they have the same name (all that is known of them), its world size None."""
    from mmengine.config import Config

    from .checkpoints import read_meta
    try:
        saved = Config.fromstring(read_meta(checkpoint)['cfg'], '.py')
    except Exception:  # noqa: BLE001  (no meta, a config that needs files no longer there, another format)
        return None
    given, flags = ri.undo_train_flags(saved)
    if flags['amp'] and ours['train_args'].get('amp_dtype') == 'auto':
        flags['amp_dtype'] = 'auto'  # the run resolved 'auto' on its machine: what it was given is not known
    planned = ri.checkpoint_paths(cfg)
    starts = {}
    for key, path in ri.checkpoint_paths(given).items():
        same = key in planned and reference_name(planned[key]) == reference_name(path)
        starts[path] = ri.start_at(ours, key) if same else ri.release_start(reference_name(path), None)
    return ri.record(given, starts, None, flags)


def refusal(stage: Stage, diffs, source: str, versions: Optional[Dict] = None) -> str:
    """One line: what differs (old -> new), where that was read, the libraries that changed, the way out."""
    changed = ri.version_changes(versions)
    made = f'; its libraries then -> now: {changed}' if changed else ''
    role = ROLE_NAMES[stage.role]
    role = role[len('the '):] if role.startswith('the ') else role
    return (f"{stage.work_dir} holds another run than this command's {role}: {ri.describe(diffs)} "
            f'({source}{made}): give the chain another --work-root, or move that folder away')


def held(stage: Stage, cfg, ours: Dict, checkpoint: str, above: List[str]) -> Held:
    """What ``stage.work_dir`` holds, checked against ``ours`` (this command's record of the run): a UsageError (one
    line, :func:`refusal`) when it is another run. ``above``: :func:`upstream`."""
    data = ri.read(stage.work_dir)
    if data is not None:
        if data['record'] != ours:  # equal identities: nothing to name
            diffs = ri.differences(data['record'], ours, above)
            if diffs:
                raise UsageError(refusal(stage, diffs, f'its {ri.FILE}', data.get('versions')))
        return Held(data['record'], f'its {ri.FILE}', data.get('versions'))
    name = osp.basename(checkpoint)
    theirs = _adopted(stage, cfg, ours, checkpoint)
    if theirs is None:
        raise UsageError(f'{stage.work_dir} holds {name}, which says nothing of what made it (no {ri.FILE}, no saved '
                         'config): give the chain another --work-root, or move that folder away')
    source = f'adopted from the config {name} saved'
    diffs = ri.differences(dict(theirs, world_size=ours['world_size']), ours, above, new_keys_only=True)
    if diffs:
        raise UsageError(refusal(stage, diffs, source))
    sizes = world_sizes(stage.work_dir)
    if not sizes:
        raise UsageError(f"{stage.work_dir} holds {name}, made before run identities: its saved config is this run's, "
                         f'but its world size cannot be read (no mmengine log there names its GPU number, no '
                         f'{OLD_FINGERPRINT}), and at another world size it is another run: give the chain another '
                         '--work-root, or move that folder away')
    if len(sizes) > 1:
        raise UsageError(f"{stage.work_dir} holds {name}, a run its logs show at several world sizes "
                         f"({', '.join(map(str, sizes))}): give the chain another --work-root, or move that folder "
                         'away')
    if sizes[0] != ours['world_size']:
        raise UsageError(refusal(stage, [('world_size', str(sizes[0]), str(ours['world_size']))], source))
    return Held(dict(theirs, world_size=sizes[0]), source, adopted_from=name)
