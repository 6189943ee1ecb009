"""Swin's checkpoints: the official (and InLine-Swin), timm and mmdet releases -> our layout (``convert_swin``, pure),
and how a converted file shows its architecture (``SwinArchSpec``: depths, width, heads, window, block kinds)."""
import math
import re
from collections import OrderedDict
from typing import Dict

import torch

from ..converters.spec import ArchSpec, _kernel_heads, _kind, _seq, size_of, stage_info


_BLOCK_KEYS = ('norm1.', 'norm2.', 'attn.qkv.', 'attn.proj.', 'attn.relative_position_bias_table', 'mlp.fc1.',
               'mlp.fc2.')
# the official Agent-Swin releases' kernel tensors (classification and detection / segmentation backbones alike)
_AGENT = re.compile(r'\.attn\.((?:an|na|ah|aw|ha|wa)_bias$|dwc\.)')
_MMDET_BLOCK = {'attn.w_msa.qkv.': 'attn.qkv.', 'attn.w_msa.proj.': 'attn.proj.',
                'attn.w_msa.relative_position_bias_table': 'attn.relative_position_bias_table',
                'ffn.layers.0.0.': 'mlp.fc1.', 'ffn.layers.1.': 'mlp.fc2.', 'norm1.': 'norm1.', 'norm2.': 'norm2.'}


def _unfold_to_official(t: torch.Tensor) -> torch.Tensor:
    """mmdet's nn.Unfold patch merging orders the 4C inputs channel-major (c, kh, kw); the official order is
    part-major with parts (0,0), (1,0), (0,1), (1,1)."""
    if t.dim() == 1:
        c = t.shape[0] // 4
        return t.view(c, 4)[:, [0, 2, 1, 3]].t().reshape(4 * c)
    out, c = t.shape[0], t.shape[1] // 4
    return t.view(out, c, 4)[:, :, [0, 2, 1, 3]].transpose(1, 2).reshape(out, 4 * c)


