"""Which kernel fits which foreign model under :func:`softfree_mm.swap_attention`: the README's models x kernels table.

Each cell is computed, not written: a tiny variant of the model (random weights) is swapped to the kernel (every
attention layer), run forward and backward, and the gradients are checked finite; a refused swap gives the cell the
reason and, when only some layers refuse, how many layers fit.

    python -m softfree_mm.analysis.swap_support            # markdown table
"""
import copy
import importlib
from collections import OrderedDict
from typing import Callable, Dict, List, Tuple

import torch

from ..attention import list_attentions
from ..swap import SwapError, swap_attention, swap_summary


# ------------------------------------------------------------------------------------------------ tiny models
# (no stochastic depth: a training step must reach every attention layer)
def _mm(scope: str, cfg: dict):
    from mmengine.registry import DefaultScope
    import softfree_mm  # noqa: F401  (compat repairs, registries)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(cfg)


def timm_vit():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                             qk_norm=True)


def timm_deit_distilled():
    from timm.models.deit import VisionTransformerDistilled
    return VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def timm_deit3_registers():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                             no_embed_class=True, init_values=0.1, reg_tokens=2)


def timm_swin():
    from timm.models.swin_transformer import SwinTransformer
    return SwinTransformer(img_size=64, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(1, 2),
                           num_classes=5)


def timm_pvt_v2():
    from timm.models.pvt_v2 import PyramidVisionTransformerV2
    return PyramidVisionTransformerV2(depths=(1, 1), embed_dims=(16, 32), num_heads=(1, 2), sr_ratios=(2, 1),
                                      mlp_ratios=(2, 2), num_classes=5)


def timm_xcit():
    from timm.models.xcit import Xcit
    return Xcit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, cls_attn_layers=1, num_classes=5)


def mmpretrain_vit():
    return _mm('mmpretrain', dict(type='VisionTransformer', img_size=32, patch_size=8, out_type='featmap',
                                  arch=dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)))


def mmpretrain_swin():
    return _mm('mmpretrain', dict(type='SwinTransformer', img_size=64, window_size=4, out_indices=(0, 1),
                                  drop_path_rate=0.0,
                                  arch=dict(embed_dims=16, depths=[2, 2], num_heads=[1, 2])))


def mmdet_swin():
    return _mm('mmdet', dict(type='SwinTransformer', embed_dims=16, depths=(2, 2), num_heads=(1, 2), window_size=4,
                             strides=(4, 2), out_indices=(0, 1), drop_path_rate=0.0))


def mmdet_pvt_v2():
    return _mm('mmdet', dict(type='PyramidVisionTransformerV2', embed_dims=8, num_layers=[1, 1, 1, 1],
                             num_heads=[1, 1, 2, 2], sr_ratios=[4, 2, 1, 1], mlp_ratios=[2, 2, 2, 2],
                             out_indices=(0, 1, 2, 3), drop_path_rate=0.0))


def mmdet_detr_decoder():
    import softfree_mm  # noqa: F401
    from mmdet.models.layers.transformer import DetrTransformerDecoder
    attn = dict(embed_dims=32, num_heads=4, attn_drop=0.0)
    return DetrTransformerDecoder(num_layers=2, layer_cfg=dict(self_attn_cfg=dict(attn), cross_attn_cfg=dict(attn),
                                                               ffn_cfg=dict(embed_dims=32, feedforward_channels=64)))


def image_inputs(size):
    def make(seed=0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(2, 3, *size, generator=g),)
    return make


def detr_inputs(seed=0):
    """query, key (memory), value, query_pos, key_pos, key_padding_mask (the second image padded)."""
    g = torch.Generator().manual_seed(seed)
    q, mem = torch.randn(2, 5, 32, generator=g), torch.randn(2, 12, 32, generator=g)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, 9:] = True
    return q, mem, mem, torch.randn(2, 5, 32, generator=g), torch.randn(2, 12, 32, generator=g), pad


