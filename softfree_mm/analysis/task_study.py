"""The detection and segmentation study: is softmax needed in the main job? Per backbone layout (PVTv2-b0 without
spatial reduction: token attention; XCiT-T12: channel attention), kernel, start and seed, the classifier (the kernel
study's recipe from scratch, or a warm start from the softmax classifier of the same seed), then the demo Mask R-CNN
(COCO bbox / segm mAP) and the demo Semantic FPN (mIoU) from it; paired differences to softmax per seed.

Every run is ``tools/train.py`` / ``tools/test.py`` on a child config in a process of its own, through the warm-start
grid's runner (:class:`softfree_mm.analysis.warm_start.Runner`): a finished run (its result.json) is never run
again, so the same command resumes a stopped study. XCiT's detector rows can be read from the warm-start grid's
detectors.csv instead of run again (``det_from``).
"""
import csv
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from ..engine.warm_start import RECIPES as RECIPES_BY_NAME
from .study import error_cell
from .sweep import safe_name
from .grid_runner import Runner, kernel_cfg, kernel_config, top1
from .warm_start import Plan
from .stats import interval, mean_std

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
                 fixed_n: Optional[Sequence[int]] = None):
        self.title, self.classifier, self.det, self.seg = title, classifier, det, seg
        self.kernels, self.starts, self.warm = list(kernels), list(starts), list(warm)
        self.recipe = recipe
        # the layout whose classifier runs (same config) this one's detectors / segmentors start from
        self.classifiers = classifiers
        # the detectors' / segmentors' poly kernels with c = 1/sqrt(N) take c fixed at these token counts, one per
        # stage, instead of the keys each forward has (the classifier's N where the layout names it)
        self.fixed_n = tuple(fixed_n) if fixed_n else None

    def task_attn(self, kernel: str):
        """The detector's / segmentor's attn_cfg for a kernel label: its config, or with ``fixed_n`` a poly kernel
        whose c is 1/sqrt(N) as one config per stage with c = fixed_n[i] ** -0.5 (other kernels unchanged)."""
        cfg = kernel_cfg(kernel)
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
        from mmengine.config import Config

        from ..engine.warm_start import default_recipe
        if not hasattr(self, '_default'):
            self._default = self.recipe or default_recipe(Config.fromfile(self.classifier).model.backbone.to_dict())
        return self._default


