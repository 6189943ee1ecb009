"""The warm-start recipe rule, version 2: which recipe a backbone layout takes, from the recipes grid's top-1.

Written after version 1 had judged the grid's first rows (the ``transfer``, ``transfer-blocks`` and ``transfer-final``
rows of PVTv2-b0 and XCiT-T12, commit e58bca4) and before every other row it judges (``transfer-half``,
``transfer-attn``, ``transfer-newhead``, and every row of the windowed Swin), because version 1 (``choose_default`` in
``warm_start_report.py``) treated the (kernel, seed) pairs as independent although the kernels of a seed share that
seed's softmax teacher, and took a recipe on the strength of any one kernel:

* the unit of analysis is the seed: for each seed, the candidate's top-1 minus the layout's current default's,
  paired by (kernel, seed), averaged over the layout's kernels; a 95 % t-interval over the seeds (df = seeds - 1);
* the candidate replaces the current default when that interval lies above zero, and still does with any one kernel
  left out and with any one seed left out (the default is applied to kernels and layouts beyond those measured, so a
  verdict that one kernel or one seed carries is not taken);
* otherwise the current default stays; of several candidates that replace it, the one with the largest mean.

Variants are measured against the layout's current default (the one the grid's runs were made beside). The rule is
applied at every budget the grid ran (:func:`budgets`); the package ships the verdict at the budget whose fraction of
the from-scratch schedule the shipped (ImageNet) warm start runs (:func:`shipped_budget`).
"""
from typing import Dict, Iterable, List, Optional, Tuple

from .stats import Interval, differences, paired

RULE_VERSION = 2
UNIT = 'seeds'


def _by_seed(candidate: Dict[Tuple[str, int], float], base: Dict[Tuple[str, int], float]) -> Interval:
    return paired(candidate, base, UNIT, unit_of=lambda key: key[1])


def _above_zero(i: Interval) -> bool:
    return i.half is not None and i.low > 0


def verdict(candidate: Dict[Tuple[str, int], float], base: Dict[Tuple[str, int], float]) -> dict:
    """The rule on one candidate: ``candidate`` and ``base`` map (kernel, seed) to top-1. Returns the interval over
    seeds, each kernel's own interval over its seeds (for the record: the rule does not read them), the intervals
    with one kernel or one seed left out, and whether the candidate replaces the default."""
    pairs = differences(candidate, base)
    kernels = sorted({k for k, _ in pairs})
    seeds = sorted({s for _, s in pairs})
    overall = _by_seed(candidate, base)
    drop_kernel = {k: _by_seed({key: v for key, v in candidate.items() if key[0] != k}, base) for k in kernels}
    drop_seed = {s: _by_seed({key: v for key, v in candidate.items() if key[1] != s}, base) for s in seeds}
    per_kernel = {k: _by_seed({key: v for key, v in candidate.items() if key[0] == k}, base) for k in kernels}
    robust = [*drop_kernel.values(), *drop_seed.values()]
    replaces = _above_zero(overall) and bool(robust) and all(_above_zero(i) for i in robust)
    return dict(interval=overall, per_kernel=per_kernel, drop_kernel=drop_kernel, drop_seed=drop_seed,
                kernels=kernels, seeds=seeds, replaces=replaces)


def grid_scores(rows: Iterable[dict], backbone: str, recipe: str, budget: int,
                default: str) -> Dict[Tuple[str, int], float]:
    """(kernel, seed) -> top-1 of the grid's warm starts of ``backbone`` with ``recipe`` at ``budget`` iterations,
    trained with the recipe's own stage-1 groups (the groups comparison's other rows left out); rows without a recipe
    name are ``default``'s."""
    from .warm_start_rows import own_groups
    out = {}
    for r in rows:
        if r.get('backbone') != backbone or r.get('start') != 'transfer' or int(r.get('iters') or 0) != budget:
            continue
        if (r.get('recipe') or default) != recipe or r.get('top1') in (None, '') or r.get('status') != 'ok':
            continue
        if own_groups(r, default):
            out[(r['kernel'], int(r['seed']))] = float(r['top1'])
    return out


