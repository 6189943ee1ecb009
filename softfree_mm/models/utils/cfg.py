"""Config expansion and argument checks the backbones share: one value or one per stage / block / layer, kernel
configs validated where they enter, OpenMMLab argument names checked against what they mean here."""
import numbers
from typing import Callable, Dict, List, Sequence, Tuple, Union

from ...attention import normalize_cfg

AttnCfg = Union[str, dict, None]


def _spread(value, num: int, mismatch: Callable[[int], str]) -> list:
    """``value`` once per unit: a list / tuple must hold exactly ``num`` entries (else ``mismatch(len)``)."""
    if isinstance(value, (list, tuple)):
        if len(value) != num:
            raise ValueError(mismatch(len(value)))
        return list(value)
    return [value] * num


def _checked(value, kind, owner: str, name: str, where: str):
    """A validated kernel config (a fresh copy) when ``kind`` is None, else ``value`` itself, which must be a
    ``kind``."""
    if kind is None:
        try:
            return normalize_cfg(value)
        except (KeyError, TypeError, ValueError) as e:
            # the message itself: str() of a KeyError is its repr, quotes and escapes included
            raise type(e)(f'{owner}: {name} for {where}: {e.args[0] if e.args else e}') from None
    if not isinstance(value, kind):
        raise TypeError(f'{owner}: {name} entries must be {kind.__name__}, got {value!r}')
    return value


def expand_attn_cfg(attn_cfg: Union[AttnCfg, Sequence[AttnCfg]], num: int, unit: str, owner: str) -> List[dict]:
    """One kernel config for every unit, or a list/tuple with exactly one per unit (stage or layer).

    Returns ``num`` validated config dicts (each a fresh copy). Errors name the bad value and what is valid.
    """
    cfgs = _spread(attn_cfg, num, lambda n: f'{owner}: attn_cfg is a list of {n} kernel configs but the model has '
                                            f'{num} {unit}s; give one config for all, or exactly {num} (one per '
                                            f'{unit})')
    return [_checked(c, None, owner, 'attn_cfg', f'{unit} {i}') for i, c in enumerate(cfgs)]


def expand_per_block(value, depths: Sequence[int], name: str, owner: str, kind=None) -> List[list]:
    """One value for every block; or a list/tuple with one entry per stage, each entry one value for the stage's
    blocks or a list/tuple with exactly one per block. ``kind=None``: kernel configs (validated, fresh copies);
    else each value must be an instance of ``kind``. Returns one list per stage with one value per block."""
    num = len(depths)

    def stages_mismatch(n):
        what = f' is a list of {n} kernel configs' if kind is None else f'={tuple(value)!r} has {n} entries'
        return (f'{owner}: {name}{what} but the model has {num} stages; give one for all, or exactly {num} (one per '
                "stage; a stage's entry may be a list with one per block)")
    out = []
    for i, (v, depth) in enumerate(zip(_spread(value, num, stages_mismatch), depths)):
        blocks = _spread(v, depth, lambda n: f'{owner}: {name} for stage {i} is a list of {n} but the stage has '
                                             f'{depth} blocks; give one value for the stage or exactly {depth}')
        out.append([_checked(b, kind, owner, name, f'stage {i}') for b in blocks])
    return out


def per_stage(value, num: int, name: str, kind, owner: str) -> list:
    """One value for every stage, or a list/tuple with exactly one per stage, each of type ``kind``."""
    vals = _spread(value, num, lambda n: f'{owner}: {name}={value!r} has {n} entries but the model has {num} '
                                         f'stages; give one value for all or exactly {num}')
    return [_checked(v, kind, owner, name, '') for v in vals]


def check_foreign_args(owner: str, checks: Dict[str, Tuple[object, bool, str]]) -> None:
    """One ValueError naming every argument taken over from another library (mmdet, mmseg) whose value has no
    meaning here. ``checks``: name -> (value, fits, what would fit)."""
    bad = [f'{name}={value!r} ({what})' for name, (value, fits, what) in checks.items() if not fits]
    if bad:
        raise ValueError(f'{owner}: these arguments have no meaning here: {"; ".join(bad)}')


def pretrain_hw(owner: str, value) -> Tuple[int, int]:
    """mmdet's ``pretrain_img_size`` as (H, W): an int, or a tuple / list of one or two ints, as mmdet's Swin and PVT
    take it (mmdet asserts on any other length); anything else is one error naming the value."""
    size = (value,) if isinstance(value, numbers.Integral) else value
    if isinstance(size, (tuple, list)) and len(size) in (1, 2) and all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) and s > 0 for s in size):
        return int(size[0]), int(size[-1])
    raise ValueError(f'{owner}: pretrain_img_size must be a positive int or a tuple of 1 or 2 positive ints (H, W): '
                     f'the image size the position embedding was learned at, as in mmdet; got {value!r}')


def is_cfg(cfg, kind: str, **fixed) -> bool:
    """``cfg`` is ``dict(type=kind)``, optionally with exactly the given extra values (e.g. LN with eps=1e-6)."""
    if not isinstance(cfg, dict) or cfg.get('type') != kind:
        return False
    return all(cfg.get(k, v) == v for k, v in fixed.items()) and set(cfg) <= {'type', 'requires_grad', *fixed}


def _every(value) -> bool:
    return all(_every(v) for v in value) if isinstance(value, (list, tuple)) else bool(value)


def global_first_stages(global_window, stages: int = 3) -> bool:
    """Whether a ``global_window`` setting makes the attention global in the first ``stages`` stages (in Swin and
    CSWin the last stage's grid is one window at the pretraining size): one value for all, or one per stage, a stage's
    entry one value or one per block (every block of those stages must be global)."""
    if isinstance(global_window, (list, tuple)):
        return all(_every(g) for g in global_window[:stages])
    return bool(global_window)
