"""The measured lines the docs quote, made from the committed CSVs (``doc_figures.SECTIONS`` places them).

Every interval is a 95 % t-interval whose unit of analysis is named: the seed (runs of one seed share its
initialisation, data order and, for a warm start, its softmax teacher), never a (kernel, seed) pair.
"""
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Tuple

from .stats import Interval, interval, mean_std

CHANCE_TOP1 = 15.0  # a classifier at or below this top-1 (chance: 10 %) has not trained
COLLAPSE_MACC = 100 / 11 + 0.5  # a segmentor whose mAcc is this low predicts one class of eleven: background only
TARGET = 1.0  # the warm start's target: within 1 point of scratch (paired mean)
SEEDS = 'seeds'

KERNEL_NAMES = OrderedDict([
    ('softmax', 'softmax'), ('poly:degree=3', 'x^3 / sqrt(N)'), ('poly:degree=3,scale=1.0', 'x^3 unscaled'),
    ('poly:degree=1', 'x / sqrt(N)'), ('relu', 'ReLU / N'), ('linear', 'linear'), ('inline', 'InLine'),
    ('inline:local_residual=False', 'InLine without its residual'), ('soft:landmark_ratio=2', 'SOFT'),
    ('synthesizer', 'Synthesizer'), ('poly:degree=3,qk_norm=True', 'x^3 / sqrt(N), q and k standardised')])
STUDY_TITLES = OrderedDict([('study_xcit_t12_digits', 'XCiT-T12 (channel attention)'),
                            ('study_pvt_v2_b0_digits', 'PVTv2-b0 without spatial reduction (token attention)')])
GRID_TITLES = OrderedDict([('xcit', 'XCiT-T12 (channel attention)'),
                           ('pvt', 'PVTv2-b0 without spatial reduction (token attention)'),
                           ('swin', 'tiny Swin (windowed token attention, 4x4 windows, shifted)')])


def _grid_titles(rows: List[dict]):
    """The grid backbones (key, title) that have rows in ``rows``."""
    have = {r.get('backbone') for r in rows}
    return [(bb, title) for bb, title in GRID_TITLES.items() if bb in have]


def name(kernel: str) -> str:
    return KERNEL_NAMES.get(kernel, kernel)


def _by_seed(rows: Iterable[dict], value: str = 'top1') -> Dict[int, float]:
    return {int(r['seed']): float(r[value]) for r in rows if r.get(value) is not None and r.get('status') == 'ok'}


def seed_paired(values: Dict[int, float], against: Dict[int, float]) -> Tuple[Interval, int]:
    """(the 95 % interval of values - against over the seeds both hold, how many of them are above)."""
    seeds = sorted(set(values) & set(against))
    diffs = [values[s] - against[s] for s in seeds]
    return interval(diffs, SEEDS), sum(d > 0 for d in diffs)


def cell(i: Interval, digits: int = 1) -> str:
    """'+0.8 [-1.2, +2.8]' (the unit and n are the table's); the mean alone without an interval."""
    if i.mean is None:
        return ''
    if i.half is None:
        return f'{i.mean:+.{digits}f} (n = {i.n})'
    return f'{i.mean:+.{digits}f} [{i.low:+.{digits}f}, {i.high:+.{digits}f}]'


def excludes_zero(i: Interval) -> bool:
    return i.half is not None and not i.holds_zero


# ------------------------------------------------------------------ the kernel study (docs/study.md)
def study_lines(runs: List[dict]) -> List[str]:
    """Per backbone: each kernel against softmax paired by seed, the seeds at chance, and the comparisons the
    papers' claims call for (scaled against unscaled x^3, InLine against linear)."""
    out = []
    for config, title in STUDY_TITLES.items():
        rows = [r for r in runs if r['config'] == config]
        by = OrderedDict((k, _by_seed([r for r in rows if r['kernel'] == k], 'top1_final'))
                         for k in dict.fromkeys(r['kernel'] for r in rows))
        ref = by.get('softmax', {})
        n = len(ref)
        out += [f'**{title}**, final top-1 minus softmax\'s, paired by seed (95 % interval over the {n} seeds; '
                'top-1 per seed in seed order):', '',
                '| kernel | paired Δ vs softmax | seeds above | top-1 per seed | seeds at chance (≤ 15 %) |',
                '|---|---|---|---|---|']
        for k, vals in by.items():
            if not vals:
                out.append(f'| {name(k)} | does not fit (no run) | | | |')
                continue
            seeds = ', '.join(f'{vals[s]:.1f}' for s in sorted(vals))
            low = sum(v <= CHANCE_TOP1 for v in vals.values())
            if k == 'softmax':
                out.append(f'| softmax | reference | | {seeds} | {low} of {len(vals)} |')
                continue
            i, above = seed_paired(vals, ref)
            out.append(f'| {name(k)} | {cell(i)} | {above} of {i.n} | {seeds} | {low} of {len(vals)} |')
        pairs = [('poly:degree=3', 'poly:degree=3,scale=1.0'), ('inline', 'linear'),
                 ('inline:local_residual=False', 'linear'), ('inline', 'inline:local_residual=False')]
        comp = []
        for a, b in pairs:
            if by.get(a) and by.get(b):
                i, above = seed_paired(by[a], by[b])
                comp.append(f'{name(a)} minus {name(b)} {cell(i)}, {above} of {i.n} seeds above')
        if comp:
            out += ['', 'Paired by seed, 95 % interval over seeds: ' + '; '.join(comp) + '.']
        out.append('')
    return out