def choose(rows: List[dict], budget: int, defaults: Dict[str, str],
           candidates: Optional[Dict[str, List[str]]] = None) -> Dict[str, dict]:
    """Per backbone of ``defaults`` (backbone -> its layout's current default): every other recipe the grid holds
    (or ``candidates[backbone]``) judged against that default at ``budget``; the chosen recipe."""
    out = {}
    for bb, default in defaults.items():
        recipes = (candidates or {}).get(bb) or sorted({r.get('recipe') or default for r in rows
                                                        if r.get('backbone') == bb and r.get('start') == 'transfer'})
        base = grid_scores(rows, bb, default, budget, default)
        verdicts = {rec: verdict(grid_scores(rows, bb, rec, budget, default), base)
                    for rec in recipes if rec != default and base}  # no finished default run: nothing to judge
        winners = sorted((v['interval'].mean, rec) for rec, v in verdicts.items() if v['replaces'])
        out[bb] = dict(default=default, chosen=winners[-1][1] if winners else default, verdicts=verdicts,
                       budget=budget, rule=RULE_VERSION)
    return out


def lines(result: Dict[str, dict], names: Optional[Dict[str, str]] = None) -> List[str]:
    """One line per backbone and candidate: the interval over seeds, the weakest interval with a kernel or a seed
    left out, and the verdict."""
    out = []
    for bb, res in result.items():
        label = (names or {}).get(bb, bb)
        if not res['verdicts']:  # its from-scratch rows only, so far: nothing to judge
            out.append(f"- {label}: no recipe against `{res['default']}` in this grid yet: nothing to judge.")
            continue
        for rec, v in res['verdicts'].items():
            left = [*(('kernel ' + k, i) for k, i in v['drop_kernel'].items()),
                    *((f'seed {s}', i) for s, i in v['drop_seed'].items())]
            weakest = min(left, key=lambda x: (x[1].low if x[1].low is not None else float('-inf')), default=None)
            weak = f'; weakest with one left out: without {weakest[0]} {weakest[1].text()}' if weakest else ''
            out.append(f"- {label}: `{rec}` against `{res['default']}` at {res['budget']} iterations: "
                       f"{v['interval'].text()}{weak}: {'replaces it' if v['replaces'] else 'does not replace it'}.")
        out.append(f"- {label}: the rule (version {res['rule']}) keeps `{res['chosen']}`." if res['chosen'] ==
                   res['default'] else f"- {label}: the rule (version {res['rule']}) takes `{res['chosen']}`.")
    return out


BEGIN = '<!-- recipe rule v2: made by tools/analysis/recipe_rule.py, do not edit by hand -->'
END = '<!-- recipe rule v2: end -->'
NAMES = {'pvt': 'PVTv2-b0 without spatial reduction (token attention)', 'xcit': 'XCiT-T12 (channel attention)',
         'swin': 'the tiny Swin, 4x4 windows, shifted (windowed token attention)'}
# the det / seg layouts the shipped default reaches: (backbone and layout, its layout class (a key of
# LAYOUT_DEFAULTS), the grid backbone measured in that very layout or None)
LAYOUTS = (('XCiT-S12: channel attention', 'channels', 'xcit'),
           ('PVTv2-b2 without spatial reduction (InLine, SOFT): global token attention', 'tokens', 'pvt'),
           ('PVTv2-b2 with spatial reduction: tokens against reduced keys', 'tokens', None),
           ('Swin-T: 7 x 7 windows, shifted', 'windows', 'swin'),
           ('CSWin-T: stripes', 'windows', None))


def budgets(rows: Iterable[dict]) -> List[int]:
    """The warm starts' iterations the grid ran (its transfer rows), in order."""
    return sorted({int(r['iters']) for r in rows if r.get('start') == 'transfer' and r.get('iters') not in (None, '')})


def scratch_iters(rows: Iterable[dict]) -> int:
    """The grid's from-scratch iterations (what its budgets are fractions of)."""
    found = {int(r['iters']) for r in rows if r.get('start') == 'scratch' and r.get('iters') not in (None, '')}
    if len(found) != 1:
        raise ValueError(f'the grid holds from-scratch runs of {sorted(found)} iterations: expected one length')
    return found.pop()


def shipped_fraction() -> float:
    """The fraction of the from-scratch schedule the shipped warm start runs: the ImageNet scale's iterations over
    the 300-epoch from-scratch recipe's (an epoch is the scale's validation interval)."""
    from ..engine.layout_defaults import SCRATCH_EPOCHS_DEFAULT
    from ..engine.warm_start import SCALES
    scale = SCALES['imagenet']
    return scale.iters / (SCRATCH_EPOCHS_DEFAULT * scale.val_every)


