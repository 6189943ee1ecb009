"""The old home of what the backbones share, kept so that earlier imports still work: the pieces live in
``softfree_mm.models.utils`` (cfg, tokens, windows, mlp, pretrained) and the backbone kit in
``softfree_mm.models.backbones.base``."""
from ..attention.fit import require_kernel_fit  # noqa: F401
from .backbones.base import SoftFreeBackbone, StagedBackbone  # noqa: F401
from .utils.cfg import (AttnCfg, check_foreign_args, expand_attn_cfg, expand_per_block, is_cfg,  # noqa: F401
                        per_stage, pretrain_hw)
from .utils.mlp import DWConvMlp, Mlp, _GeluLinear, _global_module_hooks, gelu_inference, gelu_linear  # noqa: F401
from .utils.pretrained import (PRETRAINED_KEYS, _WARNED_PRETRAINED, ScratchInit, init_from_cfg,  # noqa: F401
                               resolve_pretrained)
from .utils.tokens import grid_view, padded_key_mask, token_view  # noqa: F401
from .utils.windows import WindowLayout, _from_windows, _RowGather, _to_windows, identity_mask  # noqa: F401
