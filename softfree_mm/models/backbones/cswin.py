"""Placeholder: being written."""
from mmengine.model import BaseModule
__all__ = ['SoftFreeCSWin']

class SoftFreeCSWin(BaseModule):
    pass
