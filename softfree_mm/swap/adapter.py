"""The adapter contract: what a foreign attention module hands a kernel (:class:`Layout`), and the adapters found
by the module's exact type. A library's adapters live in one file of ``swap/adapters/`` that calls :func:`register`.
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from torch import nn

from ..attention.fit import Site


class SwapError(ValueError):
    """A kernel that cannot fit a layout, an unknown attention layout, or a bad ``layers`` / ``attn_cfg``.

    ``refusals``: ``(module path, code, reason)`` for each module that could not be swapped; code is one of
    'layout' (no adapter / a variant the adapter does not reproduce), 'build', 'ties_qk', 'grid', 'prefix', 'mask',
    'length', 'probe'."""

    def __init__(self, message, refusals=()):
        super().__init__(message)
        self.refusals = list(refusals)


@dataclass(kw_only=True)
class Layout(Site):
    """What a kernel is handed inside one foreign attention module: the demands the fit rules read (:class:`Site`:
    masks, bias, varying length, cross-attention, no grid, prefix tokens) and the shapes of the probe."""
    num_heads: int
    head_dim: Optional[int]  # None: XCA (the kernel's "head_dim" is the token count)
    nq: int  # query count of a probe (the real one where it is fixed)
    nk: int  # key count of a probe
    grid: Optional[Tuple[int, int]] = None  # the patch/window grid shared by queries and keys, for the probe
    scale: float = 1.0  # probe scale
    where: str = ''  # a short description for the summary


@dataclass
class Adapter:
    label: str  # e.g. 'timm ViT attention'
    types: Tuple[str, ...]  # 'module.Qualname' of the attention classes it handles
    layout: Callable  # (module, path, model) -> Layout; raises SwapError for variants it cannot handle
    forward: Callable  # replaces the module's forward (same signature)
    install: Optional[Callable] = None  # (module, path, model, layout) -> None: per-module context (grid, scale)


ADAPTERS: Dict[str, Adapter] = {}


def register(label: str, types: Sequence[str], layout, forward, install=None) -> Adapter:
    """Make ``forward`` the swapped forward of the attention classes named by ``types`` ('module.Qualname', as the
    library defines them: nothing is imported), with ``layout`` reading what the kernel is handed."""
    ad = Adapter(label, tuple(types), layout, forward, install)
    for t in types:
        ADAPTERS[t] = ad
    return ad


def supported_layouts() -> Dict[str, List[str]]:
    """adapter label -> the module types it handles."""
    out: Dict[str, List[str]] = {}
    for t, ad in ADAPTERS.items():
        out.setdefault(ad.label, []).append(t)
    return out


def type_key(cls) -> str:
    return f'{cls.__module__}.{cls.__qualname__}'


def original_class(module: nn.Module):
    return getattr(type(module), '_sf_original_class', type(module))


def adapter_of(module: nn.Module) -> Optional[Adapter]:
    return ADAPTERS.get(type_key(original_class(module)))


def need(module, *names):
    """SwapError unless ``module`` has every attribute its adapter reads."""
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise SwapError(f'unknown layout: it lacks {missing}, which the adapter for its type reads (a library '
                        'version this adapter was not written for?)')


def owner(model: nn.Module, path: str, predicate) -> Optional[nn.Module]:
    """The nearest module on the way from ``model`` to ``path`` (excluding the target) that satisfies predicate."""
    parts = path.split('.') if path else []
    chain = [model]
    for i in range(1, len(parts)):
        chain.append(model.get_submodule('.'.join(parts[:i])))
    for m in reversed(chain):
        if predicate(m):
            return m
    return None


def parent(model: nn.Module, path: str) -> Optional[nn.Module]:
    if not path:
        return None
    return model.get_submodule(path.rpartition('.')[0]) if '.' in path else model
