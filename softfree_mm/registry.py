"""The one place that touches the OpenMMLab registries.

Every class of ``softfree_mm.models.__all__`` and the ``SoftFreeSwap`` builder go into the MODELS registries of
mmdet, mmseg and mmpretrain (those installed) and of this package's scope, so ``dict(type='SoftFreeSwin', ...)``
works under any of their default scopes; the hooks go into HOOKS the same way (the tools' reliability hooks into
mmengine's root), ``Scratch`` (train from the module's own initialisation, on purpose) and ``ReleaseHead`` (a
release's classifier into a head) into the root WEIGHT_INITIALIZERS, which every scope falls back to. A backbone family of one's own goes the same way through
:func:`register_backbone`.
"""
import importlib

from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import WEIGHT_INITIALIZERS, Registry

from . import models
from .engine import hooks
from .models.backbones.base import register_family
from .models.utils.pretrained import ReleaseHeadInit, ScratchInit
from .swap.config import SoftFreeSwap

# Our own scope; its parent is mmengine's root so scope-qualified names ('softfree_mm.SoftFreeSwin') resolve.
MODELS = Registry('model', parent=MMENGINE_MODELS, scope='softfree_mm', locations=['softfree_mm.models'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='softfree_mm', locations=['softfree_mm.engine.hooks'])
HOOK_CLASSES = ('AttentionStatsHook', )

DOWNSTREAM = ('mmdet', 'mmseg', 'mmpretrain')


def _downstream_registries(kind='MODELS'):
    regs = {'softfree_mm': MODELS if kind == 'MODELS' else HOOKS}
    for pkg in DOWNSTREAM:
        try:
            regs[pkg] = getattr(importlib.import_module(f'{pkg}.registry'), kind)
        except ImportError:  # a downstream package that is not installed simply gets nothing
            continue
    return regs


FACTORIES = {'SoftFreeSwap': SoftFreeSwap}  # registered callables that build a model (not classes)


def _register_model(name, module):
    for reg in _downstream_registries().values():
        # module_dict, not reg.get(): get() first imports the registry's locations (all of mmdet.models,
        # mmseg.models, mmpretrain.models), which `import softfree_mm` does not need; builds import them anyway
        if name not in reg.module_dict:
            reg.register_module(name=name, module=module)


def register_all():
    for name in models.__all__:
        _register_model(name, getattr(models, name))
    for name, fn in FACTORIES.items():
        _register_model(name, fn)
    for reg in _downstream_registries('HOOKS').values():
        for name in HOOK_CLASSES:
            if name not in reg.module_dict:  # module_dict, not get(): see above
                reg.register_module(module=getattr(hooks, name))
    for name, cls in (('Scratch', ScratchInit), ('ReleaseHead', ReleaseHeadInit)):
        if WEIGHT_INITIALIZERS.get(name) is None:
            WEIGHT_INITIALIZERS.register_module(name, module=cls)


register_all()


def register_backbone(cls):
    """A backbone family of one's own, as the package's own (a class decorator): declared to the package's tools
    (:func:`softfree_mm.models.backbones.base.register_family`: converter, hooks, support table, benchmark, the
    tests' presets) and registered in the MODELS registries of mmdet, mmseg, mmpretrain and the softfree_mm scope.
    A name another class holds there already is refused."""
    name = cls.__name__ if isinstance(cls, type) else repr(cls)
    for scope, reg in _downstream_registries().items():
        other = reg.module_dict.get(name)
        if other is not None and other is not cls:
            raise KeyError(f'register_backbone: {name!r} is already registered in the {scope} MODELS registry by '
                           f'{other}; give the class another name')
    register_family(cls)
    _register_model(name, cls)
    return cls


def register_hooks():
    """The tools' reliability hooks, in mmengine's root HOOKS (every scope's HOOKS registry finds them)."""
    for cls in (hooks.NonFiniteLossHook, hooks.RNGStateHook, hooks.CheckpointOnSignalHook):
        if MMENGINE_HOOKS.get(cls.__name__) is not cls:
            MMENGINE_HOOKS.register_module(module=cls, force=True)


register_hooks()
