"""Which route of the warm start a plan runs and what each of its runs costs in images (iterations x images a step),
the first lines ``tools/warm_start.py`` prints (with ``--dry-run`` too): the ImageNet route (stage 1 and 2 on ImageNet
from a softmax release, then the config) or the task route (:mod:`softfree_mm.engine.task_route`)."""
import os.path as osp
from typing import List

from .chain import ROLE_NAMES
from .chain_run import Plan, target


def stage_cost(p: Plan, i: int) -> str:
    """'N iterations x B images = I images' (B: processes x per-GPU batch); an epoch-based run in epochs."""
    r, c = p.runs[i], p.cfgs[i]
    unit, end = target(c)
    batch = p.request.world_size(r.role) * int(c.train_dataloader.batch_size)
    if unit == 'iter':
        return f'{end:,} iterations x {batch} images = {end * batch:,} images'
    return f'{end} epochs of its training set at {batch} images a step'


def route_lines(p: Plan) -> List[str]:
    """The route, where its start and length come from, and each run's cost."""
    if getattr(p, 'route', 'imagenet') == 'task':
        lines = [f'[warm-start] route: the task (--from-task): {osp.basename(p.request.config)}\'s own training '
                 f'images, from the softmax model {p.checkpoint}; recipe {p.recipe_name}, its learning rates as '
                 f'multiples of the config\'s; both stages {p.budget}']
        lines += [f'[warm-start] note: {n}' for n in p.notes]
    else:
        lines = [f'[warm-start] route: ImageNet (from the softmax release {p.release}; --from-task CHECKPOINT takes '
                 'the task route from a trained softmax detector or segmentor)']
    lines += [f'[warm-start] cost of {ROLE_NAMES[r.role]}: {stage_cost(p, i)}' for i, r in enumerate(p.runs)]
    return lines