# name -> (builder, inputs(seed) -> args)
MODELS: 'OrderedDict[str, Tuple[Callable, Callable]]' = OrderedDict([
    ('timm ViT', (timm_vit, image_inputs((32, 32)))),
    ('timm DeiT (distilled)', (timm_deit_distilled, image_inputs((32, 32)))),
    ('timm DeiT-3 + registers', (timm_deit3_registers, image_inputs((32, 32)))),
    ('timm Swin', (timm_swin, image_inputs((64, 64)))),
    ('timm PVTv2', (timm_pvt_v2, image_inputs((64, 72)))),
    ('timm XCiT', (timm_xcit, image_inputs((32, 40)))),
    ('mmpretrain ViT', (mmpretrain_vit, image_inputs((32, 40)))),
    ('mmpretrain Swin', (mmpretrain_swin, image_inputs((64, 72)))),
    ('mmdet Swin', (mmdet_swin, image_inputs((64, 72)))),
    ('mmdet PVTv2', (mmdet_pvt_v2, image_inputs((64, 72)))),
    ('mmdet DETR decoder', (mmdet_detr_decoder, detr_inputs)),
])


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.1) -> torch.nn.Module:
    """Random weights everywhere (norm weights around 1), so that comparisons see non-trivial numbers."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            is_norm = any(t in name for t in ('norm', 'ln')) and name.endswith('weight') and p.dim() == 1
            p.copy_(1 + noise if is_norm else noise)
    return model


def build(name: str, seed: int = 0) -> torch.nn.Module:
    model = randomize_(MODELS[name][0](), seed)
    model.eval()
    return model


def outputs(out) -> List[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def kernel_cfg(name: str):
    """The configuration the table uses for a kernel (its defaults; synthesizer mixes in the dot product)."""
    return dict(type=name, mix=True) if name == 'synthesizer' else name


SHORT = {'layout': 'unknown layout', 'build': 'build fails', 'ties_qk': 'ties keys to queries', 'grid': 'needs a grid',
         'prefix': 'class token', 'mask': 'needs masks', 'length': 'token count varies', 'probe': 'fails on the layout'}


def _short(code: str, why: str) -> str:
    if code == 'build' and 'head_dim=None' in why:
        return 'needs head_dim'
    return SHORT.get(code, code)


def check_kernel(name: str, kernel: str, model=None) -> Tuple[str, List[Tuple[str, str, str]]]:
    """('yes' | 'yes*' | refusal cell, refusals). Swaps a fresh model, runs forward + backward, checks that every
    parameter of every swapped module (kernel included) gets a finite gradient."""
    model = copy.deepcopy(model) if model is not None else build(name)
    try:
        swap_attention(model, kernel_cfg(kernel))
    except SwapError as e:
        return _refusal_cell(model, e.refusals), e.refusals
    model.train()
    args = MODELS[name][1](1)
    loss = sum(o.float().square().mean() for o in outputs(model(*args)))
    loss.backward()
    for rec_module in _swapped_modules(model):
        for pname, p in rec_module.named_parameters():
            if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all()):
                raise AssertionError(f'{name} / {kernel}: {rec_module._sf_path}.{pname} got no finite gradient')
    marked = any('prefix token' in n for r in swap_summary(model) for n in r['notes'])
    return ('yes*' if marked else 'yes'), []


def _swapped_modules(model):
    return [m for m in model.modules() if hasattr(type(m), '_sf_original_class')]


def _refusal_cell(model, refusals) -> str:
    from ..swap.discover import discover
    total = len(discover(model))
    why = ', '.join(dict.fromkeys(_short(c, w) for _, c, w in refusals))
    if len(refusals) < total:
        return f'{total - len(refusals)} of {total} layers ({why})'
    return f'no ({why})'


def support_matrix(models=None, kernels=None) -> Dict[str, Dict[str, str]]:
    kernels = kernels or list_attentions()
    table = {}
    for name in (models or MODELS):
        base = build(name)
        table[name] = {k: check_kernel(name, k, base)[0] for k in kernels}
    return table


def markdown(table: Dict[str, Dict[str, str]]) -> str:
    """Kernels as rows, models as columns."""
    models = list(table)
    kernels = list(table[models[0]])
    lines = ['| kernel | ' + ' | '.join(models) + ' |', '|---' * (len(models) + 1) + '|']
    for k in kernels:
        lines.append(f'| `{k}` | ' + ' | '.join(table[m][k] for m in models) + ' |')
    return '\n'.join(lines)


if __name__ == '__main__':  # python -m softfree_mm.analysis.swap_support
    import logging

    import softfree_mm  # noqa: F401
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    print(markdown(support_matrix()))
