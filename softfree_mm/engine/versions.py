"""The libraries a run is made with, read from the installed packages' metadata (nothing imported), and
softfree_mm's version and git commit: written beside each run's identity (engine/run_identity.py) and named when they
differ on a resume or a refusal, never a reason to refuse; and in a small file of their own, versions.json
(:func:`write_versions`), in every work dir of tools/train.py and tools/test.py (rank 0) and in every results folder
of the studies (kernel study, task study, warm-start grid)."""
import os.path as osp
import re
from typing import Dict, Mapping, Optional, Sequence

from ..files import write_json

LIBRARIES = (('torch', ('torch', )), ('torchvision', ('torchvision', )), ('mmengine', ('mmengine', )),
             ('mmcv', ('mmcv', 'mmcv-lite', 'mmcv-full')), ('mmdet', ('mmdet', )),
             ('mmseg', ('mmsegmentation', )), ('mmpretrain', ('mmpretrain', )), ('timm', ('timm', )),
             ('numpy', ('numpy', )),
             ('opencv', ('opencv-python', 'opencv-python-headless', 'opencv-contrib-python',
                         'opencv-contrib-python-headless')))


_VERSIONS: Dict[str, str] = {}


def _dist_version(names: Sequence[str]) -> str:
    from importlib import metadata
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return 'not installed'


def _git_commit(folder: str) -> str:
    import subprocess
    if not osp.exists(osp.join(folder, '.git')):
        return 'unknown'
    try:
        out = subprocess.run(['git', '-C', folder, 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 'unknown'
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else 'unknown'


def versions() -> Dict[str, str]:
    """The libraries a run is made with (read from the installed packages' metadata, nothing imported) and
    softfree_mm's version and git commit ('unknown' outside a checkout)."""
    if not _VERSIONS:
        for key, names in LIBRARIES:
            _VERSIONS[key] = _dist_version(names)
        package = osp.dirname(osp.dirname(osp.abspath(__file__)))
        with open(osp.join(package, '__init__.py')) as f:
            m = re.search(r"^__version__ = ['\"]([^'\"]+)", f.read(), re.M)
        _VERSIONS['softfree_mm'] = m.group(1) if m else 'unknown'
        _VERSIONS['softfree_mm_commit'] = _git_commit(osp.dirname(package))
    return dict(_VERSIONS)


def version_changes(then: Optional[Mapping[str, str]], now: Optional[Mapping[str, str]] = None) -> str:
    """'torch 2.1.0 -> 2.4.1, ...' for the libraries whose versions differ ('' when none, or none recorded).
    softfree_mm's git commit is recorded but not named here: it moves with every commit of a checkout, and what the
    code computes is already in the record (a changed default changes the resolved config)."""
    now = now or versions()
    if not then:
        return ''
    changed = [f'{k} {then[k][:12]} -> {now[k][:12]}' for k in now
               if k in then and then[k] != now[k] and k != 'softfree_mm_commit']
    return ', '.join(changed)


FILE = 'versions.json'  # beside a run's checkpoints (tools/train.py, tools/test.py) and a study's CSVs


def _library_set(entry: Mapping[str, str]) -> Dict[str, str]:
    return {k: v for k, v in entry.items() if k not in ('softfree_mm_commit', 'earlier')}


def write_versions(folder: str, carried_from: Sequence[str] = ()) -> str:
    """``folder``/versions.json: :func:`versions` of this process (libraries, softfree_mm's version and commit) and,
    under ``earlier``, each other set of libraries that the versions files of ``carried_from`` name (a work dir's own
    earlier runs: a resume, a test of its checkpoint; a study's folders whose rows it keeps). A set that differs from
    this one by softfree_mm's commit only is not kept. Written atomically; returns the path."""
    import json
    now = versions()
    earlier = []
    for src in carried_from:
        try:
            with open(osp.join(src, FILE)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue  # none recorded there (made before versions files), or not readable: nothing to carry
        for entry in [data, *data.get('earlier', [])] if isinstance(data, dict) else []:
            entry = {k: v for k, v in entry.items() if k != 'earlier'}
            if _library_set(entry) != _library_set(now) and entry not in earlier:
                earlier.append(entry)
    out = dict(now, **({'earlier': earlier} if earlier else {}))
    path = osp.join(folder, FILE)
    write_json(out, path, newline=True, indent=1)
    return path
