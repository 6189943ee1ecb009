"""Swap the attention kernel inside models we did not write (timm, mmdet, mmpretrain, mmseg, mmcv), keeping each
module's class (a subclass is swapped in), weights and state-dict keys; the kernel becomes a child ``kernel``.

>>> swap_attention(timm.create_model('deit3_small_patch16_224', pretrained=True), dict(type='poly', degree=3))

Torch only. The core: ``adapter`` (the Layout contract, the adapter registry), ``discover``, ``plan`` (the fit rules
of ``attention/fit.py`` and a probe), ``install`` (install, restore, summary), ``attend`` and ``layouts`` (what
adapters share); ``adapters/`` one file per library; ``config`` the ``SoftFreeSwap`` config form (mmengine).
"""
from . import adapters  # noqa: F401  (registers every adapter)
from .adapter import ADAPTERS, Adapter, Layout, SwapError, register, supported_layouts
from .core import swap_attention
# not an import path: the name pickles of swapped models written before the package split call to rebuild them
from .install import new_swapped as _new_swapped  # noqa: F401
from .install import restore_attention, swap_summary

__all__ = ['swap_attention', 'restore_attention', 'swap_summary', 'supported_layouts', 'SwapError', 'Layout',
           'Adapter', 'ADAPTERS', 'register']
