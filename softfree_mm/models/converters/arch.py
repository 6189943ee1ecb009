"""The architecture a converted file holds against a model's: the presets and arguments that fit a file, one
phrase describing it, and the one error for a file of another architecture."""
import math
from collections import OrderedDict
from typing import Dict, Optional

import torch

from ..family import FAMILIES, Family
from .detect import checkpoint_class, list_converters
from .spec import ArchSpec, _num

_STAGE_FIELDS = ('depth', 'dim', 'heads', 'mlp', 'sr')


def _spec(target) -> Optional[ArchSpec]:
    """The spec a family declares, for a module, a class, a class name or a checkpoint kind (None when its family
    declares none)."""
    if isinstance(target, str):
        target = checkpoint_class(target) if target in list_converters() else FAMILIES.get(target)
    family = getattr(target if isinstance(target, type) else type(target), 'family', None)
    return family.arch_spec if isinstance(family, Family) else None


def arch_of(target, state_dict: Dict[str, torch.Tensor]) -> Optional[dict]:
    """What a converted state dict holds, read for ``target`` (a backbone module, class, class name or converter
    family): ``{'stages': [{'depth', 'dim', 'heads', 'mlp', 'sr'}, ...], ...}`` with None where the file does not
    show a value; None when the file holds no block of that family."""
    spec = _spec(target)
    return None if spec is None else spec.info(state_dict)


def _differs(a, b) -> bool:
    """Both known and different (ratios compared to 1e-3)."""
    if a is None or b is None:
        return False
    return abs(a - b) > 1e-3 if isinstance(a, float) or isinstance(b, float) else a != b


def _variant(arch) -> set:
    """The preset family words of an arch ('inline', 'norm', 'li'), to rank presets the file cannot tell apart."""
    if isinstance(arch, dict):
        return {'norm'} if arch.get('normalized') else set()
    return set(arch.split('_')) & {'inline', 'agent', 'norm', 'li'} if isinstance(arch, str) else set()


def _kind_clashes(info, pinfo) -> int:
    fk, pk = info.get('kinds') or (), pinfo.get('kinds') or ()
    return sum(a is not None and b is not None and a != b for fs, ps in zip(fk, pk) for a, b in zip(fs, ps))


def _fits(spec, info, pinfo) -> bool:
    if len(info['stages']) != len(pinfo['stages']):
        return False
    if any(_differs(s.get(f), p.get(f)) for s, p in zip(info['stages'], pinfo['stages']) for f in spec.preset_fields):
        return False
    return not any(_differs(info.get(f), pinfo.get(f)) for f in spec.global_preset_fields) and \
        not _kind_clashes(info, pinfo)


def _agreement(spec, info, pinfo) -> int:
    return sum(s.get(f) is not None and not _differs(s.get(f), p.get(f))
               for s, p in zip(info['stages'], pinfo['stages']) for f in spec.preset_fields)


def _image_size(tokens: Optional[int]) -> Optional[int]:
    """The input size of a square stage-1 position table (stride 4); None when it is not square."""
    if tokens is None:
        return None
    side = math.isqrt(tokens)
    return side * 4 if side * side == tokens else None


