"""Which warm-start recipe each backbone layout takes, where that choice was measured, and what its stage 1 costs.

The choice (:data:`LAYOUT_DEFAULTS`, by the layout's class: global or reduced token attention, windowed token
attention, channel attention) is the recipe rule's, version 2 (``softfree_mm/analysis/recipe_rule.py``,
docs/warm_start.md): the seed is the unit, and a variant replaces the default only where its interval over seeds lies
above zero, with any one kernel and any one seed left out. The grid ran 10 % and 25 % of the from-scratch schedule;
at 10 % (the ImageNet scale's fraction) ``transfer-half`` replaces ``transfer`` in token attention and in windows,
at 25 % nothing does. The carry-over test (``analysis/carry_over.py``) found the stage-1 step count, not the fraction,
deciding the 10 % verdict (at 10 % of a schedule twice as long ``transfer`` trains x^3 in every seed), so the package
follows the 25 % verdict: ``transfer`` in every class (a test ties this table to the rule's output at the budget
``recipe_rule.default_budget`` names). Version 1 had taken ``transfer-final`` for token attention from (kernel, seed) pairs counted as
independent; work dirs made with another recipe than a stage config's are refused by the chain's run identities.

Where it was measured (:data:`MEASURED_ON`): one grid backbone per class, at the digits scale. A backbone whose
attention meets other tokens than the measured layout's (CSWin's stripes against the windows measured, PVT with
spatially reduced keys against the global tokens measured, a family that declares no layout) borrows the verdict;
:func:`default_origin` says so in one line, which the warm-start tools print.

What stage 1 costs (:data:`STAGE1_STEP_COST`): a stage-1 step of the layout default's recipe (or of a recipe whose
stage 1 trains the same groups with the same loss: ``transfer-half``'s step is ``transfer``'s) in supervised steps of
the same classifier, per shipped backbone, from ``tools/analysis/warm_start_grid.py --cost`` (committed in
docs/results/warm_start/cost_cpu.csv; a test holds this table to it); :func:`warm_start_cost` projects both stages.
"""
from typing import Dict, Optional, Union

from .errors import UsageError

LAYOUT_DEFAULTS: Dict[str, str] = {'tokens': 'transfer', 'windows': 'transfer', 'channels': 'transfer'}
# a family's declared layout (Family.LAYOUTS) -> the class whose default it takes; a family that declares none takes
# what its attention mixes ('tokens' or 'channels')
LAYOUT_CLASS: Dict[str, str] = {'global tokens': 'tokens', 'reduced keys': 'tokens', 'windows': 'windows',
                                'stripes': 'windows', 'channels': 'channels'}
# the class -> (the layout its default was measured on, the grid backbone it was measured with)
MEASURED_ON: Dict[str, tuple] = {'tokens': ('global tokens', 'PVTv2-b0 without spatial reduction'),
                                 'windows': ('windows', "the study's tiny Swin with 4x4 shifted windows"),
                                 'channels': ('channels', 'XCiT-T12')}
# a stage-1 step of the layout's default recipe (transfer-half's step is transfer's) / a supervised step of the same
# classifier (CPU, 8 images of 224, docs/results/warm_start/cost_cpu.csv), per shipped backbone
STAGE1_STEP_COST: Dict[str, float] = {'SoftFreeXCiT': 1.02, 'SoftFreeSwin': 1.01, 'SoftFreePVTv2': 0.89,
                                       'SoftFreeCSWin': 0.98}
WARM_EPOCHS = 30  # the ImageNet scale's warm start, both stages (split by the recipe's stage1_share)
SCRATCH_EPOCHS_DEFAULT = 300  # the from-scratch recipe's epochs
SCRATCH_EPOCHS = {'SoftFreeXCiT': 400}  # where it is not SCRATCH_EPOCHS_DEFAULT


def stage_epochs(recipe: str) -> tuple:
    """(stage 1, stage 2) epochs of the ImageNet scale's warm start under ``recipe``."""
    from .recipes import RECIPES
    first = WARM_EPOCHS * RECIPES[recipe].stage1_share
    return first, WARM_EPOCHS - first


def _family(backbone_type: str):
    import softfree_mm.models  # noqa: F401  (declares the families)
    from softfree_mm.models.family import FAMILIES
    name = backbone_type.split('.')[-1]
    if name not in FAMILIES:
        raise UsageError(f'no backbone family {backbone_type!r}; known: {", ".join(FAMILIES)}')
    return name, FAMILIES[name].family


def layout_class(backbone: Union[str, dict]) -> str:
    """The class of layout (a key of :data:`LAYOUT_DEFAULTS`) of the backbone a config's ``backbone`` dict builds,
    or of a family's default build when given its type name."""
    cfg = dict(type=backbone) if isinstance(backbone, str) else dict(backbone)
    _, family = _family(cfg['type'])
    return LAYOUT_CLASS.get(family.layout(cfg), family.mixes)


def default_recipe(backbone: Union[str, dict]) -> str:
    """The name of the recipe a backbone's warm start takes by default (its layout class's): ``backbone`` a config's
    ``backbone`` dict (its build arguments decide the layout: Swin with global windows is global token attention),
    or a family's type name (its default build)."""
    return LAYOUT_DEFAULTS[layout_class(backbone)]


def default_origin(backbone: dict) -> Optional[str]:
    """None when the backbone a config's ``backbone`` dict builds has the layout its default recipe was measured on;
    else one line saying that the default is borrowed for it, and from where."""
    name, family = _family(backbone['type'])
    kind = layout_class(backbone)
    layout, where = MEASURED_ON[kind]
    mine = family.layout(backbone)
    if mine == layout:
        return None
    what = f"{name}'s {mine}" if mine else f'{name} (its family declares no layout)'
    return (f'the warm start\'s default recipe here, `{LAYOUT_DEFAULTS[kind]}`, was measured on {where} '
            f'({layout}) at the digits scale, not on {what}: this backbone borrows that verdict (docs/warm_start.md, '
            '"Where each default was measured")')


def warm_start_cost(backbone_type: str) -> str:
    """Both stages' cost in epochs of the supervised recipe and as a share of pretraining from scratch, from the
    measured stage-1 step (``STAGE1_STEP_COST``) and the family's default recipe's split; unmeasured backbones get the
    range over the measured ones."""
    name, _ = _family(backbone_type)
    stage1, stage2 = stage_epochs(default_recipe(backbone_type))
    ratios = [STAGE1_STEP_COST[name]] if name in STAGE1_STEP_COST else sorted(STAGE1_STEP_COST.values())
    if not ratios:
        return 'its cost is not measured'
    scratch = SCRATCH_EPOCHS.get(name, SCRATCH_EPOCHS_DEFAULT)
    lo, hi = (stage1 * r + stage2 for r in (ratios[0], ratios[-1]))
    epochs = f'{lo:.0f}' if round(lo) == round(hi) else f'{lo:.0f} to {hi:.0f}'
    share = (f'{100 * lo / scratch:.0f}' if round(100 * lo / scratch) == round(100 * hi / scratch)
             else f'{100 * lo / scratch:.0f} to {100 * hi / scratch:.0f}')
    measured = 'measured' if name in STAGE1_STEP_COST else 'the range over the backbones measured'
    return (f'both stages cost {epochs} epochs of the supervised recipe, {share} % of its {scratch} from scratch, by a '
            f'stage-1 step on CPU ({measured})')
