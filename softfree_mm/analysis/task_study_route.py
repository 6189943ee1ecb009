"""The task study's start ``task``: the task route (:mod:`softfree_mm.engine.task_route`) run through the study's
runner, at equal compute with the ImageNet route (docs/warm_start.md, "The task route at small scale").

A ``task`` row's detector / segmentor is the softmax detector / segmentor of the same seed (the study's ``softmax``
``scratch`` run of that task: its checkpoint in the work dir) made softmax-free by the route's two stage configs,
written by the route's own functions (:func:`~softfree_mm.engine.task_route.task_scale`,
:func:`~softfree_mm.engine.task_route.stage_settings`, :func:`~softfree_mm.engine.task_route.stage_configs`):

- stage 1 (``<task>/<layout>/<kernel>/task-<recipe>-stage1/seed<n>``: :func:`stage1_key`): attention transfer on
  the task's images, teacher the softmax model's backbone (its checkpoint), student the kernel's backbone from the same weights;
- stage 2 (the row's own key): the whole model fine-tuned, its backbone from stage 1's checkpoint, neck and heads from
  the softmax model's (through :meth:`Runner.from_classifier`, which then tests it).

Both stages together see the images the ImageNet route is charged (:func:`budget`): the classifier's warm start
(``WARM_ITERS`` iterations at the classifier's batch) and the task config's schedule, counted at the task config's
batch. The stage configs are written under the work dir's ``task_route/`` (their text is each run's config). A row's
``cls_top1`` is the softmax classifier's, where the route's chain starts.
"""
import functools
import os.path as osp
from typing import Dict, Tuple

START = 'task'
WARM_ITERS = 75  # the ImageNet route's warm start in the study (its 'transfer' rows: 25 % of the classifier's 300)
FOLDER = 'task_route'  # under the work dir: the kernel configs and the stage configs the runs read


@functools.lru_cache(maxsize=None)
def schedule_images(config: str) -> Tuple[int, int]:
    """(images a step, iterations) of a study config's schedule (its train_cfg.max_iters)."""
    from ..engine.config_checks import read_config
    cfg = read_config(config)
    return int(cfg.train_dataloader.batch_size), int(cfg.train_cfg.max_iters)


def budget(classifier: str, config: str, warm_iters: int = WARM_ITERS) -> Dict[str, int]:
    """The equal-compute budget of the task route on ``config``: the images the ImageNet route is charged (the
    warm start of ``classifier``: ``warm_iters`` steps at its batch; ``config``'s schedule) and the task route's
    iterations at ``config``'s batch that see as many."""
    cls_batch, _ = schedule_images(classifier)
    batch, iters = schedule_images(config)
    warm, task = warm_iters * cls_batch, iters * batch
    return dict(warm_start_images=warm, schedule_images=task, images=warm + task, batch=batch,
                iters=round((warm + task) / batch))


def _write(path: str, text: str) -> str:
    if not (osp.isfile(path) and open(path).read() == text):
        import os
        os.makedirs(osp.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
    return path


def stage_texts(folder: str, name: str, kernel_text: str, checkpoint: str, recipe, iters: int) -> Tuple[str, str]:
    """The texts of the two stage configs of the task route on the kernel's det / seg config (``kernel_text``, the
    study's child config) from the softmax model ``checkpoint``, ``iters`` iterations in all at the config's batch;
    written under ``folder`` (stage 2's backbone checkpoint is stage 1's, passed by the runner)."""
    from ..engine import task_route as tr
    from ..engine.chain import load_config, plain
    from ..engine.chain_run import Request
    config = _write(osp.join(folder, f'{name}.py'), kernel_text)
    cfg = load_config(config)
    request = Request(config, work_root=folder, iters=iters, recipe=recipe.name)
    scale, _ = tr.task_scale(cfg, config, request)
    names = (f'transfer_task_{name}', f'finetune_task_{name}')
    s = tr.stage_settings(recipe, scale, request, int(cfg.train_dataloader.batch_size), names)
    # the study's softmax model is ours (our layout: no padding rule to take): the file is not read here
    teacher, _ = tr.teacher_of(plain(cfg.model)['backbone'], checkpoint, {})
    paths = tr.stage_configs(config, cfg, checkpoint, teacher, recipe, s, folder, names, 'stage1')
    return tuple(open(p).read() for p in paths)


def stage1_key(key: str) -> str:
    """Stage 1's folder beside stage 2's (not inside it: a run empties its own folder when it starts)."""
    head, seed = key.rsplit('/', 1)
    return f'{head}-stage1/{seed}'


def run(runner, key: str, kernel_text: str, seed: int, softmax: dict, recipe, iters: int) -> dict:
    """The task route's row of one kernel, task and seed: stage 1 and stage 2 trained, stage 2 tested (its result
    with the three runs' seconds); ``softmax`` the softmax det / seg run's training result (its checkpoint).
    Without a finished softmax run: 'not run' where it was not run (report only), else 'failed' naming why."""
    if not softmax or softmax.get('status') == 'not run':
        return dict(status='not run', error='', key=key)
    if softmax.get('status') != 'ok' or not softmax.get('checkpoint'):
        return dict(status='failed', error=f'no softmax model: {softmax.get("error")}', key=key)
    from .sweep import safe_name
    folder = osp.join(runner.root, FOLDER)
    text1, text2 = stage_texts(folder, safe_name(key), kernel_text, softmax['checkpoint'], recipe, iters)
    stage1 = runner.train(stage1_key(key), text1, [f'randomness.seed={seed}'])
    if stage1.get('status') != 'ok':
        return dict(stage1, error=f'stage 1: {stage1.get("error")}' if stage1.get('error') else '')
    got = runner.from_classifier(key, text2, seed, stage1)
    return dict(got, wall_s=(got.get('wall_s') or 0) + (stage1.get('wall_s') or 0))