def fitting_args(target, info: dict, model=None):
    """``(presets, kwargs, notes)``: the presets of ``target``'s class the file fits (several where the file cannot
    tell them apart, e.g. SOFT and SOFT-Norm), and the keyword arguments that build a model the file fits: the
    first fitting preset, or (none fits) the closest preset with the file's depths / widths / heads. ``model``
    (the module a file is loaded into) ranks equal fits by its own preset family and lends its heads where the
    file does not show them."""
    spec = _spec(target)
    zoo = spec.zoo
    pinfos = {n: spec.preset_info(p) for n, p in zoo.items()}
    want = _variant(getattr(model, 'arch', None)) if model is not None else None

    def rank(n):  # the file's block kinds, then the model's preset family, then the model's own preset
        return (_kind_clashes(info, pinfos[n]), 0 if want is None else len(want ^ _variant(n)),
                0 if model is None or getattr(model, 'arch', None) == n else 1)
    fits = [n for n in zoo if _fits(spec, info, pinfos[n])]
    notes = []
    if fits:
        best = min(rank(n) for n in fits)
        fits = [n for n in fits if rank(n) == best]
        base = fits[0]
    else:
        base = min(zoo, key=lambda n: (rank(n)[0], -_agreement(spec, info, pinfos[n])) + rank(n)[1:])
        twins = [n for n in zoo if n != base and pinfos[n] == pinfos[base]]
        if twins and model is None:  # presets with the same tensors: say which else it may be
            notes.append(spec.twin_note(base, twins))
    own = spec.model_info(model) if model is not None else None
    heads = []
    for i, s in enumerate(info['stages']):
        h = s['heads']
        for other in (own, pinfos[base]):  # a stage of the same width lends its heads
            if h is None and other is not None and i < len(other['stages']) and \
                    other['stages'][i]['dim'] == s['dim']:
                h = other['stages'][i]['heads']
        heads.append(h)
    kw = OrderedDict(arch=base)
    if not fits:
        unknown = [i for i, h in enumerate(heads) if h is None]
        if unknown and spec.fills_heads:  # the closest preset's head width
            for i in unknown:
                b = pinfos[base]['stages'][min(i, len(pinfos[base]['stages']) - 1)]
                width = b['dim'] // b['heads']
                dim = info['stages'][i]['dim']
                heads[i] = dim // width if dim and dim % width == 0 else b['heads']
        which = f"stage{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))}"
        if unknown and spec.fills_heads:
            notes.append(f"the file does not show the heads of {which} (assumed: "
                         f"{', '.join(str(heads[i]) for i in unknown)}, at the head width of arch={base!r})")
        elif unknown:
            notes.append(f'the file does not show the heads of {which} (give num_heads)')
        kw.update(spec.overrides(info, base, pinfos[base], None if unknown and not spec.fills_heads else heads))
    for field, (arg, default) in spec.arg_defaults.items():
        value = info.get(field)
        if field == 'positions':
            if value is not None and _image_size(value) is None:
                notes.append(f'{arg}: a position table of {value} tokens (not a square grid)')
            value = _image_size(value)
        if value is not None and _differs(value, default):
            kw[arg] = _num(value)
    return fits, kw, notes


def _fmt(v) -> str:
    if isinstance(v, dict):
        return 'dict(' + format_args(v) + ')'
    if isinstance(v, (tuple, list)):
        return '(' + ', '.join(_fmt(x) for x in v) + (',)' if len(v) == 1 else ')')
    return repr(_num(v))


def format_args(kwargs: dict) -> str:
    """Keyword arguments as a config writes them: ``arch='small', depths=(2, 2, 8, 2)``."""
    return ', '.join(f'{k}={_fmt(v)}' for k, v in kwargs.items())


def _fit_text(spec, fits, kw, notes) -> str:
    """``SoftFreeSwin(arch='small')``, with the presets the file cannot tell apart, or the note that none fits."""
    text = f'{spec.cls_name}({format_args(kw)})'
    if len(fits) > 1:
        text += ' or ' + ' or '.join(f'arch={n!r}' for n in fits[1:]) + ' (the file does not show which)'
    elif not fits:
        text += ' (no preset has this architecture)'
    return text + ''.join(f'; {n}' for n in notes)


def describe_arch(target, info: dict) -> str:
    """One phrase for what the file holds: depths, widths, heads (? where not shown), and what else sizes it."""
    st = info['stages']

    def seq(field):
        vals = ['?' if s.get(field) is None else str(_num(s[field])) for s in st]
        return vals[0] if len(vals) == 1 else '(' + ', '.join(vals) + ')'
    if len(st) == 1:
        parts = [f"{st[0]['depth']} blocks", f'width {seq("dim")}', f'{seq("heads")} heads']
    else:
        parts = [f'depths {seq("depth")}', f'widths {seq("dim")}', f'heads {seq("heads")}']
    if any(s.get('mlp') is not None for s in st) and len({s.get('mlp') for s in st}) > 1:
        parts.append(f'MLP ratios {seq("mlp")}')
    elif st[0].get('mlp') is not None:
        parts.append(f"MLP ratio {_num(st[0]['mlp'])}")
    if any(s.get('sr') is not None for s in st):
        parts.append(f'spatial reduction {seq("sr")}')
    if info.get('linear'):
        parts.append('linear SRA')
    if info.get('window') is not None:
        parts.append(f"window {info['window']}")
    if info.get('positions') is not None:
        size = _image_size(info['positions'])
        parts.append(f"position tables for {size}x{size} inputs" if size else
                     f"a {info['positions']}-token position table")
    if info.get('patch') is not None:
        parts.append(f"patch size {info['patch']}")
    return ', '.join(parts)


def arch_report(family: str, state_dict: Dict[str, torch.Tensor]) -> Optional[str]:
    """'SoftFreeSwin(arch='small'): depths (2, 2, 18, 2), ...' for a converted file of ``family`` (None when the
    file holds no block of it)."""
    spec = _spec(family)
    info = None if spec is None else spec.info(state_dict)
    if info is None:
        return None
    fits, kw, notes = fitting_args(family, info)
    return f'{_fit_text(spec, fits, kw, notes)}: the file holds {describe_arch(family, info)}'