LAYOUTS = OrderedDict(
    pvt=Layout('PVTv2-b0 without spatial reduction (token attention)', 'configs/demo/study_pvt_v2_b0_digits.py',
               'configs/demo/maskrcnn_pvt_v2_b0_digits.py', 'configs/demo/semfpn_pvt_v2_b0_digits.py',
               ['softmax', 'poly:degree=3', 'poly:degree=1', 'linear', 'relu', 'inline', 'soft:landmark_ratio=2',
                'agent', 'poly:degree=3,qk_norm=True'],
               # x^3 with standardised q and k: the remedy "Why x^3 / sqrt(N) collapses in segmentation" tests, from
               # both starts as x^3
               warm=('poly:degree=3', 'poly:degree=3,qk_norm=True', 'linear'),
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
RECIPES = {'scratch': 'scratch-300', 'swap': 'swap+ft-75 ({})', 'transfer': '{}-75'}


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
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from ..registry import MODELS
    cfg = Config.fromfile(config).model.backbone.to_dict()
    cfg.update(attn_cfg=kernel_cfg(kernel), init_cfg=None)
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
        self.kernels = {x: [k for k in lay.kernels if kernels is None or k in kernels or k == REFERENCE]
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
        if start == 'scratch' or kernel == REFERENCE:
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
        key = self.task_key(layout, task, kernel, start, seed)
        if classifier.get('status') != 'ok':
            if classifier.get('status') == 'not run':
                return dict(status='not run', error='', key=key)
            return dict(status='failed', error=f'no classifier: {classifier.get("error")}', key=key)
        lay = self.layouts[layout]
        cfg = kernel_config(osp.join(self.root, lay.config(task)), lay.task_attn(kernel))
        opts = [f'randomness.seed={seed}', f'model.backbone.init_cfg.checkpoint={classifier["checkpoint"]}']
        trained = self.r.train(key, cfg, opts)
        if trained.get('status') != 'ok':
            return trained
        tested = self.r.test(key + '/test', cfg, trained['checkpoint'], [f'randomness.seed={seed}'])
        return dict(tested, wall_s=(trained.get('wall_s') or 0) + (tested.get('wall_s') or 0))

    def cases(self):
        """(layout, kernel, start) in the study's order; the fit errors of kernels a layout refuses."""
        out, unfit = [], {}
        for x, lay in self.layouts.items():
            for k in self.kernels[x]:
                err = fit_error(osp.join(self.root, lay.classifier), k)
                if err:
                    unfit[(x, k)] = err
                starts = ['scratch'] if k == REFERENCE else [s for s in lay.starts if s == 'scratch' or k in lay.warm]
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
        done = dict(zip(runs, self.r.map(
            lambda t: self.task_run(t[0], t[1], t[2], t[3], t[4], cache[(self.bb(t[0]), t[2], t[3], t[4])]),
            runs)))
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
    from .warm_start_report import read_detectors
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
    has it (``identity``, from identities.csv beside the file)."""
    from .grid_identity import Identities
    made = Identities(osp.dirname(osp.abspath(path)))
    rows = []
    with open(path, newline='') as f:
        for r in csv.DictReader(f):
            row = dict(r, seed=int(r['seed']))
            for k in ('cls_top1', 'wall_s', *METRICS['det'], *METRICS['seg']):
                row[k] = _num(r.get(k))
            row['identity'] = made.get(osp.basename(path), row, KEY)
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- the table
def summarise(rows: List[dict], reference: str = REFERENCE) -> List[dict]:
    """One entry per (layout, task, kernel, start, recipe), in row order: n (seeds with a result), the failed and unfit
    seeds, each metric's mean and sample std, the classifier's mean top-1; per primary metric the paired difference to
    ``reference`` (its scratch row of the same layout and task), seed by seed over the seeds both have: mean, sample
    std, the 95 % t-interval of the mean, how many seeds are above, and whether the interval holds zero (within the
    seeds' spread)."""
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r['layout'], r['task'], r['kernel'], r['start'], r.get('recipe', '')), []).append(r)
    out = []
    for (layout, task, kernel, start, recipe), rs in groups.items():
        ok = [r for r in rs if r['status'] == 'ok']
        e = dict(layout=layout, task=task, kernel=kernel, start=start, recipe=recipe, n=len(ok),
                 failed=sum(r['status'] == 'failed' for r in rs), unfit=sum(r['status'] == 'unfit' for r in rs),
                 error=next((r['error'] for r in rs if r['status'] != 'ok'), ''))
        e['cls_top1'] = mean_std([r.get('cls_top1') for r in ok])[0]
        for m in METRICS[task]:
            e[m], e[m + '_std'], _ = mean_std([r.get(m) for r in ok])
        e['by_seed'] = {r['seed']: r for r in ok}
        out.append(e)
    for e in out:
        ref = next((r for r in out if (r['layout'], r['task'], r['kernel'], r['start']) ==
                    (e['layout'], e['task'], reference, 'scratch')), None)
        for m in PRIMARY[e['task']]:
            d = [] if ref is None or ref is e else [
                e['by_seed'][s][m] - ref['by_seed'][s][m] for s in sorted(e['by_seed'])
                if s in ref['by_seed'] and e['by_seed'][s].get(m) is not None and ref['by_seed'][s].get(m) is not None]
            i = interval(d, 'seeds')  # the seed is the unit: a seed's runs share its data order and start
            e[f'd_{m}'], e[f'd_{m}_std'], e[f'd_{m}_n'] = i.mean, mean_std(d)[1], i.n
            e[f'd_{m}_ci'] = None if i.half is None else (i.low, i.high)
            e[f'd_{m}_above'] = sum(x > 0 for x in d)
            e[f'd_{m}_within'] = i.holds_zero
    return out


def _pm(mean, std, digits):
    if mean is None:
        return ''
    return f'{mean:.{digits}f}' + ('' if std is None else f' ± {std:.{digits}f}')


def _paired_cell(e: dict, m: str, digits: int) -> str:
    if e[f'd_{m}'] is None:
        return ''
    ci = e[f'd_{m}_ci']
    text = f"{_pm(e[f'd_{m}'], e[f'd_{m}_std'], digits)}, {e[f'd_{m}_above']} of {e[f'd_{m}_n']} seeds above"
    if ci is not None:
        text += f"; 95 % [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]" + (
            f": no difference detectable at n = {e[f'd_{m}_n']}, half-width {(ci[1] - ci[0]) / 2:.{digits}f}"
            if e[f'd_{m}_within'] else ': excludes zero')
    return text


def floor_seeds(e: dict) -> int:
    """Seeds of a segmentation row at the background-only floor: mAcc within half a point of one class of eleven
    (the segmentor predicts background everywhere)."""
    return sum(r.get('mAcc') is not None and r['mAcc'] < FLOOR_MACC for r in e.get('by_seed', {}).values())


FLOOR_MACC = 100 / 11 + 0.5


TITLES = {'det': 'demo Mask R-CNN, COCO mAP on the demo val set (100 images)',
          'seg': 'demo Semantic FPN, mIoU % over background and ten digits on the demo val scenes (50 images)'}


def markdown(summary: List[dict], titles: Optional[Dict[str, str]] = None, reference: str = REFERENCE) -> str:
    """One table per layout and task: each (kernel, start) row with the classifier's top-1, the task's metrics (mean
    ± sample std over seeds) and the paired difference to ``reference`` from scratch."""
    out = []
    for layout in dict.fromkeys(e['layout'] for e in summary):
        for task in dict.fromkeys(e['task'] for e in summary if e['layout'] == layout):
            head = (titles or {}).get(layout, LAYOUTS[layout].title if layout in LAYOUTS else layout)
            out.append(f'### {head}: {TITLES[task]}')
            out.append('')
            prim = PRIMARY[task]
            digits = 3 if task == 'det' else 1
            cols = ['kernel', 'start', 'recipe', 'n', 'classifier top-1 %', *prim, *(f'paired Δ {m} vs {reference}'
                                                                                     for m in prim)]
            if task == 'seg':
                cols.append('seeds at the background floor')
            out.append('| ' + ' | '.join(cols) + ' |')
            out.append('|' + '---|' * len(cols))
            for e in summary:
                if (e['layout'], e['task']) != (layout, task):
                    continue
                if not e['n']:
                    what = 'does not fit' if e['unfit'] else 'failed' if e['failed'] else 'not run yet'
                    err = error_cell(e['error'])
                    out.append(f"| `{e['kernel']}` | {e['start']} | {e['recipe']} | 0 | {what}"
                               f"{': ' + err if err else ''} |" + ' |' * (len(cols) - 5))
                    continue
                note = f" ({e['failed']} failed)" if e['failed'] else ''
                cells = [f"`{e['kernel']}`", e['start'], e['recipe'], f"{e['n']}{note}",
                         '' if e['cls_top1'] is None else f"{e['cls_top1']:.1f}",
                         *(_pm(e[m], e[m + '_std'], digits) for m in prim),
                         *('reference' if (e['kernel'], e['start']) == (reference, 'scratch') else
                           _paired_cell(e, m, digits) for m in prim)]
                if task == 'seg':
                    cells.append(f"{floor_seeds(e)} of {e['n']}")
                out.append('| ' + ' | '.join(cells) + ' |')
            out.append('')
    return '\n'.join(out).rstrip() + '\n'


def _start(e: dict) -> str:
    """A row's start, and its recipe where it is a warm start."""
    return e['start'] if e['start'] == 'scratch' else f"{e['start']}: {e['recipe']}"


def _signed(x: float) -> str:
    """A paired difference, 3 significant digits; a mean of differences that cancel to rounding error is +0."""
    return f'{0.0 if abs(x) < 5e-9 else x:+.3g}'


def within_and_extremes(summary: List[dict]) -> List[str]:
    """Per layout and task: which rows are within the seeds' spread of softmax (the paired 95 % interval holds zero)
    and the largest paired differences either way (one line each, for the note and the docs)."""
    lines = []
    for layout in dict.fromkeys(e['layout'] for e in summary):
        for task in dict.fromkeys(e['task'] for e in summary if e['layout'] == layout):
            for m in PRIMARY[task]:
                rows = [e for e in summary if (e['layout'], e['task']) == (layout, task) and e.get(f'd_{m}') is not None]
                if not rows:
                    continue
                inside = [f"{e['kernel']} ({_start(e)})" for e in rows if e[f'd_{m}_within']]
                outside = [f"{e['kernel']} ({_start(e)}) {_signed(e[f'd_{m}'])}" for e in rows
                           if e[f'd_{m}_within'] is False]
                hi = max(rows, key=lambda e: e[f'd_{m}'])
                lo = min(rows, key=lambda e: e[f'd_{m}'])
                lines.append(f"{layout} {task} {m}: no difference from softmax detectable (the interval holds zero): "
                             f"{', '.join(inside) or 'none'}; interval excludes zero: "
                             f"{', '.join(outside) or 'none'}; largest paired difference "
                             f"{_signed(hi[f'd_{m}'])} ({hi['kernel']}, {_start(hi)}) and {_signed(lo[f'd_{m}'])} "
                             f"({lo['kernel']}, {_start(lo)})")
    return lines


def starts_compared(summary: List[dict]) -> List[str]:
    """Per layout, task and kernel with a warm start: each warm start minus the same kernel from scratch, paired by
    seed, the 95 % interval over seeds (the starts compared with each other directly, not each against softmax)."""
    lines = []
    for e in summary:
        if e['start'] == 'scratch' or not e['n']:
            continue
        base = next((b for b in summary if (b['layout'], b['task'], b['kernel'], b['start']) ==
                     (e['layout'], e['task'], e['kernel'], 'scratch')), None)
        if base is None:
            continue
        parts = []
        for m in PRIMARY[e['task']]:
            d = [e['by_seed'][k][m] - base['by_seed'][k][m] for k in sorted(e['by_seed'])
                 if k in base['by_seed'] and e['by_seed'][k].get(m) is not None
                 and base['by_seed'][k].get(m) is not None]
            i = interval(d, 'seeds')
            if i.mean is not None:
                parts.append(f'{m} {i.text(3 if e["task"] == "det" else 1)}')
        if parts:
            lines.append(f"{e['layout']} {e['task']} {e['kernel']}: {_start(e)} minus scratch: " + '; '.join(parts))
    return lines


def _paired(e: dict, base: dict, m: str, minus: Optional[Tuple[dict, dict]] = None) -> List[float]:
    """Per seed both rows have ``m``: e - base, or with ``minus`` = (e's reference, base's reference)
    (e - e's reference) - (base - base's reference), over the seeds all four have."""
    rows = [e, base] + (list(minus) if minus else [])
    seeds = [k for k in sorted(e['by_seed']) if all(k in r['by_seed'] and r['by_seed'][k].get(m) is not None
                                                   for r in rows)]
    if minus:
        return [(e['by_seed'][k][m] - minus[0]['by_seed'][k][m]) - (base['by_seed'][k][m] - minus[1]['by_seed'][k][m])
                for k in seeds]
    return [e['by_seed'][k][m] - base['by_seed'][k][m] for k in seeds]


def layouts_compared(summary: List[dict]) -> List[str]:
    """Per row of a layout that starts from another layout's classifiers (pvt_n64 from pvt's: the same classifier
    per seed, another segmentor set-up), paired by seed: the row minus the same (task, kernel, start) in the other
    layout, and for a kernel other than the reference its difference to the reference in this layout minus that in
    the other (does the set-up move the kernel's gap to softmax?); the seeds at the floor in both."""
    lines = []
    for e in summary:
        other = LAYOUTS[e['layout']].classifiers if e['layout'] in LAYOUTS else None
        if not other or not e['n']:
            continue
        key = (e['task'], e['kernel'], e['start'])
        base = next((b for b in summary if b['layout'] == other and (b['task'], b['kernel'], b['start']) == key), None)
        if base is None or not base['n']:
            continue
        refs = [next((r for r in summary if (r['layout'], r['task'], r['kernel'], r['start']) ==
                      (x, e['task'], REFERENCE, 'scratch')), None) for x in (e['layout'], other)]
        digits = 3 if e['task'] == 'det' else 1
        parts = []
        for m in PRIMARY[e['task']]:
            i = interval(_paired(e, base, m), 'seeds')
            if i.mean is not None:
                parts.append(f'{m} {i.text(digits)}')
            if e['kernel'] != REFERENCE and all(r is not None and r['n'] for r in refs):
                j = interval(_paired(e, base, m, minus=tuple(refs)), 'seeds')
                if j.mean is not None:
                    parts.append(f'its paired Δ {m} vs {REFERENCE} minus that in {other} {j.text(digits)}')
        if e['task'] == 'seg':
            parts.append(f"seeds at the floor {floor_seeds(e)} of {e['n']} (in {other}: "
                         f"{floor_seeds(base)} of {base['n']})")
        if parts:
            lines.append(f"{e['layout']} {e['task']} {e['kernel']} ({_start(e)}) minus {other}: " + '; '.join(parts))
    return lines


def interval_count(lines: Sequence[str]) -> int:
    """The 95 % intervals written in ``lines`` (each ends its text with '(95 %, n = ...)')."""
    return sum(line.count('(95 %, n = ') for line in lines)


# ---------------------------------------------------------------------------------------------- outputs
def plot(rows: List[dict], summary: List[dict], path: str) -> str:
    """One row of panels per layout, one panel per primary metric of each task: per (kernel, start) the seeds'
    values (dots) and their mean (bar), softmax's mean as a dashed line; kernels that do not fit named in grey."""
    import matplotlib.pyplot as plt

    from . import plots
    from .study_plots import _colours
    layouts = list(dict.fromkeys(e['layout'] for e in summary))
    panels = [(t, m) for t in TASKS for m in PRIMARY[t] if any(e['task'] == t for e in summary)]
    kernels = list(dict.fromkeys(e['kernel'] for e in summary))
    colours = _colours(kernels)
    width = max(5.0, 0.45 * max(sum(e['layout'] == x and e['task'] == panels[0][0] for e in summary)
                                for x in layouts) + 2.0)
    fig, axes = plt.subplots(len(layouts), len(panels), figsize=(width * len(panels), 4.2 * len(layouts)),
                             squeeze=False)
    for row, layout in enumerate(layouts):
        for col, (task, m) in enumerate(panels):
            ax = axes[row][col]
            entries = [e for e in summary if (e['layout'], e['task']) == (layout, task)]
            for i, e in enumerate(entries):
                if not e['n']:
                    ax.text(i, 0.02, 'does not fit' if e['unfit'] else 'failed', rotation=90, ha='center',
                            va='bottom', fontsize=7, color='grey', transform=ax.get_xaxis_transform())
                    continue
                ax.bar(i, e[m], 0.7, color=colours[e['kernel']], alpha=0.85 if e['start'] == 'scratch' else 0.45,
                       hatch=None if e['start'] == 'scratch' else '//')
                seeds = [r[m] for r in rows if (r['layout'], r['task'], r['kernel'], r['start'], r.get('recipe', '')) ==
                         (layout, task, e['kernel'], e['start'], e['recipe']) and r['status'] == 'ok'
                         and r.get(m) is not None]
                ax.scatter([i] * len(seeds), seeds, s=10, color='black', zorder=3)
                if (e['kernel'], e['start']) == (REFERENCE, 'scratch'):
                    ax.axhline(e[m], color='black', linestyle='--', linewidth=1)
            ax.set_xticks(range(len(entries)))
            ax.set_xticklabels([f"{e['kernel']}\n{_start(e)}" for e in entries], rotation=60, ha='right',
                               fontsize=7)
            ax.set_ylabel(m)
            ax.set_title(f"{LAYOUTS[layout].title if layout in LAYOUTS else layout}: {m}\nbar: mean over seeds "
                         '(hatched: warm start), dots: seeds, dashed: softmax', fontsize=8)
            ax.grid(True, axis='y', alpha=0.3)
    return plots.save(fig, path)


BEGIN, END = '<!-- task_study: made by tools/analysis/task_study.py, do not edit by hand -->', \
    '<!-- task_study: end -->'


def docs_section(summary: List[dict], out_rel: str, seg_profiles: Sequence[dict] = ()) -> str:
    """The generated part of docs/study.md's "Detection and segmentation" section: the tables, the plot, the
    lines saying what is within the seeds' spread; the segmentors' training losses where curves were kept."""
    lines = [BEGIN, '', markdown(summary).rstrip(), '',
             f'![detection and segmentation per kernel, seeds and means]({out_rel}/task_study.png)', '',
             'Against softmax, paired by seed (the 95 % interval over seeds; one that holds zero says no '
             'difference is detectable at that n, not parity), and the largest paired differences:', '']
    lines += [f'- {line}' for line in within_and_extremes(summary)]
    compared = starts_compared(summary)
    if compared:
        lines += ['', 'The starts against each other: each warm start minus the same kernel from scratch, paired by '
                  'seed:', '', *[f'- {line}' for line in compared]]
    across = layouts_compared(summary)
    if across:
        lines += ['', 'The set-ups against each other: a layout that starts from another\'s classifiers (the same '
                  'classifier per seed) minus that layout, paired by seed:', '', *[f'- {line}' for line in across]]
    count = sum(e.get(f'd_{m}_ci') is not None for e in summary for m in PRIMARY[e['task']])
    extra = interval_count(compared + across)
    lines += ['', f'Multiplicity: these tables hold {count} paired intervals at 95 % each'
              + (f' and the lines above {extra} more' if extra else '') + f'; by chance alone about '
              f'{0.05 * (count + extra):.1f} of them would exclude zero where there is no difference.']
    if seg_profiles:
        from .task_curves import WINDOW, seg_markdown
        lines += ['', f'The segmentors\' training losses (each the mean of the logged losses over the {WINDOW} '
                  'iterations up to the one named; [curves.csv](' + out_rel + '/curves.csv) holds every record) for '
                  'the runs whose curves were kept (the rows made after the curves were; the earlier seeds\' logs '
                  'are gone):', '', seg_markdown(seg_profiles).rstrip(), '',
                  f'![segmentor training losses per seed]({out_rel}/seg_curves.png)']
    lines += ['', END]
    return '\n'.join(lines)


def write_docs(path: str, section: str) -> None:
    """Put ``section`` between the markers of ``path`` (appended with a heading when the page has none yet)."""
    from .docs_section import write_section
    write_section(path, section, BEGIN, END, 'Detection and segmentation')


def write_outputs(rows: List[dict], out: str, docs: Optional[str] = None, root: str = '',
                  curves: Optional[Sequence[dict]] = None, kept_from: Sequence[str] = ()) -> List[dict]:
    """runs.csv, summary.csv, table.md, versions.json (with the sets of the ``kept_from`` folders, whose rows it
    keeps) and task_study.png under ``out``; with ``curves`` (task_curves.merged's rows) also curves.csv and
    seg_curves.png; the section of ``docs``. Errors name the child configs under the work root, not this machine's
    path."""
    import os
    os.makedirs(out, exist_ok=True)
    prefix = osp.join(root, '') if root else None
    clean = [{k: (v.replace(prefix, '') if prefix and isinstance(v, str) else v) for k, v in r.items()} for r in rows]
    from .tables import write_csv
    write_csv(osp.join(out, 'runs.csv'), [{k: r.get(k) for k in COLUMNS} for r in clean], COLUMNS)
    from .grid_identity import write_identities
    write_identities(out, [('runs.csv', clean, KEY)])
    from ..engine.versions import write_versions
    write_versions(out, kept_from)
    summary = summarise(clean)
    flat = [{k: v for k, v in e.items() if k != 'by_seed'} for e in summary]
    write_csv(osp.join(out, 'summary.csv'), flat, list(dict.fromkeys(k for e in flat for k in e)))
    with open(osp.join(out, 'table.md'), 'w') as f:
        f.write(markdown(summary))
    if rows:
        plot(clean, summary, osp.join(out, 'task_study.png'))
    profiles = []
    if curves is not None:
        from . import task_curves as tc
        write_csv(osp.join(out, 'curves.csv'), list(curves), tc.CURVE_FIELDS)
        profiles = tc.seg_profiles(clean, curves, FLOOR_MACC)
        tc.plot_seg(profiles, curves, osp.join(out, 'seg_curves.png'))
    if docs:
        rel = osp.relpath(out, osp.dirname(docs))
        write_docs(docs, docs_section(summary, rel, profiles))
    return summary