def norm_lines(curves: List[dict]) -> List[str]:
    """Per backbone and kernel, ||A||_F / sqrt(N) and the score Jacobian's norm / sqrt(N) at the first recorded step
    and at the last, each the mean over layers and seeds."""
    out = ['| backbone | kernel | ‖A‖_F / sqrt(N), first step | last step | Jacobian / sqrt(N), first step | '
           'last step |', '|---|---|---|---|---|---|']
    for config, title in STUDY_TITLES.items():
        rows = [r for r in curves if r['config'] == config]
        for k in dict.fromkeys(r['kernel'] for r in rows):
            rk = [r for r in rows if r['kernel'] == k]
            first, last = min(r['step'] for r in rk), max(r['step'] for r in rk)

            def at(step, col):
                m, _, n = mean_std(r.get(col) for r in rk if r['step'] == step)
                return '' if m is None else f'{m:.3g}'
            out.append(f"| {title.split(' (')[0]} | {name(k)} | {at(first, 'fro_sqrt_n')} | {at(last, 'fro_sqrt_n')} | "
                       f"{at(first, 'jac_sqrt_n')} | {at(last, 'jac_sqrt_n')} |")
    return out


# ------------------------------------------------------------------ the warm-start grid (docs/warm_start.md)
def _grid(rows: List[dict], backbone: str, kernel: str, start: str, iters: int,
          recipe: str = 'transfer') -> Dict[int, float]:
    from ..engine.warm_start import RECIPES
    groups = '+'.join(RECIPES[recipe].groups)
    return _by_seed(r for r in rows if r['backbone'] == backbone and r['kernel'] == kernel and r['start'] == start
                    and int(r['iters']) == iters and (start != 'transfer' or ((r.get('recipe') or 'transfer') == recipe
                                                                              and r.get('groups') == groups)))


def target(i: Interval) -> str:
    """The 1-point target by the interval, not the mean: 'shown' where its lower bound is within ``TARGET`` of
    scratch or above, 'missed' where its upper bound is below that, 'undecided' where it straddles it."""
    if i.mean is None:
        return ''
    if i.half is None:
        return f'no interval (n = {i.n})'
    return 'shown' if i.low >= -TARGET else 'missed' if i.high < -TARGET else 'undecided'


WARM_STARTS = (('swap', None), ('transfer', 'transfer'), ('transfer', 'transfer-half'))


def warm_start_lines(rows: List[dict], budgets=(75, 30)) -> List[str]:
    """Per backbone, budget, start and kernel: top-1 minus the same kernel's from scratch, paired by seed; whether
    the interval shows the target (within 1 point of scratch or above); the softmax teachers' top-1 per seed."""
    out = [f'Top-1 minus the same kernel from scratch (300 iterations), paired by seed, 95 % interval over seeds; '
           f'"target": the interval\'s lower bound within {TARGET:g} point of scratch or above (shown), its upper '
           'bound below that (missed), or neither (undecided).', '',
           '| backbone | iterations | kernel | swap, as it is | swap + fine-tune | `transfer` + fine-tune | '
           '`transfer-half` + fine-tune | target (swap + ft / `transfer` / `transfer-half`) |',
           '|---|---|---|---|---|---|---|---|']
    for bb, title in _grid_titles(rows):
        kernels = [k for k in dict.fromkeys(r['kernel'] for r in rows if r['backbone'] == bb) if k != 'softmax']
        for budget in budgets:
            for k in kernels:
                scratch = _grid(rows, bb, k, 'scratch', 300)
                i0 = seed_paired(_grid(rows, bb, k, 'swap', 0), scratch)[0]
                ii = [seed_paired(_grid(rows, bb, k, start, budget, *([rec] if rec else [])), scratch)[0]
                      for start, rec in WARM_STARTS]
                meets = ' / '.join(target(i) or '-' for i in ii)
                out.append(f"| {title.split(' (')[0]} | {budget} | {name(k)} | {cell(i0)} | "
                           + ' | '.join(cell(i) for i in ii) + f' | {meets} |')
    out += ['', 'The softmax classifiers, each seed\'s teacher, top-1 per seed: ' + '; '.join(
        f"{title.split(' (')[0]} " + ', '.join(f'seed {s} {v:.1f}' for s, v in
                                             sorted(_grid(rows, bb, 'softmax', 'scratch', 300).items()))
        for bb, title in _grid_titles(rows)) + '.', '']
    return out