def convert_swin(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official Swin release / timm / mmdet Swin layouts -> ours (pure function).

    * official: ``layers.{i}.blocks.{j}.*``, ``layers.{i}.downsample.*`` after stage i, final ``norm``, ``head``;
      the official InLine-Swin releases add ``attn.residual.{0,2}`` (the kernel's ``attn.kernel.residual``), the
      Agent-Swin releases ``attn.{an,na,ah,aw,ha,wa}_bias`` and ``attn.dwc`` (the kernel's); their detection /
      segmentation backbones (mmdet 2.x / mmseg 0.x) name their per-output norms ``norm{i}`` as we do.
    * timm: the same names, but ``layers.{i}.downsample`` *before* stage i, ``head.fc``.
    * mmdet: ``stages.{i}.blocks.{j}.attn.w_msa.*``, ``ffn.layers.*``, ``patch_embed.projection``,
      ``stages.{i}.downsample`` after stage i with nn.Unfold channel order, ``norm{i}``.
    Classifier heads, ``relative_position_index`` and ``attn_mask`` buffers are dropped; any other key is kept
    unchanged so that loading reports it.
    """
    keys = list(state_dict)
    is_mmdet = any('.w_msa.' in k or '.ffn.layers.' in k or k.startswith('patch_embed.projection') for k in keys)
    is_layers = any(k.startswith('layers.') for k in keys)
    if not is_mmdet and not is_layers:
        return dict(state_dict)  # already ours
    official = is_layers and any(k.startswith('layers.0.downsample.') for k in keys)
    stage_ids = {int(k.split('.')[1]) for k in keys if k.startswith(('layers.', 'stages.'))}
    last = max(stage_ids) if stage_ids else 3
    out = {}
    for k, v in state_dict.items():
        if k.endswith(('relative_position_index', 'attn_mask')) or k.startswith('head.'):
            continue
        nk = k
        if is_mmdet:
            if k.startswith('patch_embed.projection.'):
                nk = 'patch_embed.proj.' + k[len('patch_embed.projection.'):]
            elif k.startswith('stages.'):
                p = k.split('.')
                if p[2] == 'downsample':
                    nk = f'stages.{int(p[1]) + 1}.downsample.' + '.'.join(p[3:])
                    v = _unfold_to_official(v)
                elif p[2] == 'blocks':
                    rest = '.'.join(p[4:])
                    for old, new in _MMDET_BLOCK.items():
                        if rest.startswith(old):
                            nk = f'stages.{p[1]}.blocks.{p[3]}.' + new + rest[len(old):]
                            break
        else:
            if k.startswith('layers.'):
                p = k.split('.')
                i = int(p[1])
                if p[2] == 'downsample':
                    nk = f'stages.{i + 1 if official else i}.downsample.' + '.'.join(p[3:])
                else:
                    nk = _AGENT.sub(r'.attn.kernel.\1', 'stages.' + '.'.join(p[1:]).replace(
                        '.attn.residual.', '.attn.kernel.residual.'))
            elif k.startswith('norm.'):
                nk = f'norm{last}.' + k[len('norm.'):]
        out[nk] = v
    return out


class SwinArchSpec(ArchSpec):
    cls_name = 'SoftFreeSwin'
    arg_defaults = {'window': ('window_size', 7), 'mlp': ('mlp_ratio', 4.0)}

    def signature(self, i, p):
        return 'attn.qkv.weight' in p

    @staticmethod
    def _block_kind(p):
        if 'attn.kernel.residual.0.weight' in p:
            return 'inline'
        if 'attn.kernel.an_bias' in p:
            return 'agent'
        return 'softmax' if 'attn.relative_position_bias_table' in p else None

    @staticmethod
    def _heads(p):
        """From the relative position bias table ((2W-1)^2, heads), InLine's residual or the agent biases."""
        t = p.get('attn.relative_position_bias_table')
        return _kernel_heads(p, 'attn.kernel.') if t is None else size_of(t, 1)

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages, kinds, windows = [], [], set()
        for i in range(max(by) + 1):
            blocks = by.get(i, {})
            stages.append(stage_info(blocks, self._heads))
            kinds.append(tuple(self._block_kind(blocks.get(j, {})) for j in range(stages[-1]['depth'])))
            for p in blocks.values():
                t = p.get('attn.relative_position_bias_table')
                if t is not None:
                    windows.add((math.isqrt(int(t.shape[0])) + 1) // 2)
        mlps = {s['mlp'] for s in stages if s['mlp'] is not None}
        return dict(stages=stages, kinds=tuple(kinds), window=windows.pop() if len(windows) == 1 else None,
                    mlp=mlps.pop() if len(mlps) == 1 else None)

    def preset_info(self, p):
        depths, e = p['depths'], p['embed_dims']
        cfgs, glob = _seq(p.get('attn_cfg', 'softmax'), depths), _seq(p.get('global_window', False), depths)
        kinds = tuple(tuple(_kind(c) if _kind(c) in ('inline', 'agent')
                            else 'softmax' if _kind(c) == 'softmax' and not g
                            else None for c, g in zip(cs, gs)) for cs, gs in zip(cfgs, glob))
        return dict(stages=[dict(depth=d, dim=e * 2 ** i, heads=h) for i, (d, h) in
                            enumerate(zip(depths, p['num_heads']))], kinds=kinds)

    def overrides(self, info, base, base_info, heads):
        kw = OrderedDict()
        dims = [s['dim'] for s in info['stages']]
        depths = tuple(s['depth'] for s in info['stages'])
        if dims != [s['dim'] for s in base_info['stages']] and dims[0] is not None:
            kw['embed_dims'] = dims[0]
        if depths != tuple(s['depth'] for s in base_info['stages']):
            kw['depths'] = depths
            preset = self.zoo[base]
            if any(isinstance(v, (list, tuple)) for v in _flat_entries(preset.get('attn_cfg'))):
                # the preset sets its kernels block by block: give them for the file's blocks
                cfg, glob = [], []
                for i, ks in enumerate(info['kinds']):
                    first = _seq(preset['attn_cfg'], preset['depths'])[i][0] if i < len(preset['depths']) else 'softmax'
                    ks = [k or _kind(first) for k in ks]
                    cfg.append(ks[0] if len(set(ks)) == 1 else tuple(ks))
                    g = [k in ('inline', 'agent') for k in ks]
                    glob.append(g[0] if len(set(g)) == 1 else tuple(g))
                kw['attn_cfg'], kw['global_window'] = tuple(cfg), tuple(glob)
        if heads is not None and list(heads) != [s['heads'] for s in base_info['stages']]:
            kw['num_heads'] = tuple(heads)
        return kw


def _flat_entries(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]
