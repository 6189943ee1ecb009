"""The reference implementations our backbones are measured against: mmdet's Swin and PVTv2 and timm's XCiT with
our weights (``compare``), and mmdet's own backbones in the same detector (``detector``)."""
from typing import Dict

import torch

from .backbones import build_backbone


def _randomize_norms(model) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name or name.endswith(('ln.weight', 'ln.bias')):
                p.normal_(1.0 if name.endswith('weight') else 0.0, 0.1)


REFERENCES = {'swin_t': "mmdet's SwinTransformer (Swin-T)", 'pvt_v2_b2': "mmdet's PyramidVisionTransformerV2 (b2)",
              'xcit_s12': "timm's xcit_small_12_p16_224 features (blocks 3, 5, 7, 11) through the same "
                          "stride-fixing adapter as ours (official form: nn.ConvTranspose2d layers)"}
# a size where each reference computes exactly our function (mmdet's Swin attends to pad tokens and shifts a stage
# that is one window: at 448 every stage grid is a window multiple larger than a window)
PARITY_SIZE = (448, 448)


def reference_pair(name: str):
    """(ours, reference) with the same weights, both softmax, both returning the four stride 4-32 maps:
    swin_t vs mmdet's SwinTransformer, pvt_v2_b2 vs mmdet's PyramidVisionTransformerV2, xcit_s12 vs timm's
    xcit_small_12_p16_224 features (blocks 3, 5, 7, 11) put through a copy of our stride-fixing adapter in the
    official form, with ``nn.ConvTranspose2d`` layers (the work a detector on timm's XCiT needs too; timm has
    none)."""
    import copy

    import softfree_mm  # noqa: F401
    from ...models.backbones.pvt import convert_pvt_v2
    from ...models.backbones.swin import convert_swin
    from ...models.backbones.xcit import convert_xcit

    if name not in REFERENCES:
        raise ValueError(f"compare: unknown pair {name!r}; valid: {', '.join(REFERENCES)}")
    torch.manual_seed(0)
    if name == 'swin_t':
        from mmdet.models.backbones.swin import SwinTransformer

        ref = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), drop_path_rate=0.0)
        _randomize_norms(ref)
        ours, _ = build_backbone('swin_t')
        ours.load_state_dict(convert_swin(ref.state_dict()), strict=True)
        return ours, ref
    if name == 'pvt_v2_b2':
        from mmdet.models.backbones.pvt import PyramidVisionTransformerV2

        ref = PyramidVisionTransformerV2(embed_dims=64, num_layers=[3, 4, 6, 3], drop_path_rate=0.0)
        _randomize_norms(ref)
        ours, _ = build_backbone('pvt_v2_b2')
        ours.load_state_dict(convert_pvt_v2(mmdet_pvt_to_official(ref.state_dict())), strict=True)
        return ours, ref
    import timm

    timm_model = timm.create_model('xcit_small_12_p16_224', pretrained=False, drop_path_rate=0.0)
    _randomize_norms(timm_model)
    ours, _ = build_backbone('xcit_s12')
    missing, _ = ours.load_state_dict(convert_xcit(timm_model.state_dict()), strict=False)
    if not all(k.startswith('fpn') for k in missing):
        raise RuntimeError(f'compare: XCiT weights did not all convert: {missing}')
    adapter = copy.deepcopy([ours.fpn1, ours.fpn2, ours.fpn3, ours.fpn4])
    return ours, _TimmXCiTFeatures(timm_model, [official_deconvs(m) for m in adapter])


def official_deconvs(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every subclass of ``nn.ConvTranspose2d`` in it (our ``BlockDeconv``) replaced by a plain
    ``nn.ConvTranspose2d`` holding the same weights: the official adapter's layers."""
    base = torch.nn.ConvTranspose2d

    def plain(m):
        new = base(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride, padding=m.padding,
                   output_padding=m.output_padding, groups=m.groups, bias=m.bias is not None, dilation=m.dilation,
                   padding_mode=m.padding_mode)
        new.load_state_dict(m.state_dict())
        return new.to(m.weight.device, m.weight.dtype)

    if isinstance(module, base) and type(module) is not base:
        return plain(module)
    for name, child in module.named_children():
        setattr(module, name, official_deconvs(child))
    return module


class _TimmXCiTFeatures(torch.nn.Module):
    def __init__(self, model, adapter):
        super().__init__()
        self.model = model
        self.adapter = torch.nn.ModuleList(adapter)

    def forward(self, x):
        feats = self.model.forward_intermediates(x, indices=[3, 5, 7, 11], intermediates_only=True)
        return tuple(op(f) for op, f in zip(self.adapter, feats))


def mmdet_pvt_to_official(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """mmdet's PyramidVisionTransformerV2 names -> the official release names (which our converter reads);
    the inverse of mmdet's own ``pvt_convert``."""
    import re

    out = {}
    for k, v in sd.items():
        m = re.match(r'layers\.(\d+)\.(\d+)\.(.*)', k)
        if not m:
            raise KeyError(f'mmdet_pvt_to_official: unexpected key {k}')
        s, part, rest = int(m.group(1)) + 1, int(m.group(2)), m.group(3)
        if part == 0:  # patch embedding
            rest = rest.replace('projection.', 'proj.')
            out[f'patch_embed{s}.{rest}'] = v
        elif part == 2:  # stage norm
            out[f'norm{s}.{rest}'] = v
        else:  # blocks
            b, tail = rest.split('.', 1)
            tail = (tail.replace('attn.attn.in_proj_weight', 'attn.in_proj_weight')
                    .replace('attn.attn.in_proj_bias', 'attn.in_proj_bias')
                    .replace('attn.attn.out_proj.', 'attn.proj.')
                    .replace('ffn.layers.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.dwconv.dwconv.')
                    .replace('ffn.layers.4.', 'mlp.fc2.'))
            if tail.startswith('attn.in_proj_'):
                kind = tail.rsplit('_', 1)[-1]
                q, kv = v[:v.shape[0] // 3], v[v.shape[0] // 3:]
                out[f'block{s}.{b}.attn.q.{kind}'] = q
                out[f'block{s}.{b}.attn.kv.{kind}'] = kv
                continue
            if tail.startswith(('mlp.fc1.', 'mlp.fc2.')) and v.dim() == 4:
                v = v.flatten(1)  # mmdet's 1x1 convs -> the official linear layers
            out[f'block{s}.{b}.{tail}'] = v
    return out



# Mask R-CNN + FPN as configs/maskrcnn_*.py build it; 'mmdet' is the same detector (neck, heads, recipe) with
# mmdet's own backbone in place of ours, so the ratios compare backbones only. mmdet's Swin-T is its config's
# (mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py) backbone; its PVTv2-b2 is PyramidVisionTransformerV2 with b2's layers.
MMDET_BACKBONES = {
    'swin_t': dict(type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                   window_size=7, mlp_ratio=4, qkv_bias=True, qk_scale=None, drop_rate=0.0, attn_drop_rate=0.0,
                   drop_path_rate=0.2, patch_norm=True, out_indices=(0, 1, 2, 3), with_cp=False,
                   convert_weights=True, init_cfg=None),
    'pvt_v2_b2': dict(type='mmdet.PyramidVisionTransformerV2', embed_dims=64, num_layers=[3, 4, 6, 3],
                      drop_path_rate=0.1, init_cfg=None),
}
