"""XCiT's checkpoints: the official / timm releases -> our layout (``convert_xcit``, pure), and how a converted file
shows its architecture (``XCiTArchSpec``: depth, width, heads, patch size)."""
import re
from collections import OrderedDict
from typing import Dict

import torch

from ..converters.spec import ArchSpec, size_of, stage_info


def convert_xcit(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official XCiT release (``pos_embeder``, fused class-attention ``qkv``) or timm ``Xcit`` -> our layout.

    Pure and idempotent: our layout (= timm's) passes through unchanged. The classifier ``head`` is dropped.
    Official detection checkpoints (``backbone.`` prefix is removed by ``unwrap_state_dict``) keep their
    ``fpn1``..``fpn4`` keys, which match ours.
    """
    out = OrderedDict()
    for k, v in state_dict.items():
        if k.startswith('head.') or k.startswith('head_drop'):
            continue
        if k.startswith('pos_embeder.'):
            k = 'pos_embed.' + k[len('pos_embeder.'):]
        if k.startswith('cls_attn_blocks.') and '.attn.qkv.' in k:
            prefix, suffix = k.split('.attn.qkv.')
            parts = v.reshape(3, -1, *v.shape[1:]) if v.dim() > 1 else v.reshape(3, -1)
            for j, name in enumerate('qkv'):
                out[f'{prefix}.attn.{name}.{suffix}'] = parts[j].clone()
            continue
        out[k] = v
    return out


class XCiTArchSpec(ArchSpec):
    cls_name = 'SoftFreeXCiT'
    staged = False
    arg_defaults = {'patch': ('patch_size', 16), 'mlp': ('mlp_ratio', 4.0)}
    key_pattern = re.compile(r'^()blocks\.(\d+)\.(.*)$')

    def signature(self, i, p):
        return 'attn.temperature' in p

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stage = stage_info(by[0], lambda p: size_of(p.get('attn.temperature')))
        convs = sum(1 for k in sd if re.match(r'^patch_embed\.proj\.\d+\.0\.weight$', k))
        return dict(stages=[stage], patch={4: 16, 3: 8}.get(convs), mlp=stage['mlp'])

    def preset_info(self, p):
        return dict(stages=[dict(depth=p['depth'], dim=p['embed_dims'], heads=p['num_heads'])])

    def overrides(self, info, base, base_info, heads):
        kw = OrderedDict()
        st, bs = info['stages'][0], base_info['stages'][0]
        for field, arg in (('dim', 'embed_dims'), ('depth', 'depth')):
            if st[field] is not None and st[field] != bs[field]:
                kw[arg] = st[field]
        if heads is not None and heads[0] != bs['heads']:
            kw['num_heads'] = heads[0]
        return kw
