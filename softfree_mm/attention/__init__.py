"""Swappable attention kernels (pure PyTorch, no OpenMMLab import).

>>> from softfree_mm.attention import build_attention, list_attentions
>>> kern = build_attention(dict(type='poly', degree=3), num_heads=4, head_dim=32)
>>> out = kern(q, k, v, hw=None, scale=None, bias=None, mask=None)
"""
import copy
import inspect
from typing import Dict, List, Optional, Type, Union

from .base import AttentionKernel
from .score_map import ScoreMap


class KernelRegistry:
    """name -> AttentionKernel subclass."""

    def __init__(self):
        self._map: Dict[str, Type[AttentionKernel]] = {}

    def register(self, name: str):
        def deco(cls):
            if name in self._map:
                raise KeyError(f"attention kernel '{name}' is already registered by {self._map[name]}")
            if not issubclass(cls, AttentionKernel):
                raise TypeError(f'{cls} must subclass AttentionKernel')
            cls.name = name
            self._map[name] = cls
            return cls
        return deco

    def get(self, name: str) -> Type[AttentionKernel]:
        if name not in self._map:
            raise KeyError(f"unknown attention type {name!r}; valid types: {', '.join(sorted(self._map))}")
        return self._map[name]

    def __contains__(self, name):
        return name in self._map

    def __iter__(self):
        return iter(sorted(self._map))

    def __len__(self):
        return len(self._map)


ATTENTION = KernelRegistry()


def list_attentions() -> List[str]:
    """Names of every registered kernel, sorted."""
    return sorted(ATTENTION)


def kernel_arguments(name: str) -> List[str]:
    """The config arguments a kernel type accepts (besides ``type``, num_heads and head_dim)."""
    sig = inspect.signature(ATTENTION.get(name).__init__)
    return [p for p in sig.parameters if p not in ('self', 'num_heads', 'head_dim')]


def normalize_cfg(cfg: Union[str, dict, None]) -> dict:
    """'poly' -> {'type': 'poly'}; validates the type and the argument names (no build)."""
    if cfg is None:
        cfg = 'softmax'
    if isinstance(cfg, str):
        cfg = dict(type=cfg)
    if not isinstance(cfg, dict) and hasattr(cfg, 'to_dict'):
        cfg = cfg.to_dict()
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise TypeError(f"an attention config must be a kernel name or a dict with 'type', got {cfg!r}; "
                        f"valid types: {', '.join(list_attentions())}")
    cfg = copy.deepcopy(dict(cfg))
    name = cfg['type']
    ATTENTION.get(name)  # raises with the list of valid types
    valid = kernel_arguments(name)
    bad = [key for key in cfg if key != 'type' and key not in valid]
    if bad:
        raise TypeError(f"attention '{name}' got unknown argument(s) {bad}; valid arguments: {valid}")
    return cfg


def build_attention(cfg: Union[str, dict, None], num_heads: Optional[int] = None,
                    head_dim: Optional[int] = None) -> AttentionKernel:
    """Build a kernel from a name or a config dict ``dict(type=..., **args)``."""
    cfg = normalize_cfg(cfg)
    cls = ATTENTION.get(cfg.pop('type'))
    return cls(num_heads=num_heads, head_dim=head_dim, **cfg)


def kernel_class(cfg: Union[str, dict, None]) -> Type[AttentionKernel]:
    """The class a config would build (to read its declared abilities before building)."""
    return ATTENTION.get(normalize_cfg(cfg)['type'])


_LITERALS = {'True': True, 'False': False, 'None': None}


def parse_kernel(text: str) -> Union[str, dict]:
    """A kernel in the tools' syntax: 'poly' stays 'poly'; 'poly:degree=1,scale=0.1' is
    ``dict(type='poly', degree=1, scale=0.1)`` (ints, floats, True / False / None as such, anything else a string).
    Not validated here (:func:`normalize_cfg` does); :func:`kernel_label` is its inverse."""
    name, _, rest = text.partition(':')
    cfg = dict(type=name)
    for item in filter(None, rest.split(',')):
        key, eq, value = item.partition('=')
        if not eq:
            raise ValueError(f'kernel spec {text!r}: expected name:arg=value,..., got {item!r}')
        cfg[key] = _LITERALS[value] if value in _LITERALS else _number(value)
    return cfg if len(cfg) > 1 else name


def _number(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def kernel_label(cfg: Union[str, dict]) -> str:
    """A kernel config in the tools' syntax: 'poly', dict(type='poly', degree=1) -> 'poly:degree=1'."""
    if isinstance(cfg, str):
        return cfg
    args = ','.join(f'{key}={value}' for key, value in cfg.items() if key != 'type')
    return f"{cfg['type']}:{args}" if args else cfg['type']



class Kernel(str):
    """A kernel in the tools' syntax, parsed once: the label itself (a ``str``, so rows, keys and CSV cells keep it as
    they are: 'poly:degree=3') with its config (:attr:`cfg`: ``dict(type='poly', degree=3)``). A study makes its
    kernels at its edge (``Kernel(label)``); the modules they pass read :attr:`cfg` and never parse the label again
    (``Kernel(k)`` of a Kernel is ``k`` itself). A bad label: ValueError naming it and the syntax."""

    def __new__(cls, label):
        if isinstance(label, Kernel):
            return label
        if not isinstance(label, str) or not label or label.startswith(':'):
            raise ValueError(f'kernel {label!r}: expected a label name[:arg=value,...] such as poly:degree=3')
        self = super().__new__(cls, label)
        spec = parse_kernel(label)
        self._cfg = dict(type=spec) if isinstance(spec, str) else spec
        return self

    @property
    def cfg(self) -> dict:
        """The kernel config (a fresh dict: the caller may change it)."""
        return dict(self._cfg)

    def __reduce__(self):  # pickled / copied as its label, parsed again on the other side
        return Kernel, (str(self), )

# Kernel families register themselves on import.
from . import softmax, poly, pointwise, linear, inline, soft, synthesizer, extra, agent  # noqa: E402,F401

__all__ = ['ATTENTION', 'AttentionKernel', 'Kernel', 'ScoreMap', 'build_attention', 'list_attentions', 'kernel_arguments',
           'kernel_class', 'kernel_label', 'normalize_cfg', 'parse_kernel']
