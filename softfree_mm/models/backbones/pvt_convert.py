"""PVT v1 / v2 checkpoints: the official and timm releases (and the official InLine-PVT ones) -> our layout
(``convert_pvt``, ``convert_pvt_v2``, pure), and how a converted file shows its architecture (``PVTArchSpec``,
``PVTv2ArchSpec``: depths, widths, heads, MLP ratios, spatial reduction, position tables)."""
import math
import re
from collections import OrderedDict
from typing import Dict, Optional

import torch

from ..converters.spec import ArchSpec, _kernel_heads, _inline_kinds, _num, _preset_kinds, size_of, stage_info


_OURS = re.compile(r'^stages\.\d+\.')


def _official_stage_key(k: str) -> Optional[str]:
    """Official v1/v2 names (patch_embed{s}, block{s}.{j}, norm{s}, pos_embed{s}) -> ours; None if not one."""
    m = re.match(r'^patch_embed(\d+)\.(.*)$', k)
    if m:
        return f'stages.{int(m.group(1)) - 1}.patch_embed.{m.group(2)}'
    m = re.match(r'^block(\d+)\.(\d+)\.(.*)$', k)
    if m:
        rest = m.group(3).replace('mlp.dwconv.dwconv.', 'mlp.dwconv.')
        rest = rest.replace('attn.residual.', 'attn.kernel.residual.')  # official InLine-PVT
        rest = re.sub(r'^attn\.((?:an|na|ah|aw|ha|wa)_bias$|dwc\.)', r'attn.kernel.\1', rest)  # official Agent-PVT
        return f'stages.{int(m.group(1)) - 1}.blocks.{m.group(2)}.{rest}'
    m = re.match(r'^norm(\d+)\.(.*)$', k)
    if m:
        return f'stages.{int(m.group(1)) - 1}.norm.{m.group(2)}'
    m = re.match(r'^pos_embed(\d+)$', k)
    if m:
        return f'stages.{int(m.group(1)) - 1}.pos_embed'
    return None


def convert_pvt(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official PVT v1 release (and the official InLine-PVT releases: ``attn.residual.*``, the Agent-PVT releases:
    ``attn.{an,na,ah,aw,ha,wa}_bias``, ``attn.dwc.*`` -> the kernel's) -> our layout. Pure and idempotent (our layout
    passes through).

    Dropped: the classifier (``head``), ``cls_token`` and the final ``norm`` (classification only; our v1 has no
    output norm), and the class-token row of the last stage's positional table (N = s*s + 1 -> s*s).
    """
    out = OrderedDict()
    for k, v in state_dict.items():
        if _OURS.match(k):
            out[k] = v
            continue
        if k.startswith(('head.', 'cls_token', 'norm.')):
            continue
        new = _official_stage_key(k)
        if new is None:
            out[k] = v  # unknown: left for load_pretrained to report
            continue
        if new.endswith('pos_embed'):
            n = v.shape[1]
            side = math.isqrt(n - 1)
            if side * side == n - 1 and math.isqrt(n) ** 2 != n:
                v = v[:, 1:]
        out[new] = v
    return out


def convert_pvt_v2(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official PVTv2 release or timm ``pvt_v2_*`` -> our layout. Pure and idempotent; ``head`` is dropped."""
    out = OrderedDict()
    for k, v in state_dict.items():
        if k.startswith('head.'):
            continue
        if _OURS.match(k):  # ours, or timm's stages.{i}.{blocks,norm,downsample}
            k = re.sub(r'^stages\.(\d+)\.downsample\.', r'stages.\1.patch_embed.', k)
            out[k.replace('mlp.dwconv.dwconv.', 'mlp.dwconv.')] = v
            continue
        if k.startswith('patch_embed.'):  # timm's stem
            out['stages.0.' + k] = v
            continue
        new = _official_stage_key(k)
        out[new if new is not None else k] = v
    return out


class PVTArchSpec(ArchSpec):
    cls_name = 'SoftFreePVT'
    preset_fields = ('depth', 'dim', 'heads', 'mlp', 'sr')
    arg_defaults = {'positions': ('pretrain_img_size', 224)}

    def signature(self, i, p):
        return 'attn.q.weight' in p and 'attn.kv.weight' in p and 'mlp.dwconv.weight' not in p

    @staticmethod
    def _sr(p):
        t = p.get('attn.sr.weight')
        return dict(sr=1 if t is None else int(t.shape[-1]))

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [stage_info(by.get(i, {}), lambda p: _kernel_heads(p, 'attn.kernel.'),
                              self._sr) for i in range(max(by) + 1)]
        pos = sd.get('stages.0.pos_embed')
        return dict(stages=stages, positions=size_of(pos, 1), linear=None,
                    kinds=_inline_kinds(by, len(stages), 'attn.kernel.residual.0.weight'))

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=c, heads=h, mlp=float(m), sr=r) for d, c, h, m, r in
                            zip(p['depths'], p['embed_dims'], p['num_heads'], p['mlp_ratios'], p['sr_ratios'])],
                    linear=bool(p.get('linear', False)), kinds=_preset_kinds(p))

    def overrides(self, info, base, base_info, heads):
        kw = OrderedDict()
        for field, arg in (('dim', 'embed_dims'), ('depth', 'depths'), ('mlp', 'mlp_ratios'), ('sr', 'sr_ratios')):
            vals = [s[field] for s in info['stages']]
            if field == 'sr' and info.get('linear'):
                continue
            if None not in vals and vals != [s[field] for s in base_info['stages']]:
                kw[arg] = tuple(_num(v) for v in vals)
        if heads is not None and list(heads) != [s['heads'] for s in base_info['stages']]:
            kw['num_heads'] = tuple(heads)
        if info.get('linear') is not None and info['linear'] != base_info.get('linear', False):
            kw['linear'] = info['linear']
        return kw


class PVTv2ArchSpec(PVTArchSpec):
    cls_name = 'SoftFreePVTv2'
    global_preset_fields = ('linear',)
    arg_defaults = {}

    def signature(self, i, p):
        return 'attn.q.weight' in p and 'attn.kv.weight' in p and 'mlp.dwconv.weight' in p

    @staticmethod
    def _sr(p):
        t = p.get('attn.sr.weight')
        if t is not None and int(t.shape[-1]) == 1:  # linear SRA: a 1x1 conv after a 7x7 pool
            return dict(sr=None, linear=True)
        return dict(sr=1 if t is None else int(t.shape[-1]), linear=False)

    def info(self, sd):
        info = super().info(sd)
        if info is not None:
            flags = {s.pop('linear', None) for s in info['stages']} - {None}
            info['linear'] = flags.pop() if len(flags) == 1 else None
            info['positions'] = None
            if info['linear']:
                for s in info['stages']:
                    s['sr'] = None
        return info

    def model_info(self, module):
        info = super().model_info(module)
        if info is not None:
            info['linear'] = bool(module.linear)
        return info
