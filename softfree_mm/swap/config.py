"""``SoftFreeSwap``: the config-key form of :func:`swap_attention` (registered into every downstream MODELS registry
by ``softfree_mm.registry``). Needs mmengine; the rest of ``softfree_mm.swap`` needs torch only."""


def SoftFreeSwap(backbone, attn_cfg, layers=None, prefix_attention='softmax', init_cfg=None, pretrained=None):
    """Build any registered model (``backbone``) and swap its attention kernel: the config-key form of
    :func:`softfree_mm.swap_attention`. Returns the inner model itself (its own class, init_cfg, init_weights and
    train(); its state-dict keys unchanged), e.g.

        backbone=dict(type='SoftFreeSwap', backbone=dict(type='mmdet.SwinTransformer', ...),
                      attn_cfg=dict(type='poly', degree=3))

    ``init_cfg`` / ``pretrained`` given here (as downstream models and --cfg-options may do) go to the inner model.
    The inner type is looked up as mmengine's scoped build does: in the registry of the current default scope
    (mmdet, mmseg, mmpretrain, softfree_mm), or by its scope prefix ('mmdet.SwinTransformer').
    """
    from mmengine.config import ConfigDict
    from mmengine.registry import MODELS

    from .core import swap_attention
    if not isinstance(backbone, dict) or not backbone.get('type'):
        raise TypeError(f"SoftFreeSwap: 'backbone' must be a model config dict with a 'type', got {backbone!r}")
    backbone = ConfigDict(backbone)
    for key, val in (('init_cfg', init_cfg), ('pretrained', pretrained)):
        if val is None:
            continue
        if backbone.get(key) is not None and backbone[key] != val:
            raise ValueError(f'SoftFreeSwap: {key} is given both on the wrapper ({val!r}) and on the inner backbone '
                             f'({backbone[key]!r}); give it once')
        backbone[key] = val
    model = MODELS.build(backbone)
    if model is None:
        raise ValueError(f"SoftFreeSwap: building {backbone['type']!r} gave no model")
    return swap_attention(model, attn_cfg, layers=layers, prefix_attention=prefix_attention)
