"""The architecture specs of the six backbone classes: which tensors show their depths, widths, heads and other
settings, their presets read the same way, and the arguments that build another architecture."""
import math
import re
from collections import OrderedDict

from .spec import (_ArchSpec, _heads_from_residual, _inline_kinds, _kind, _num, _preset_kinds, _seq, _shape,
                   _stage_info)

class _SwinSpec(_ArchSpec):
    cls_name = 'SoftFreeSwin'
    arg_defaults = {'window': ('window_size', 7), 'mlp': ('mlp_ratio', 4.0)}

    def signature(self, i, p):
        return 'attn.qkv.weight' in p

    @staticmethod
    def _block_kind(p):
        if 'attn.kernel.residual.0.weight' in p:
            return 'inline'
        return 'softmax' if 'attn.relative_position_bias_table' in p else None

    @staticmethod
    def _heads(p):
        """From the relative position bias table ((2W-1)^2, heads) or InLine's residual."""
        t = p.get('attn.relative_position_bias_table')
        return _heads_from_residual(p.get('attn.kernel.residual.0.weight')) if t is None else _shape(t, 1)

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages, kinds, windows = [], [], set()
        for i in range(max(by) + 1):
            blocks = by.get(i, {})
            stages.append(_stage_info(blocks, self._heads))
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
        kinds = tuple(tuple('inline' if _kind(c) == 'inline' else 'softmax' if _kind(c) == 'softmax' and not g
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
                    g = [k == 'inline' for k in ks]
                    glob.append(g[0] if len(set(g)) == 1 else tuple(g))
                kw['attn_cfg'], kw['global_window'] = tuple(cfg), tuple(glob)
        if heads is not None and list(heads) != [s['heads'] for s in base_info['stages']]:
            kw['num_heads'] = tuple(heads)
        return kw


def _flat_entries(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


class _CSWinSpec(_ArchSpec):
    cls_name = 'SoftFreeCSWin'
    arg_defaults = {'mlp': ('mlp_ratio', 4.0)}

    def signature(self, i, p):
        return 'qkv.weight' in p and any(k.startswith('branches.') for k in p)

    @staticmethod
    def _heads(p):
        branches = {k.split('.')[1] for k in p if k.startswith('branches.')}
        r = _heads_from_residual(p.get('branches.0.kernel.residual.0.weight'))
        return None if r is None else r * len(branches)

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [_stage_info(by.get(i, {}), self._heads) for i in range(max(by) + 1)]
        mlps = {s['mlp'] for s in stages if s['mlp'] is not None}
        return dict(stages=stages, mlp=mlps.pop() if len(mlps) == 1 else None,
                    kinds=_inline_kinds(by, len(stages), 'branches.0.kernel.residual.0.weight'))

    def preset_info(self, p):
        return dict(stages=[dict(depth=d, dim=p['embed_dims'] * 2 ** i, heads=h) for i, (d, h) in
                            enumerate(zip(p['depths'], p['num_heads']))], kinds=_preset_kinds(p))

    overrides = _SwinSpec.overrides  # the same arguments: embed_dims (stage 0), depths, num_heads


class _PVTSpec(_ArchSpec):
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
        stages = [_stage_info(by.get(i, {}), lambda p: _heads_from_residual(p.get('attn.kernel.residual.0.weight')),
                              self._sr) for i in range(max(by) + 1)]
        pos = sd.get('stages.0.pos_embed')
        return dict(stages=stages, positions=_shape(pos, 1), linear=None,
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


class _PVTv2Spec(_PVTSpec):
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


class _XCiTSpec(_ArchSpec):
    cls_name = 'SoftFreeXCiT'
    staged = False
    arg_defaults = {'patch': ('patch_size', 16), 'mlp': ('mlp_ratio', 4.0)}
    _KEY = re.compile(r'^()blocks\.(\d+)\.(.*)$')

    def signature(self, i, p):
        return 'attn.temperature' in p

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stage = _stage_info(by[0], lambda p: _shape(p.get('attn.temperature')))
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


class _SOFTSpec(_ArchSpec):
    cls_name = 'SoftFreeSOFT'
    fills_heads = True

    def signature(self, i, p):
        return ('attn.v.weight' if i < 3 else 'attn.kv.weight') in p

    @staticmethod
    def _heads(p):
        conv = p.get('attn.kernel.v_conv.weight')
        if conv is not None:
            return _shape(conv)
        lm, dim = p.get('attn.kernel.landmark_conv.weight'), _shape(p.get('norm1.weight'))
        return None if lm is None or not dim else dim // int(lm.shape[0])

    def info(self, sd):
        by = self.blocks(sd)
        if by is None:
            return None
        stages = [_stage_info(by.get(i, {}), self._heads) for i in range(max(by) + 1)]
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


_SPECS = {s.cls_name: s for s in (_SwinSpec(), _CSWinSpec(), _PVTSpec(), _PVTv2Spec(), _XCiTSpec(), _SOFTSpec())}

