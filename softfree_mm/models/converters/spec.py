"""How a backbone's architecture shows in a converted state dict: the reading helpers and :class:`ArchSpec`, the base
of the spec each family declares (``Family(arch_spec=...)``, beside its conversion function)."""
import re
from collections import OrderedDict
from typing import Dict, Optional

import torch

from ..family import FAMILIES

# Read from a converted state dict (our layout): per stage the number of blocks, the width, the heads where a
# tensor shows them (relative position bias tables, InLine's residual convs, SOFT's landmark convs, XCiT's
# temperatures), the MLP ratio, PVT's spatial reduction; and what else sizes a tensor (Swin's window, PVT v1's
# position table, XCiT's patch size). A model is described the same way from its own state dict (heads from its
# attributes), so that a file of another architecture is one error naming both and the arguments that fit the file.


def size_of(t, dim=0):
    """The size of dimension ``dim`` of a tensor the file may lack (None then)."""
    return None if t is None else int(t.shape[dim])


def _by_block(sd, pattern) -> Dict[int, Dict[int, Dict[str, torch.Tensor]]]:
    """stage -> block -> {rest of the key: tensor} for the keys ``pattern`` matches (groups: stage, block, rest)."""
    out: Dict[int, Dict[int, Dict[str, torch.Tensor]]] = {}
    for k, v in sd.items():
        m = pattern.match(k)
        if m:
            out.setdefault(int(m.group(1) or 0), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
    return out


def _ratio(a, b):
    return None if a is None or not b else round(a / b, 4)


def _heads_from_residual(t):
    """InLine's residual: a grouped 1x1 conv (C, C / heads, 1)."""
    return None if t is None else int(t.shape[0]) // int(t.shape[1])


def _kernel_heads(p, prefix):
    """Heads shown by a block's kernel tensors under ``prefix`` (e.g. 'attn.kernel.'): InLine's residual conv or the
    agent biases (heads, agents, 7, 7); None where neither is there."""
    t = p.get(prefix + 'an_bias')
    return _heads_from_residual(p.get(prefix + 'residual.0.weight')) if t is None else int(t.shape[0])


def stage_info(blocks: Dict[int, Dict[str, torch.Tensor]], heads_of, extra=None) -> dict:
    """depth, dim (``norm1``'s width), heads, mlp (``mlp.fc1``'s width over dim) of one stage's blocks (block index
    -> {the rest of the key: tensor}); ``heads_of(params)`` reads one block's heads (or None where its tensors do
    not show them), ``extra(params)`` more fields of the first block."""
    if not blocks:
        return dict(depth=0, dim=None, heads=None, mlp=None, sr=None)
    first = blocks[min(blocks)]
    dim = size_of(first.get('norm1.weight'))
    heads = next((h for h in (heads_of(blocks[j]) for j in sorted(blocks)) if h is not None), None)
    info = dict(depth=max(blocks) + 1, dim=dim, heads=heads, mlp=_ratio(size_of(first.get('mlp.fc1.weight')), dim),
                sr=None)
    if extra:
        info.update(extra(first))
    return info


def _seq(value, depths):
    """A per-stage setting (one value, or one per stage whose entry may be one per block) as one list per stage."""
    stages = list(value) if isinstance(value, (list, tuple)) else [value] * len(depths)
    return [list(v) if isinstance(v, (list, tuple)) else [v] * d for v, d in zip(stages, depths)]


def _kind(cfg) -> str:
    return cfg if isinstance(cfg, str) else cfg.get('type') if isinstance(cfg, dict) else 'softmax'


def _inline_kinds(by, n, key) -> tuple:
    """Per stage, per block: 'inline' where the block holds InLine's residual (at ``key``), 'agent' where it holds
    the agent biases (beside it: ``an_bias`` for ``residual.0.weight``), else not known."""
    agent = key.replace('residual.0.weight', 'an_bias')

    def kind(p):
        return 'inline' if key in p else 'agent' if agent in p else None
    return tuple(tuple(kind(by.get(i, {}).get(j, {})) for j in range(max(by.get(i, {0: 0})) + 1)) for i in range(n))


def _preset_kinds(p) -> tuple:
    """Per stage, per block of a preset with one kernel per stage: 'inline', 'agent' or 'softmax'."""
    cfgs = _seq(p.get('attn_cfg', 'softmax'), p['depths'])
    return tuple(tuple(_kind(c) if _kind(c) in ('inline', 'agent') else 'softmax' for c in cs) for cs in cfgs)



class ArchSpec:
    """How one backbone class's architecture shows in its state dict, its presets, and the arguments that build
    another one: what a family declares (``Family(arch_spec=...)``) so that a file of another architecture is one
    error naming both and the arguments that fit the file.

    A family sets ``cls_name``, ``key_pattern`` (regex of a block's keys; groups: stage, block, the rest), ``staged``
    (False: one stage, its blocks at ``blocks.{j}``) and implements ``signature`` (a block of this family),
    ``info`` (the file's stages, e.g. through :func:`stage_info`), ``preset_info`` (a preset read the same way) and
    ``overrides`` (the arguments that build the file's architecture from a preset)."""
    cls_name = ''
    staged = True
    preset_fields = ('depth', 'dim', 'heads')  # the per-stage fields a preset fixes
    global_preset_fields = ()  # the same for whole-model settings
    arg_defaults: Dict[str, tuple] = {}  # whole-model setting -> (argument name, its default) outside the presets
    fills_heads = False  # heads the file does not show are assumed (SOFT's arch dict needs them all)

    key_pattern = re.compile(r'^stages\.(\d+)\.blocks\.(\d+)\.(.*)$')  # groups: stage, block, the rest

    def signature(self, stage: int, params: Dict[str, torch.Tensor]) -> bool:
        """A block of this family (so that another family's file is left to the key report)."""
        raise NotImplementedError

    def blocks(self, sd):
        by = _by_block(sd, self.key_pattern)
        if not by or not all(self.signature(i, b[min(b)]) for i, b in by.items()):
            return None
        return by

    def info(self, sd) -> Optional[dict]:
        raise NotImplementedError

    def preset_info(self, preset: dict) -> dict:
        raise NotImplementedError

    def model_info(self, module) -> Optional[dict]:
        info = self.info(module.state_dict())
        if info is not None:
            heads = module.num_heads if isinstance(module.num_heads, (list, tuple)) else (module.num_heads,)
            for st, h in zip(info['stages'], heads):
                st['heads'] = int(h)
        return info

    def overrides(self, info: dict, base: str, base_info: dict, heads) -> 'OrderedDict[str, object]':
        raise NotImplementedError

    def twin_note(self, base: str, twins: list) -> str:
        return 'the file may as well be a ' + ' or '.join(f'arch={n!r}' for n in twins) + ' variant'

    @property
    def zoo(self) -> Dict[str, dict]:
        return FAMILIES[self.cls_name].arch_zoo


def _num(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v

