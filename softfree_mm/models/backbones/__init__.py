"""Backbone families, one file each. Every class in ``__all__`` is registered by softfree_mm/registry.py."""
from .xcit import *  # noqa: F401,F403
from .pvt import *  # noqa: F401,F403
from .swin import *  # noqa: F401,F403
from .cswin import *  # noqa: F401,F403
from .soft import *  # noqa: F401,F403
from . import xcit, pvt, swin, cswin, soft

__all__ = [*xcit.__all__, *pvt.__all__, *swin.__all__, *cswin.__all__, *soft.__all__]