def _stage_text(s: Optional[dict], extra) -> str:
    if s is None:
        return 'no stage'
    text = f"{s['depth']} block{'' if s['depth'] == 1 else 's'} of {'?' if s['dim'] is None else s['dim']} channels"
    more = [f"{s['heads']} head{'' if s['heads'] == 1 else 's'}"] if s.get('heads') is not None else []
    if 'mlp' in extra and s.get('mlp') is not None:
        more.append(f"MLP ratio {_num(s['mlp'])}")
    if 'sr' in extra and s.get('sr') is not None:
        more.append(f"spatial reduction {s['sr']}")
    return text + (f" ({', '.join(more)})" if more else '')


_GLOBAL_TEXT = {'window': lambda v: f'window {v}', 'linear': lambda v: 'linear SRA' if v else 'strided SRA',
                'positions': lambda v: f'a position table of {v} tokens', 'patch': lambda v: f'patch size {v}'}


def arch_differences(module, state_dict: Dict[str, torch.Tensor]) -> Optional[list]:
    """Lines naming what the file holds against what ``module`` has, stage by stage, where they differ (depth,
    width, heads where the file shows them, MLP ratio, spatial reduction; Swin's window, PVT's position table,
    XCiT's patch size); [] when they agree, None when ``module`` has no spec or the file no block of its family."""
    spec = _spec(module)
    info = None if spec is None else spec.info(state_dict)
    if info is None:
        return None
    own = spec.model_info(module)
    rows = []
    fs, ms = info['stages'], own['stages']
    for i in range(max(len(fs), len(ms))):
        f, m = (fs[i] if i < len(fs) else None), (ms[i] if i < len(ms) else None)
        bad = [k for k in _STAGE_FIELDS if f is not None and m is not None and _differs(f.get(k), m.get(k))]
        if f is None or m is None or bad:
            where = f'stage {i}: ' if spec.staged else ''
            rows.append(f'{where}{_stage_text(f, bad)} in the file, {_stage_text(m, bad)} in the model')
    for k, text in _GLOBAL_TEXT.items():
        if _differs(info.get(k), own.get(k)):
            rows.append(f'{text(info[k])} in the file, {text(own[k])} in the model')
    return rows


def structure_differences(a, b, fields=('depth', 'dim', 'heads', 'mlp')) -> list:
    """Lines naming where two backbone modules of one family differ, stage by stage, in ``fields`` (by default what
    their blocks' weights mean: depth, width, heads, MLP ratio; not the layout, such as spatial reduction)."""
    spec = _spec(a)
    ia, ib = spec.model_info(a), spec.model_info(b)
    rows = []
    for i in range(max(len(ia['stages']), len(ib['stages']))):
        x = ia['stages'][i] if i < len(ia['stages']) else None
        y = ib['stages'][i] if i < len(ib['stages']) else None
        bad = [k for k in fields if x is not None and y is not None and _differs(x.get(k), y.get(k))]
        if x is None or y is None or bad:
            rows.append(f'{f"stage {i}: " if spec.staged else ""}{_stage_text(x, bad)} against {_stage_text(y, bad)}')
    return rows


def check_arch(module, state_dict: Dict[str, torch.Tensor], checkpoint: str) -> Optional[dict]:
    """Raise one ValueError when the converted ``state_dict`` holds another architecture than ``module`` (see
    :func:`arch_differences`), naming per stage what differs and the arguments that fit the file; returns the
    file's architecture (None when not known)."""
    rows = arch_differences(module, state_dict)
    if not rows:
        return None if rows is None else arch_of(module, state_dict)
    spec = _spec(module)
    info = spec.info(state_dict)
    fits, kw, notes = fitting_args(module, info, module)
    raise ValueError(f'{spec.cls_name}: checkpoint {checkpoint} holds another architecture than this model '
                     f'(arch={_fmt(getattr(module, "arch", None))}):\n  ' + ';\n  '.join(rows) +
                     f';\n  the file fits {_fit_text(spec, fits, kw, notes)}')


def check_model_checkpoint(model: torch.nn.Module, state_dict: Dict[str, torch.Tensor], checkpoint: str) -> list:
    """:func:`check_arch` for each softfree_mm backbone inside a whole model (a detector's ``backbone``) against
    its keys in a whole-model state dict (``load_from``, ``--resume``), converted as its Pretrained loading does.
    Returns ``[(module name, the file's architecture)]`` for the backbones the file has keys of."""
    found = []
    for name, m in model.named_modules():
        if not name or _spec(m) is None:
            continue
        sub = OrderedDict((k[len(name) + 1:], v) for k, v in state_dict.items() if k.startswith(name + '.'))
        if sub:
            convert = getattr(type(m), '_convert', None)
            found.append((name, check_arch(m, convert(sub) if convert else sub, checkpoint)))
    return found
