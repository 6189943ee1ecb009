"""The detection and segmentation study: is softmax needed in the main job? Per backbone layout (PVTv2-b0 without
spatial reduction: token attention; XCiT-T12: channel attention), kernel, start and seed, the classifier (the kernel
study's recipe from scratch, or a warm start from the softmax classifier of the same seed), then the demo Mask R-CNN
(COCO bbox / segm mAP) and the demo Semantic FPN (mIoU) from it; paired differences to softmax per seed.

Every run is ``tools/train.py`` / ``tools/test.py`` on a child config in a process of its own, through the warm-start
grid's runner (:class:`softfree_mm.analysis.warm_start.Runner`): a finished run (its result.json) is never run
again, so the same command resumes a stopped study. XCiT's detector rows can be read from the warm-start grid's
detectors.csv instead of run again (``det_from``).
"""
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from ..engine.warm_start import RECIPES as RECIPES_BY_NAME
from .study import error_cell
from .sweep import safe_name
from . import task_study_route as route
from ..attention import Kernel
from .grid_runner import Runner, kernel_config, top1
from .warm_start import Plan

TASKS = ('det', 'seg')
METRICS = {'det': ('bbox_mAP', 'segm_mAP', 'bbox_mAP_50', 'segm_mAP_50'), 'seg': ('mIoU', 'aAcc', 'mAcc')}
PRIMARY = {'det': ('bbox_mAP', 'segm_mAP'), 'seg': ('mIoU', )}
TEST_KEYS = {'det': 'coco/', 'seg': ''}
COLUMNS = ('layout', 'task', 'kernel', 'start', 'recipe', 'seed', 'cls_top1', 'status', 'error', 'bbox_mAP',
           'segm_mAP', 'bbox_mAP_50', 'segm_mAP_50', 'mIoU', 'aAcc', 'mAcc', 'wall_s', 'source')
REFERENCE = 'softmax'
KEY = ('layout', 'task', 'kernel', 'start', 'recipe', 'seed')  # a row's run (identities.csv names it by these)


class Layout:
    """A backbone layout of the study: its classifier config (the kernel study's), its demo detector and segmentor
    configs (the study sets the kernel), its kernels, and the starts it runs besides ``scratch``."""

    def __init__(self, title: str, classifier: str, det: Optional[str], seg: str, kernels: Sequence[str],
                 starts: Sequence[str] = ('scratch', 'transfer'), warm: Sequence[str] = ('poly:degree=3', 'linear'),
                 recipe: Optional[str] = None, classifiers: Optional[str] = None,
                 fixed_n: Optional[Sequence[int]] = None, routed: Sequence[str] = ()):
        self.title, self.classifier, self.det, self.seg = title, classifier, det, seg
        self.kernels, self.starts, self.warm = list(kernels), list(starts), list(warm)
        self.routed = list(routed)  # the kernels of the start 'task' (the task route: analysis/task_study_route.py)
        self.recipe = recipe
        # the layout whose classifier runs (same config) this one's detectors / segmentors start from
        self.classifiers = classifiers
        # the detectors' / segmentors' poly kernels with c = 1/sqrt(N) take c fixed at these token counts, one per
        # stage, instead of the keys each forward has (the classifier's N where the layout names it)
        self.fixed_n = tuple(fixed_n) if fixed_n else None

    def task_attn(self, kernel: str):
        """The detector's / segmentor's attn_cfg for a kernel label: its config, or with ``fixed_n`` a poly kernel
        whose c is 1/sqrt(N) as one config per stage with c = fixed_n[i] ** -0.5 (other kernels unchanged)."""
        cfg = Kernel(kernel).cfg
        if not self.fixed_n or cfg['type'] != 'poly' or cfg.get('scale', 'sqrt_n') != 'sqrt_n':
            return cfg
        return [dict(cfg, scale=n ** -0.5) for n in self.fixed_n]

    @property
    def tasks(self) -> Tuple[str, ...]:
        return tuple(t for t in TASKS if self.config(t))

    def config(self, task: str) -> Optional[str]:
        return {'det': self.det, 'seg': self.seg}[task]

    @property
    def default(self) -> str:
        """The recipe of the study's warm starts in this layout: the one it names (what its committed rows were made
        with), else the package's default for the layout (softfree_mm/engine/layout_defaults.py)."""
        from ..engine.config_checks import read_config

        from ..engine.warm_start import default_recipe
        if not hasattr(self, '_default'):
            self._default = self.recipe or default_recipe(read_config(self.classifier).model.backbone.to_dict())
        return self._default


