"""SOFT's checkpoints: the official SOFT / SOFT-Norm releases -> our layout (``convert_soft``, pure), and how a
converted file shows its architecture (``SOFTArchSpec``: depths, widths, heads)."""
import re
from collections import OrderedDict
from typing import Dict

import torch

from ..converters.spec import ArchSpec, size_of, stage_info


_SOFT_BLOCK = (('att.mha.W_q.', 'attn.q.'), ('att.mha.W_v.', 'attn.v.'), ('att.mha.ff.', 'attn.proj.'),
               ('att.mha.attn.Qlandmark_op.', 'attn.kernel.landmark_conv.'),
               ('att.mha.attn.Qnorm_act.0.', 'attn.kernel.landmark_norm.'),
               ('att.mha.attn.conv.', 'attn.kernel.v_conv.'),
               ('att.norm1.', 'norm1.'), ('att.norm2.', 'norm2.'), ('att.ff1.', 'mlp.fc1.'), ('att.ff2.', 'mlp.fc2.'))


def convert_soft(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official SOFT / SOFT-Norm release (``patch_embed{s}``, ``pos_embed{s}``, ``block{s}.{j}.att.mha.*`` and
    ``block4.{j}.*``, ``cls_token``, ``norm``, ``head``) -> our layout. Pure and idempotent; ``head`` is dropped;
    any other key is kept unchanged so that loading reports it."""
    out = OrderedDict()
    for k, v in state_dict.items():
        if k.startswith('head.'):
            continue
        m = re.match(r'^patch_embed(\d)\.(.*)$', k)
        if m:
            out[f'stages.{int(m.group(1)) - 1}.patch_embed.{m.group(2)}'] = v
            continue
        m = re.match(r'^pos_embed(\d)$', k)
        if m:
            out[f'stages.{int(m.group(1)) - 1}.pos_embed'] = v
            continue
        m = re.match(r'^block(\d)\.(\d+)\.(.*)$', k)
        if m:
            s, j, rest = int(m.group(1)) - 1, m.group(2), m.group(3)
            for old, new in _SOFT_BLOCK:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out[f'stages.{s}.blocks.{j}.{rest}'] = v
            continue
        out[k] = v
    return out


class SOFTArchSpec(ArchSpec):
    cls_name = 'SoftFreeSOFT'
    fills_heads = True

    def signature(self, i, p):
        return ('attn.v.weight' if i < 3 else 'attn.kv.weight') in p

    @staticmethod
    def _heads(p):
        conv = p.get('attn.kernel.v_conv.weight')
        if conv is not None:
            return size_of(conv)
        lm, dim = p.get('attn.kernel.landmark_conv.weight'), size_of(p.get('norm1.weight'))
        return None if lm is None or not dim else dim // int(lm.shape[0])

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [stage_info(by.get(i, {}), self._heads) for i in range(max(by) + 1)]
        for s in stages:
            s['mlp'] = None  # fixed at 4 in stages 1-3; stage 4's is not a preset setting
        return dict(stages=stages)

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=c, heads=h) for d, c, h in
                            zip(p['depths'], p['embed_dims'], p['num_heads'])])

    def overrides(self, info, base, base_info, heads):
        same = all(s[f] == b[f] for s, b in zip(info['stages'], base_info['stages']) for f in ('depth', 'dim'))
        same = same and len(info['stages']) == len(base_info['stages'])
        if same and list(heads) == [b['heads'] for b in base_info['stages']]:
            return OrderedDict()
        arch = dict(embed_dims=tuple(s['dim'] for s in info['stages']),
                    depths=tuple(s['depth'] for s in info['stages']),
                    num_heads=tuple(heads))
        if self.zoo[base].get('normalized'):
            arch['normalized'] = True
        return OrderedDict(arch=arch)

    def twin_note(self, base, twins):
        return 'add normalized=True for a SOFT-Norm file (the file does not show which)'
