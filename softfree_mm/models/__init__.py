from .backbones import *  # noqa: F401,F403
from .backbones import __all__ as _backbones
from .transfer import AttentionTransfer  # noqa: F401

__all__ = [*_backbones, 'AttentionTransfer']