LAYOUTS = OrderedDict(
    pvt=Layout('PVTv2-b0 without spatial reduction (token attention)', 'configs/demo/study_pvt_v2_b0_digits.py',
               'configs/demo/maskrcnn_pvt_v2_b0_digits.py', 'configs/demo/semfpn_pvt_v2_b0_digits.py',
               ['softmax', 'poly:degree=3', 'poly:degree=1', 'linear', 'relu', 'inline', 'soft:landmark_ratio=2',
                'agent', 'poly:degree=3,qk_norm=True'],
               # x^3 with standardised q and k: the remedy "Why x^3 / sqrt(N) collapses in segmentation" tests, from
               # both starts as x^3; InLine and agent from the ImageNet route too, beside the task route (issue 67)
               starts=('scratch', 'transfer', 'task'),
               warm=('poly:degree=3', 'poly:degree=3,qk_norm=True', 'linear', 'inline', 'agent'),
               routed=('poly:degree=3', 'linear', 'inline', 'agent'),
               # its warm-start rows were made with transfer-final, token attention's default by the recipe rule's
               # version 1; the study keeps it so that later seeds pair with them (version 2 ships `transfer`)
               recipe='transfer-final'),
    # the hypothesis run of "Why x^3 / sqrt(N) collapses in segmentation" (docs/study.md): pvt's segmentor with every
    # forward at the classifier's token count (crops of 64, sliding 64 px windows at test), from pvt's classifiers
    pvt_n64=Layout('PVTv2-b0 without spatial reduction, the segmentor at the classifier\'s token count (crops of 64)',
                   'configs/demo/study_pvt_v2_b0_digits.py', None, 'configs/demo/semfpn_pvt_v2_b0_digits_n64.py',
                   ['softmax', 'poly:degree=3'], warm=('poly:degree=3', ), recipe='transfer-final', classifiers='pvt'),
    # the collapse's arms with controls that train (docs/study.md): pvt's segmentor from pvt's classifiers with (1) the
    # backbone at a tenth of the lr and gradients clipped at 5, (2) x^3's 1/sqrt(N) fixed at the classifier's token
    # counts (64 px: N = 256, 64, 16, 4 per stage), (3) the schedule twice as long
    pvt_lowlr=Layout('PVTv2-b0 without spatial reduction, the segmentor\'s backbone at a tenth of the lr, gradients '
                     'clipped at 5', 'configs/demo/study_pvt_v2_b0_digits.py', None,
                     'configs/demo/semfpn_pvt_v2_b0_digits_lowlr.py', ['softmax', 'poly:degree=3'],
                     warm=('poly:degree=3', ), recipe='transfer-final', classifiers='pvt'),
    pvt_fixn=Layout('PVTv2-b0 without spatial reduction, the segmentor\'s x^3 normaliser fixed at the classifier\'s '
                    'token counts', 'configs/demo/study_pvt_v2_b0_digits.py', None,
                    'configs/demo/semfpn_pvt_v2_b0_digits.py', ['softmax', 'poly:degree=3'], warm=('poly:degree=3', ),
                    recipe='transfer-final', classifiers='pvt', fixed_n=(256, 64, 16, 4)),
    pvt_long=Layout('PVTv2-b0 without spatial reduction, the segmentor\'s schedule twice as long (6000 iterations)',
                    'configs/demo/study_pvt_v2_b0_digits.py', None, 'configs/demo/semfpn_pvt_v2_b0_digits_long.py',
                    ['softmax', 'poly:degree=3'], warm=('poly:degree=3', ), recipe='transfer-final',
                    classifiers='pvt'),
    xcit=Layout('XCiT-T12 (channel attention)', 'configs/demo/study_xcit_t12_digits.py',
                'configs/demo/maskrcnn_xcit_t12_poly3_demo.py', 'configs/demo/semfpn_xcit_t12_poly3_demo.py',
                ['softmax', 'poly:degree=3', 'linear'], starts=('scratch', 'swap', 'transfer')),
)
# the starts' recipes, named in every row: the kernel study's from-scratch classifier, and the warm start's default
# recipe in the layout (softfree_mm/engine/warm_start.py) at the budget the warm-start grid calls 25 % (75 iterations)
# and its swap (the softmax classifier with the kernel swapped in, fine-tuned by the recipe's stage 2) at that budget
# and the task route from the softmax detector / segmentor of the same seed, at the ImageNet route's images
RECIPES = {'scratch': 'scratch-300', 'swap': 'swap+ft-75 ({})', 'transfer': '{}-75',
           route.START: 'task ({}, equal images)'}


