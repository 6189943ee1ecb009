"""The warm-start recipes (:class:`Recipe`, :data:`RECIPES`): what stage 1 trains and its loss, the optimiser, the
schedule's shape, stage 1's share of the budget, how stage 2 starts and the learning rates, as multiples of the
scale's from-scratch classifier lr. :mod:`softfree_mm.engine.warm_start` runs them at its scales;
:mod:`softfree_mm.engine.layout_defaults` names the one each backbone layout takes.
"""
from dataclasses import dataclass, field
from typing import Dict, Tuple

from .errors import UsageError


@dataclass(frozen=True)
class Recipe:
    """One warm-start recipe. Learning rates are multiples of the scale's from-scratch classifier lr."""

    name: str
    description: str
    groups: Tuple[str, ...] = ('kernel', 'qkv')  # what stage 1 trains (AttentionTransfer's ``train``)
    loss: str = 'blocks'  # AttentionTransfer's ``loss``: 'blocks', 'blocks+final', 'blocks+attn'
    stage1_share: float = 1 / 3  # of the warm start's iterations
    stage1_lr: float = 3.0
    stage2_lr: float = 0.1
    floor: float = 0.01  # where each stage's cosine ends
    warmup: float = 0.1  # each stage's linear warm-up, a share of its iterations, from warmup_start x the peak
    warmup_start: float = 0.01
    stage1_optimizer: Dict = field(default_factory=lambda: dict(type='AdamW', weight_decay=0.0, eps=1e-8,
                                                                betas=(0.9, 0.999)))
    stage1_clip: float = 5.0
    head: str = 'release'  # stage 2's head: the release's classifier ('release') or a new one ('new')

    def stage_iters(self, total: int) -> Tuple[int, int]:
        """(stage 1, stage 2) iterations of a warm start of ``total``."""
        first = max(1, round(total * self.stage1_share))
        if total - first < 1:
            raise UsageError(f'a warm start of {total} iterations leaves stage 2 none (stage 1: {first})')
        return first, total - first


RECIPES: Dict[str, Recipe] = {
    'transfer': Recipe('transfer', 'attention transfer of q, k, v and the kernel\'s own parameters, block by block '
                                   '(a third of the budget), then a fine-tune with the release\'s head'),
    # the variants the recipes grid measures against it (docs/warm_start.md): each one change
    'transfer-half': Recipe('transfer-half', 'the default with half of the budget in stage 1 instead of a third',
                            stage1_share=0.5),
    'transfer-final': Recipe('transfer-final', 'the default with final-feature distillation added to stage 1: the '
                                               'student\'s own end-to-end output against the teacher\'s (that pass '
                                               'runs the whole student without with_cp)',
                             loss='blocks+final'),
    'transfer-attn': Recipe('transfer-attn', 'the default with attention-weight matching added to stage 1 (64 '
                                             'sampled query rows per head; kernels with a score map only)',
                            loss='blocks+attn'),
    'transfer-blocks': Recipe('transfer-blocks', 'the default with whole blocks trained in stage 1 (attention, '
                                                 'MLP and norms) instead of q, k, v and the kernel', groups=('blocks', )),
    'transfer-newhead': Recipe('transfer-newhead', 'the default with a new head in stage 2 instead of the '
                                                   'release\'s', head='new'),
}
DEFAULT = 'transfer'  # the grid's reference recipe: a layout outside LAYOUT_DEFAULTS' measurements starts from it
