"""Which attention modules a model holds (``discover``), which of them a swap takes (``select``, by index or path
pattern), and which kernel config each gets (one for all, one per stage, one per module)."""
import copy
import fnmatch
import re
from dataclasses import dataclass
from typing import List, Optional

from torch import nn

from ..attention import AttentionKernel, normalize_cfg
from .adapter import Adapter, SwapError, adapter_of, supported_layouts

# names of attention-like classes that have no adapter: reported as unknown layouts rather than skipped silently
_ATTN_NAME = re.compile(r'attention|attn|msa|xca', re.IGNORECASE)


def _looks_like_attention(m: nn.Module) -> bool:
    if isinstance(m, AttentionKernel):
        return False
    if isinstance(m, nn.MultiheadAttention):
        return True
    return bool(_ATTN_NAME.search(type(m).__name__)) and hasattr(m, 'num_heads')


def _inside(path: str, parent: str) -> bool:
    return parent == '' or path.startswith(parent + '.')


@dataclass
class Entry:
    index: int
    path: str
    module: nn.Module
    adapter: Optional[Adapter]
    unknown: str = ''  # why it has no adapter


def discover(model: nn.Module) -> List[Entry]:
    """Attention modules in module order: those with an adapter, and unknown attention-like modules that neither
    contain nor sit inside a module with an adapter."""
    claimed: List[str] = []
    candidates = []
    for path, m in model.named_modules():
        if any(_inside(path, c) for c in claimed):
            continue
        if isinstance(m, AttentionKernel):
            continue
        ad = adapter_of(m)
        if ad is not None:
            claimed.append(path)
            candidates.append((path, m, ad))
        elif _looks_like_attention(m):
            candidates.append((path, m, None))
    entries = []
    for path, m, ad in candidates:
        if ad is None:
            if any(_inside(c, path) and c != path for c in claimed):
                continue  # a wrapper (e.g. ShiftWindowMSA) of an adapted module
            own = any(isinstance(ch, AttentionKernel) for ch in m.children())
            why = ('it already runs a softfree_mm kernel (a softfree_mm backbone): set that backbone\'s attn_cfg'
                   if own else f'no adapter for this attention layout; supported: {", ".join(supported_layouts())}')
            entries.append(Entry(len(entries), path, m, None, why))
        else:
            entries.append(Entry(len(entries), path, m, ad))
    return entries


def _stage_key(path: str) -> Optional[str]:
    """The first numbered container in a module path: 'stages.2.blocks.1.attn.w_msa' -> 'stages.2'."""
    parts = path.split('.')
    for i, p in enumerate(parts):
        if p.isdigit():
            return '.'.join(parts[:i + 1])
    return None


def select(entries: List[Entry], layers) -> List[Entry]:
    """The entries ``layers`` names: None (all), indices, module paths / fnmatch patterns, or a list of those."""
    if layers is None:
        return list(entries)
    items = [layers] if isinstance(layers, (int, str)) else layers
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeError(f'swap_attention: layers must be None, an int, a path pattern or a non-empty list of them, '
                        f'got {layers!r}')
    chosen = set()
    listing = ', '.join(f'{e.index}: {e.path or "<model>"}' for e in entries[:40]) + (
        ' ...' if len(entries) > 40 else '')
    for it in items:
        if isinstance(it, bool) or not isinstance(it, (int, str)):
            raise TypeError(f'swap_attention: layers entries must be ints (indices) or strings (module paths / '
                            f'fnmatch patterns), got {it!r}')
        if isinstance(it, int):
            if not -len(entries) <= it < len(entries):
                raise SwapError(f'swap_attention: layers index {it} is out of range; the model has {len(entries)} '
                                f'attention modules: {listing}')
            chosen.add(entries[it].index)
        else:
            hits = [e.index for e in entries if fnmatch.fnmatchcase(e.path, it)]
            if not hits:
                raise SwapError(f'swap_attention: layers pattern {it!r} matches no attention module; the model has: '
                                f'{listing}')
            chosen.update(hits)
    return [e for e in entries if e.index in chosen]


def checked_cfg(cfg, what: str) -> dict:
    """``normalize_cfg(cfg)``, its error prefixed with ``swap_attention: <what>:`` (same error type)."""
    try:
        return normalize_cfg(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise type(e)(f'swap_attention: {what}: {e.args[0] if e.args else e}') from None


def assign_cfgs(attn_cfg, entries: List[Entry], selected: List[Entry]) -> List[dict]:
    """One fresh kernel config per selected entry, from one config, one per stage or one per selected module."""
    if not isinstance(attn_cfg, (list, tuple)):
        cfg = checked_cfg(attn_cfg, 'attn_cfg')
        return [copy.deepcopy(cfg) for _ in selected]
    keys = [_stage_key(e.path) for e in entries]
    stages = list(dict.fromkeys(k for k in keys if k is not None))
    has_stages = None not in keys and len(stages) < len(entries)
    cfgs = [checked_cfg(c, f'attn_cfg[{i}]') for i, c in enumerate(attn_cfg)]
    if has_stages and len(cfgs) == len(stages):
        return [copy.deepcopy(cfgs[stages.index(_stage_key(e.path))]) for e in selected]
    if len(cfgs) == len(selected):
        return [copy.deepcopy(c) for c in cfgs]
    stage_txt = f'{len(stages)} stages ({", ".join(stages)}), ' if has_stages else ''
    per_stage = f'one per stage ({len(stages)}), ' if has_stages else ''
    raise SwapError(f'swap_attention: attn_cfg is a list of {len(cfgs)} kernel configs; the model has {stage_txt}'
                    f'{len(selected)} selected attention module(s); give one config for all, {per_stage}'
                    f'or one per module ({len(selected)})')