def recipe_of(layout: str, start: str) -> str:
    """The ``recipe`` cell of a start's rows in a layout (a layout outside the study: the engine's DEFAULT)."""
    from ..engine.warm_start import DEFAULT
    return RECIPES[start].format(LAYOUTS[layout].default if layout in LAYOUTS else DEFAULT)


def check_names(layouts: Sequence[str], kernels: Optional[Sequence[str]] = None, tasks: Sequence[str] = TASKS,
                starts: Optional[Sequence[str]] = None):
    """One line naming what is unknown and the known forms (a UsageError)."""
    from ..engine.errors import UsageError
    bad = [s for s in (starts or ()) if s not in RECIPES]
    if bad:
        raise UsageError(f'unknown start {", ".join(map(repr, bad))}; known: {", ".join(RECIPES)}')
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad:
        raise UsageError(f'unknown backbone layout {", ".join(map(repr, bad))}; known: {", ".join(LAYOUTS)}')
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise UsageError(f'unknown task {", ".join(map(repr, bad))}; known: {", ".join(TASKS)}')
    known = list(dict.fromkeys(k for x in layouts for k in LAYOUTS[x].kernels))
    bad = [k for k in (kernels or ()) if k not in known]
    if bad:
        raise UsageError(f'unknown kernel {", ".join(map(repr, bad))} for {", ".join(layouts)}; known: '
                         f'{", ".join(known)}')


