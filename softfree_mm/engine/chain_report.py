"""What the warm-start chain says before it runs anything (the whole output of ``tools/warm_start.py --dry-run``):
each run's state, what it reads and writes, and where the default recipe was measured."""
import os.path as osp
from typing import List, Optional

from .chain import ROLE_NAMES
from .chain_run import Plan, Probe, target
from .errors import UsageError


def _where(path: str, work_root: str) -> str:
    from softfree_mm.models.converters import checkpoints_in

    from .chain_release import local_release
    if '://' in path:
        local = local_release(path, work_root)
        return (f'downloaded: {local}' if local else
                f'not downloaded yet: the tool fetches it into {osp.join(work_root, "releases")} first')
    if osp.isdir(path):
        return 'here' if checkpoints_in(path) else 'holds no checkpoint yet'
    return 'here' if osp.isfile(path) else 'missing'


def _now(p: Plan, pr: Probe, i: int) -> str:
    st = pr.states[i]
    if st is None:
        later = next(j for j in range(i + 1, len(p.runs)) if pr.states[j] is not None)
        how = 'is done' if pr.states[later].state == 'done' else 'resumes'
        return f'not needed: {ROLE_NAMES[p.runs[later].role]} {how} (not looked at)'
    if st.state == 'done':
        return f'done: {st.checkpoint}' + (' (adopted: its saved config is this run\'s)' if st.adopted else '') \
            + st.note
    if st.state == 'partial':
        return f'stopped at {st.at[0]} {st.at[1]} of {st.at[2]}: resumes from {st.checkpoint}' + st.note
    return 'not started'


def _default_note(p: Plan) -> Optional[str]:
    """One line when the chain runs its backbone layout's default recipe and that default was measured on another
    layout (``layout_defaults.default_origin``)."""
    from .layout_defaults import default_origin, default_recipe
    backbone = (p.cfgs[0].get('model') or {}).get('backbone') if p.cfgs else None
    if not isinstance(backbone, dict) or not isinstance(backbone.get('type'), str):
        return None
    try:
        if default_recipe(backbone) != p.recipe:
            return None
        return default_origin(backbone)
    except UsageError:  # not one of the package's families: the chain refuses it elsewhere
        return None


def report(p: Plan, pr: Probe) -> List[str]:
    """The lines the tool prints before it runs anything (the whole output of --dry-run)."""
    lines = []
    if p.recipe:
        lines.append(f'[warm-start] recipe {p.recipe} at the {p.scale} scale (softfree_mm/engine/warm_start.py)')
        note = _default_note(p)
        if note:
            lines.append(f'[warm-start] note: {note}')
    n = len(p.runs)
    for i, (r, c) in enumerate(zip(p.runs, p.cfgs)):
        unit, end = target(c)
        shown = osp.relpath(r.config, p.root) if r.config.startswith(p.root) else r.config
        lines.append(f'[warm-start] {i + 1}/{n} {ROLE_NAMES[r.role]}: {shown}\n    work dir {r.work_dir}; reads '
                     f'{r.reads} ({_where(r.reads, p.request.work_root)}); writes its last checkpoint there after '
                     f'{end} {unit}s; {_now(p, pr, i)}')
    return lines
