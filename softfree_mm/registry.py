"""The one place that touches the OpenMMLab registries.

Every class in ``softfree_mm.models.__all__`` is registered into the MODELS registries of mmdet, mmseg and
mmpretrain (whichever are installed) and into this package's own scope, ``softfree_mm``, so that
``dict(type='SoftFreeSwin', ...)`` works in any mmdet, mmseg or mmpretrain config with that config's default scope.
"""
import importlib

from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

from . import models

# Our own scope; its parent is mmengine's root so scope-qualified names ('softfree_mm.SoftFreeSwin') resolve.
MODELS = Registry('model', parent=MMENGINE_MODELS, scope='softfree_mm', locations=['softfree_mm.models'])

DOWNSTREAM = ('mmdet', 'mmseg', 'mmpretrain')
REGISTERED = {}


def _downstream_registries():
    regs = {'softfree_mm': MODELS}
    for pkg in DOWNSTREAM:
        try:
            regs[pkg] = importlib.import_module(f'{pkg}.registry').MODELS
        except ImportError:  # a downstream package that is not installed simply gets nothing
            continue
    return regs


def register_all():
    for scope, reg in _downstream_registries().items():
        for name in models.__all__:
            cls = getattr(models, name)
            if reg.get(name) is not cls and name not in reg.module_dict:
                reg.register_module(module=cls)
        REGISTERED[scope] = reg
    return REGISTERED


register_all()