def median(values: List[float]) -> Optional[float]:
    v = sorted(values)
    if not v:
        return None
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def unbounded_lines(rows: List[dict], backbones=('pvt', 'swin'), budgets=(30, 75),
                    kernels=('poly:degree=3', 'poly:degree=1')) -> List[str]:
    """Top-1 per seed of the polynomials in the token layouts, from scratch and from each start at each budget: the
    median and the seeds at chance (k of n), not a mean and a standard deviation (the rows are bimodal)."""
    out = [f'Top-1 per seed of the polynomials in token attention and windows (median; seeds at chance: top-1 at or '
           f'below {CHANCE_TOP1:g} %, k of n):', '',
           '| backbone | kernel | start | ' + ' | '.join(f'seed {s}' for s in range(5)) + ' | median | at chance |',
           '|---|---|---|' + '---|' * 7]
    for bb in backbones:
        short = GRID_TITLES[bb].split(' (')[0]
        for k in kernels:
            starts = [('scratch (300)', _grid(rows, bb, k, 'scratch', 300))]
            for b in budgets:
                starts += [(f'swap + fine-tune, {b}', _grid(rows, bb, k, 'swap', b)),
                           (f'`transfer`, {b}', _grid(rows, bb, k, 'transfer', b)),
                           (f'`transfer-half`, {b}', _grid(rows, bb, k, 'transfer', b, 'transfer-half'))]
            for label, vals in starts:
                if not vals:
                    continue
                low = sum(v <= CHANCE_TOP1 for v in vals.values())
                out.append(f'| {short} | {name(k)} | {label} | '
                           + ' | '.join(f'{vals[i]:.1f}' if i in vals else '' for i in range(5))
                           + f' | {median(list(vals.values())):.1f} | {low} of {len(vals)} |')
    return out + ['']


def recipe_lines(rows: List[dict], budget: int = 75, base: str = 'transfer') -> List[str]:
    """Each variant against ``base`` per kernel, paired by seed (the rule version 2 reads the seed means over
    kernels; these are the per-kernel figures, for the record)."""
    out = [f'Each recipe minus `{base}` at {budget} iterations, per kernel, paired by seed (95 % interval over '
           'seeds):', '', '| backbone | recipe | kernel | paired Δ | seeds above |', '|---|---|---|---|---|']
    for bb, title in GRID_TITLES.items():
        recipes = [r for r in dict.fromkeys((r.get('recipe') or base) for r in rows
                                            if r['backbone'] == bb and r['start'] == 'transfer') if r != base]
        for rec in recipes:
            for k in dict.fromkeys(r['kernel'] for r in rows if r['backbone'] == bb and r.get('recipe') == rec):
                i, above = seed_paired(_grid(rows, bb, k, 'transfer', budget, rec),
                                       _grid(rows, bb, k, 'transfer', budget, base))
                if not i.n:  # no seed has both runs yet (a grid reported while it runs)
                    continue
                out.append(f"| {title.split(' (')[0]} | `{rec}` | {name(k)} | {cell(i)} | {above} of {i.n} |")
    return out + ['']


