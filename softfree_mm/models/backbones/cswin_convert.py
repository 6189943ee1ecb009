"""CSWin's checkpoints: the official classification and segmentation releases (and InLine-CSWin's) -> our layout
(``convert_cswin``, pure), and how a converted file shows its architecture (``CSWinArchSpec``)."""
from typing import Dict

import torch

from ..converters.spec import ArchSpec, _kernel_heads, _inline_kinds, _preset_kinds, stage_info
from .swin_convert import SwinArchSpec


_AGENT_BIASES = ('an_bias', 'na_bias', 'ah_bias', 'aw_bias', 'ha_bias', 'wa_bias')


def convert_cswin(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official CSWin layouts -> ours (pure function).

    Official names: ``stage1_conv_embed.{0,2}`` (conv, LayerNorm), ``stage{s}.{j}.{qkv,norm1,proj,norm2,
    mlp.fc1,mlp.fc2,attns.{b}.get_v}`` (official InLine-CSwin adds ``attns.{b}.residual.{0,2}``, Agent-CSWin
    ``attns.{b}.{an,na,ah,aw,ha,wa}_bias``: its get_v is the LePE conv, our ``lepe``),
    ``merge{m}.{conv,norm}`` (after stage m), and either the classifier's
    final ``norm`` + ``head`` or the segmentation backbone's per-output ``norm1..norm4``. The head is dropped;
    any other key is kept unchanged so that loading reports it.
    """
    keys = list(state_dict)
    if not any(k.startswith(('stage1', 'merge1')) for k in keys):
        return dict(state_dict)  # already ours
    stage_ids = {int(k.split('.')[0][len('stage'):]) for k in keys
                 if k.startswith('stage') and k.split('.')[0][len('stage'):].isdigit()}
    num_stages = max(stage_ids) if stage_ids else 4
    per_output_norms = any(k.startswith(f'norm{num_stages}.') for k in keys)  # segmentation release
    out = {}
    for k, v in state_dict.items():
        if k.startswith('head.'):
            continue
        p = k.split('.')
        nk = k
        if p[0] == 'stage1_conv_embed':
            if p[1] in ('0', '2'):
                nk = ('patch_embed.proj.' if p[1] == '0' else 'patch_embed.norm.') + '.'.join(p[2:])
        elif p[0].startswith('stage') and p[0][len('stage'):].isdigit():
            s = int(p[0][len('stage'):]) - 1
            rest = '.'.join(p[2:])
            if rest.startswith('attns.') and p[4] == 'get_v':
                rest = f'branches.{p[3]}.lepe.' + '.'.join(p[5:])
            elif rest.startswith('attns.') and p[4] == 'residual':  # official InLine-CSwin
                rest = f'branches.{p[3]}.kernel.residual.' + '.'.join(p[5:])
            elif rest.startswith('attns.') and p[4] in _AGENT_BIASES:  # official Agent-CSWin
                rest = f'branches.{p[3]}.kernel.{p[4]}'
            nk = f'stages.{s}.blocks.{p[1]}.{rest}'
        elif p[0].startswith('merge') and p[0][len('merge'):].isdigit():
            nk = f'stages.{int(p[0][len("merge"):])}.downsample.' + '.'.join(p[1:])
        elif p[0] == 'norm':
            nk = f'norm{num_stages - 1}.' + '.'.join(p[1:])
        elif per_output_norms and p[0].startswith('norm') and p[0][len('norm'):].isdigit():
            nk = f'norm{int(p[0][len("norm"):]) - 1}.' + '.'.join(p[1:])
        out[nk] = v
    return out


class CSWinArchSpec(ArchSpec):
    cls_name = 'SoftFreeCSWin'
    arg_defaults = {'mlp': ('mlp_ratio', 4.0)}

    def signature(self, i, p):
        return 'qkv.weight' in p and any(k.startswith('branches.') for k in p)

    @staticmethod
    def _heads(p):
        branches = {k.split('.')[1] for k in p if k.startswith('branches.')}
        r = _kernel_heads(p, 'branches.0.kernel.')
        return None if r is None else r * len(branches)

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [stage_info(by.get(i, {}), self._heads) for i in range(max(by) + 1)]
        mlps = {s['mlp'] for s in stages if s['mlp'] is not None}
        return dict(stages=stages, mlp=mlps.pop() if len(mlps) == 1 else None,
                    kinds=_inline_kinds(by, len(stages), 'branches.0.kernel.residual.0.weight'))

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=p['embed_dims'] * 2 ** i, heads=h) for i, (d, h) in
                            enumerate(zip(p['depths'], p['num_heads']))], kinds=_preset_kinds(p))

    overrides = SwinArchSpec.overrides  # the same arguments: embed_dims (stage 0), depths, num_heads