def shipped_budget(rows: List[dict]) -> int:
    """The grid budget at the shipped fraction (10 % of 300 iterations: 30); an error when the grid did not run it."""
    want = round(shipped_fraction() * scratch_iters(rows))
    if want not in budgets(rows):
        raise ValueError(f'the grid ran no warm start of {want} iterations (the shipped fraction, '
                         f'{shipped_fraction():.0%}); it ran {budgets(rows)}')
    return want


def default_budget(rows: List[dict], carries: Optional[str] = None) -> int:
    """The grid budget whose verdict the package ships: the shipped fraction's (:func:`shipped_budget`), unless the
    carry-over test (analysis/carry_over.py) found that the stage-1 step count, not the fraction, decides
    (``carries='steps'``): then the grid's largest budget, where stage 1 had the most steps."""
    return budgets(rows)[-1] if carries == 'steps' else shipped_budget(rows)


def layout_verdicts(result: Dict[str, dict]) -> Dict[str, str]:
    """Layout class (a key of ``LAYOUT_DEFAULTS``) -> the recipe the rule chose on the grid backbone measured in that
    layout (classes whose backbone has no recipe rows left out)."""
    return {kind: result[bb]['chosen'] for _, kind, bb in LAYOUTS
            if bb and bb in result and result[bb]['verdicts']}


def layout_table(results: Dict[int, Dict[str, dict]], shipped: int, scratch: int,
                 follows: Optional[int] = None) -> List[str]:
    """Where each shipped layout default was measured: per det / seg layout, the default the package ships
    (``LAYOUT_DEFAULTS``), the grid layout it was measured on (or that it borrows the verdict of another), and
    version 2's choice there at each budget (``results``: budget -> :func:`choose`'s result; a layout whose grid
    backbone has no recipe rows: not measured)."""
    from ..engine.warm_start import LAYOUT_DEFAULTS
    measured = {kind: bb for _, kind, bb in LAYOUTS if bb}
    follows = shipped if follows is None else follows
    heads = [f'version 2 at {b} ({100 * b / scratch:.0f} %' + (', the shipped fraction' if b == shipped else '')
             + (', the defaults follow it' if b == follows else '') + ')' for b in results]
    out = ['| layout | shipped default | measured on | ' + ' | '.join(heads) + ' |',
           '|---|---|---|' + '---|' * len(heads)]
    for label, kind, bb in LAYOUTS:
        src = bb or measured[kind]
        if any(src not in res or not res[src]['verdicts'] for res in results.values()):
            where, chosen = f'not measured yet ({NAMES[src]} has no recipe rows in this grid)', ['none'] * len(heads)
        else:
            where = f'{NAMES[src]}, digits scale only' if bb else f'not measured: borrows {NAMES[src]}'
            chosen = [f"`{res[src]['chosen']}`" for res in results.values()]
        out.append(f"| {label} | `{LAYOUT_DEFAULTS[kind]}` | {where} | " + ' | '.join(chosen) + ' |')
    return out


def section(rows: List[dict], defaults: Dict[str, str], carries: Optional[str] = None) -> str:
    """The docs section: the verdict lines of version 2 on ``rows`` at every budget the grid ran, and where each
    shipped default was measured, between the markers (``carries``: the carry-over test's decision)."""
    scratch, shipped, follows = scratch_iters(rows), shipped_budget(rows), default_budget(rows, carries)
    results = {b: choose(rows, b, defaults) for b in budgets(rows)}
    out = [BEGIN, '']
    for b, result in results.items():
        what = ('the fraction the shipped ImageNet warm start runs' if b == shipped else 'not the fraction that ships')
        what += '; the shipped defaults follow this verdict' if b == follows else ''
        out += [f'**At {b} iterations, {100 * b / scratch:.0f} % of the from-scratch {scratch}** ({what}):', '',
                *lines(result, NAMES), '']
    return '\n'.join([*out, *layout_table(results, shipped, scratch, follows), '', END])


def write_docs(path: str, rows: List[dict], defaults: Dict[str, str], carries: Optional[str] = None) -> None:
    from .docs_section import write_section
    write_section(path, section(rows, defaults, carries), BEGIN, END, 'The recipe rule, version 2')