def fit_error(config: str, kernel: str) -> str:
    """'' when the layout's backbone takes ``kernel``, else its fit error's one line (the backbone is built)."""
    from ..engine.config_checks import read_config
    from mmengine.registry import DefaultScope

    from ..registry import MODELS
    cfg = read_config(config).model.backbone.to_dict()
    cfg.update(attn_cfg=Kernel(kernel).cfg, init_cfg=None)
    try:
        with DefaultScope.overwrite_default_scope('softfree_mm'):
            MODELS.build(cfg)
    except (ValueError, TypeError, KeyError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return ''


class Study:
    """The runs, in the order their inputs exist: classifiers (through the warm-start grid's :class:`Plan`), then the
    detectors and segmentors from them."""

    def __init__(self, runner: Runner, root: str, seeds: Sequence[int], layouts: Sequence[str] = tuple(LAYOUTS),
                 tasks: Sequence[str] = TASKS, kernels: Optional[Sequence[str]] = None,
                 det_from: Optional[str] = None, starts: Optional[Sequence[str]] = None,
                 keep: Optional[Sequence[dict]] = None, echo=print):
        check_names(layouts, kernels, tasks, starts)
        self.starts = list(starts) if starts else None
        self.r, self.root, self.seeds, self.tasks, self.echo = runner, root, list(seeds), list(tasks), echo
        self.layouts = OrderedDict((x, LAYOUTS[x]) for x in layouts)
        # the kernels parsed once, here (the study's edge): every run below reads their configs
        self.kernels = {x: [Kernel(k) for k in lay.kernels if kernels is None or k in kernels or k == REFERENCE]
                        for x, lay in self.layouts.items()}
        self.det_rows = read_detector_rows(det_from) if det_from else {}
        # finished rows of an earlier runs.csv (the committed outputs, when the work dir is gone): never run again
        self.keep = list(keep or ())
        self.kept = {(r['layout'], r['task'], r['kernel'], r['start'], r['recipe'], r['seed']): r for r in self.keep
                     if r.get('status') == 'ok' and r.get('source') == 'study'}
        # the classifiers: the warm-start grid's plan over these layouts (its budgets: 75 = 25 % of 300)
        backbones = {}
        for x, lay in self.layouts.items():
            got = backbones.setdefault(self.bb(x), (lay.classifier, []))[1]
            got += [k for k in self.kernels[x] if k != REFERENCE and k not in got]
        self.plan = Plan(runner, root, self.seeds, budgets=(75, ), backbones=backbones, echo=echo)

    def tasks_of(self, layout: str) -> List[str]:
        """The selected tasks the layout has a config for."""
        return [t for t in self.tasks if t in LAYOUTS[layout].tasks]

    def bb(self, layout: str) -> str:
        """The name of a layout's classifier runs (another layout's where it shares them)."""
        return LAYOUTS[layout].classifiers or layout

    def classifier(self, layout: str, kernel: str, start: str, seed: int, cache: dict) -> dict:
        """The classifier run of a start (cached in ``cache`` by the runs' name, kernel, start and seed)."""
        key = (self.bb(layout), kernel, start, seed)
        if key in cache:
            return cache[key]
        p, layout = self.plan, self.bb(layout)
        if start == route.START:  # the task route's chain starts from the softmax classifier
            run = self.classifier(layout, REFERENCE, 'scratch', seed, cache)
        elif start == 'scratch' or kernel == REFERENCE:
            run = p.scratch(layout, kernel, seed)
        else:
            softmax = self.classifier(layout, REFERENCE, 'scratch', seed, cache)
            if softmax.get('status') == 'not run':
                run = dict(status='not run', error='')
            elif softmax.get('status') != 'ok':
                run = dict(status='failed', error=f'no softmax classifier: {softmax.get("error")}')
            elif start == 'swap':
                run = p.finetune(f'swap_ft/{layout}/{safe_name(kernel)}/75/seed{seed}', layout, kernel, seed, 75,
                                 softmax['checkpoint'], softmax['checkpoint'])
            else:
                recipe = RECIPES_BY_NAME[LAYOUTS[layout].default]
                stage1 = p.transfer(layout, kernel, seed, 75, recipe.groups, softmax, recipe=recipe)
                run = p.transfer_finetune(layout, kernel, seed, 75, recipe.groups, stage1, softmax, recipe=recipe)
        cache[key] = run
        return run

    def task_key(self, layout: str, task: str, kernel: str, start: str, seed: int) -> str:
        """The runner's folder of a detector / segmentor run (its test: + '/test')."""
        from ..engine.warm_start import DEFAULT
        recipe = self.layouts[layout].default
        tag = '' if start == 'scratch' or recipe == DEFAULT else f'-{recipe}'  # the runs of 'transfer' keep their keys
        return f'{task}/{layout}/{safe_name(kernel)}/{start}{tag}/seed{seed}'

    def local_run(self, row: dict) -> Optional[dict]:
        """The work dir's training result of an ok row's detector / segmentor, when the run's test there gives the
        row's numbers (None for a kept row made elsewhere, or by another run of the same key)."""
        if row.get('status') != 'ok' or row.get('source') != 'study' or row['layout'] not in self.layouts:
            return None
        key = self.task_key(row['layout'], row['task'], row['kernel'], row['start'], row['seed'])
        train, test = self.r.done(key), self.r.done(key + '/test')
        if not (train and test and train.get('status') == test.get('status') == 'ok'):
            return None
        metric = PRIMARY[row['task']][0]
        m = (test.get('metrics') or {}).get(TEST_KEYS[row['task']] + metric)
        if m is None or row.get(metric) is None or abs(float(m) - row[metric]) > 1e-6:
            return None
        return train

    def local_classifier(self, row: dict) -> Optional[dict]:
        """The work dir's finished classifier run the row's detector / segmentor started from (None: not there)."""
        if not self.r.report_only:
            raise ValueError('local_classifier reads finished runs only: give the Study a report-only Runner')
        run = self.classifier(row['layout'], row['kernel'], row['start'], row['seed'], {})
        return run if run.get('status') == 'ok' and run.get('checkpoint') else None

    def curves(self, rows: Sequence[dict]) -> Dict[tuple, List[dict]]:
        """The training records (task_curves.read_log) of each row whose run is in the work dir (local_run): a kept
        row made elsewhere gets none, its committed curve is kept instead."""
        from .task_curves import identity, read_log
        out = {}
        for r in rows:
            train = self.local_run(r)
            if train and train.get('log') and osp.isfile(train['log']):
                out[identity(r)] = read_log(train['log'])
        return out

    def task_run(self, layout: str, task: str, kernel: str, start: str, seed: int, classifier: dict) -> dict:
        lay = self.layouts[layout]
        cfg = kernel_config(osp.join(self.root, lay.config(task)), lay.task_attn(kernel))
        key = self.task_key(layout, task, kernel, start, seed)
        if start != route.START:
            return self.r.from_classifier(key, cfg, seed, classifier)
        # the softmax detector / segmentor of the seed (trained before any task-route run: Study.run)
        softmax = self.r.done(self.task_key(layout, task, REFERENCE, 'scratch', seed))
        if softmax is None and classifier.get('status') != 'ok':
            softmax = dict(status=classifier.get('status'), error=f'no classifier: {classifier.get("error")}')
        n = route.budget(osp.join(self.root, lay.classifier), osp.join(self.root, lay.config(task)))['iters']
        return route.run(self.r, key, cfg, seed, softmax, RECIPES_BY_NAME[lay.default], n)

    def cases(self):
        """(layout, kernel, start) in the study's order; the fit errors of kernels a layout refuses."""
        out, unfit = [], {}
        for x, lay in self.layouts.items():
            for k in self.kernels[x]:
                err = fit_error(osp.join(self.root, lay.classifier), k)
                if err:
                    unfit[(x, k)] = err
                starts = ['scratch'] if k == REFERENCE else [
                    s for s in lay.starts if s == 'scratch' or (k in lay.routed if s == route.START else k in lay.warm)]
                starts = [s for s in starts if self.starts is None or s in self.starts or k == REFERENCE]
                out += [(x, k, s) for s in starts]
        return out, unfit

    def run(self) -> List[dict]:
        """Every run (finished ones are read); the rows of runs.csv."""
        cases, unfit = self.cases()
        todo = [(x, k, s, seed) for seed in self.seeds for x, k, s in cases if (x, k) not in unfit]
        cache = {}
        kept = {(x, task, k, s, seed): self.kept.get((x, task, k, s, recipe_of(x, s), seed))
                for x, k, s, seed in todo for task in self.tasks_of(x)}
        runs = [(x, task, k, s, seed) for x, k, s, seed in todo for task in self.tasks_of(x)
                if not (task == 'det' and self.det_rows.get((x, k, s, seed))) and not kept[(x, task, k, s, seed)]]
        # classifiers whose weights a run needs (a warm start: also its softmax teacher's): the softmax ones first
        # (every warm start reads them), then the others, `jobs` at a time; one call per run (layouts share them)
        need = {(x, k, s, seed) for x, _, k, s, seed in runs}
        need |= {(x, REFERENCE, 'scratch', seed) for x, k, s, seed in need if s != 'scratch'}

        def unique(ts):
            return list({(self.bb(t[0]), *t[1:]): t for t in ts}.values())
        self.r.map(lambda t: self.classifier(*t, cache), unique(t for t in todo if t in need and t[1] == REFERENCE))
        self.r.map(lambda t: self.classifier(*t, cache), unique(t for t in todo if t in need and t[1] != REFERENCE))
        # the task route's runs last, after the softmax detectors / segmentors they start from (run also where their
        # rows are kept: the route reads their checkpoints in the work dir)
        routed = [t for t in runs if t[3] == route.START]
        first = [t for t in runs if t[3] != route.START]
        first += list(dict.fromkeys((x, task, REFERENCE, 'scratch', seed) for x, task, _, _, seed in routed
                                    if (x, task, REFERENCE, 'scratch', seed) not in first))
        one = lambda t: self.task_run(*t, cache[(self.bb(t[0]), t[2], t[3], t[4])])  # noqa: E731
        done = dict(zip(first, self.r.map(one, first)))
        done.update(zip(routed, self.r.map(one, routed)))
        rows = []
        for x, k, s in cases:
            for seed in self.seeds:
                for task in self.tasks_of(x):
                    base = dict(layout=x, task=task, kernel=k, start=s, recipe=recipe_of(x, s), seed=seed)
                    if (x, k) in unfit:
                        rows.append(dict(base, status='unfit', error=unfit[(x, k)], source='study'))
                        continue
                    cls = cache.get((self.bb(x), k, s, seed), {})
                    read = self.det_rows.get((x, k, s, seed)) if task == 'det' else None
                    if read:
                        rows.append(dict(base, **read))
                        continue
                    if kept[(x, task, k, s, seed)]:
                        rows.append(dict(kept[(x, task, k, s, seed)]))
                        continue
                    run = done[(x, task, k, s, seed)]
                    m = run.get('metrics', {})
                    rows.append(dict(base, cls_top1=top1(cls), status=run.get('status'),
                                     error=error_cell(run.get('error') or ''), wall_s=run.get('wall_s'),
                                     source='study', identity=run.get('identity'),
                                     **{name: m.get(TEST_KEYS[task] + name) for name in METRICS[task]}))
        return in_kept_order(rows, self.keep)


def _place(r: dict) -> tuple:
    return r['layout'], r['task'], r['kernel'], r['start'], r['seed']


def in_kept_order(rows: List[dict], keep: Sequence[dict]) -> List[dict]:
    """This run's rows merged into the earlier runs.csv's: the earlier rows in their order (each replaced by this
    run's row of the same layout, task, kernel, start and seed), then this run's others in the study's order; the
    earlier rows this run did not select (other seeds, layouts, starts) stay. Stable: a report of the same rows
    writes the same file."""
    mine = OrderedDict((_place(r), r) for r in rows)
    out = [dict(mine.pop(_place(r), r)) for r in keep]
    return out + list(mine.values())


def read_detector_rows(path: str) -> Dict[tuple, dict]:
    """(layout 'xcit', kernel, start, seed) -> a row of the warm-start grid's detectors.csv, in this study's form
    (its 'softmax' start is the softmax classifier from scratch); a warm-start row's ``recipe`` names what made it
    (the file's provenance) where the file says."""
    from .warm_start_rows import read_detectors
    out = {}
    for r in read_detectors(path):
        start = 'scratch' if r['start'] == 'softmax' else r['start']
        made = r['source'].split(': ', 2)[2] if r['source'].count(': ') >= 2 else ''  # 'read: <file>: <what made it>'
        row = dict(cls_top1=r['start_top1'], status=r['status'], error=r['error'], wall_s=r['wall_s'],
                   source=f'warm_start/{osp.basename(path)}' + (f': {made}' if made else ''),
                   identity=r.get('identity'))
        if made and start != 'scratch':  # a warm start made otherwise than the recipe the study names
            row['recipe'] = f"{RECIPES[start].format('transfer')}, {made}"
        elif made:
            row['recipe'] = RECIPES['scratch']
        row.update({k: r[k] for k in METRICS['det']})
        out[('xcit', r['kernel'], start, r['seed'])] = row
    return out


def _num(v):
    if v in (None, ''):
        return None
    return float(v)


def read_rows(path: str) -> List[dict]:
    """runs.csv back as rows (numbers as floats, seeds as ints, blanks as None); a row a run with an identity made
    has it (``identity``, from identities.csv beside the file). A file without the key columns: a UsageError."""
    from .kept import read_kept

    def typed(r):
        row = dict(r, seed=int(r['seed']))
        for k in ('cls_top1', 'wall_s', *METRICS['det'], *METRICS['seg']):
            row[k] = _num(r.get(k))
        return row
    return read_kept(path, KEY, (*KEY, 'status', 'source'), path, typed)