def detector_lines(detectors: List[dict]) -> List[str]:
    """The demo Mask R-CNN from each start against the same kernel's from-scratch classifier, paired by seed."""
    out = ['The demo Mask R-CNN (XCiT-T12) from each 75-iteration start minus the same kernel\'s from-scratch start, '
           'paired by seed (95 % interval over seeds):', '',
           '| kernel | start | bbox mAP | segm mAP | seeds |', '|---|---|---|---|---|']
    for k in dict.fromkeys(d['kernel'] for d in detectors if d['kernel'] != 'softmax'):
        for start in ('swap', 'transfer'):
            row = []
            for m in ('bbox_mAP', 'segm_mAP'):
                base = _by_seed([d for d in detectors if d['kernel'] == k and d['start'] == 'scratch'], m)
                i, _ = seed_paired(_by_seed([d for d in detectors if d['kernel'] == k and d['start'] == start], m),
                                   base)
                row.append(cell(i, 3))
            out.append(f'| {name(k)} | {start} | {row[0]} | {row[1]} | {i.n} |')
    sm = [d for d in detectors if d['kernel'] == 'softmax']
    b, _, n = mean_std(d['bbox_mAP'] for d in sm)
    s, _, _ = mean_std(d['segm_mAP'] for d in sm)
    if n:
        out += ['', f'From the softmax classifier: bbox {b:.3f}, segm {s:.3f} mAP (mean of {n} seeds).']
    return out + ['']


# ------------------------------------------------------------------ the stage-1 cost (docs/warm_start.md)
def cost_lines(rows: List[dict]) -> List[str]:
    """The --cost rows, and both stages' cost per backbone and recipe as the engine projects it."""
    from ..engine.layout_defaults import SCRATCH_EPOCHS, SCRATCH_EPOCHS_DEFAULT, stage_epochs
    out = ['| config | recipe | stage-1 s / step | supervised s / step | ratio | trains (M) | student (M) | '
           'both stages, epochs of the supervised recipe | share of pretraining from scratch |',
           '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        family = _family_of(r['config'])
        stage1, stage2 = stage_epochs(r.get('recipe') or 'transfer')
        epochs = stage1 * float(r['ratio']) + stage2
        scratch = SCRATCH_EPOCHS.get(family, SCRATCH_EPOCHS_DEFAULT)
        out.append(f"| {r['config']} | `{r.get('recipe') or 'transfer'}` | {float(r['transfer_s']):.2f} | "
                   f"{float(r['classifier_s']):.2f} | {float(r['ratio']):.2f} | {int(r['trained_params']) / 1e6:.1f} | "
                   f"{int(r['student_params']) / 1e6:.1f} | {epochs:.0f} | {100 * epochs / scratch:.0f} % of "
                   f'{scratch} |')
    return out + ['']


FAMILY_OF_CONFIG = {'xcit_s12': 'SoftFreeXCiT', 'swin_t': 'SoftFreeSwin', 'pvt_v2_b2': 'SoftFreePVTv2',
                    'cswin_t': 'SoftFreeCSWin'}


def _family_of(config: str) -> str:
    stem = config[len('transfer_'):].rsplit('_', 1)[0] if config.startswith('transfer_') else config
    return FAMILY_OF_CONFIG.get(stem, stem)


def measured_cost(rows: List[dict]) -> Dict[str, float]:
    """Family -> the measured ratio of a stage-1 step of its layout default's recipe (what ``STAGE1_STEP_COST`` must
    hold): the row of that recipe, or of one whose stage 1 trains the same groups with the same loss (its step is the
    same: ``transfer-half`` differs from ``transfer`` only in how many steps stage 1 gets)."""
    from ..engine.layout_defaults import default_recipe
    from ..engine.warm_start import RECIPES

    def step(name):
        return RECIPES[name].groups, RECIPES[name].loss
    out = {}
    for r in rows:
        family = _family_of(r['config'])
        if step(r.get('recipe') or 'transfer') == step(default_recipe(family)):
            out[family] = round(float(r['ratio']), 2)
    return out


# ------------------------------------------------------------------ the README's line on the warm start
def readme_warm_start_line(grid: List[dict], rule_results: Dict[int, Dict[str, dict]], follows: int) -> str:
    """The README's bullet on the warm start: per grid backbone, the rule's verdict at each budget (the one the shipped
    defaults follow named)."""
    parts = []
    for bb, title in _grid_titles(grid):
        kernels = [k for k in dict.fromkeys(r['kernel'] for r in grid if r['backbone'] == bb) if k != 'softmax']
        verdicts = []
        for b, result in rule_results.items():
            res = result.get(bb, {})
            verb = 'keeps' if res.get('chosen') == res.get('default') else 'takes'
            verdicts.append(f"{verb} `{res.get('chosen')}` at {b} iterations{' (shipped)' if b == follows else ''}")
        if not any(r['backbone'] == bb and r['start'] == 'transfer' for r in grid) or not kernels:
            continue
        parts.append(f"{title.split(' (')[0]} " + ', '.join(verdicts))
    return ("- **The warm start's default** (recipe rule version 2, seeds as the unit; the carry-over test decides "
            "which budget's verdict ships): " + '; '.join(parts) + '. [docs/warm_start.md](docs/warm_start.md)')
