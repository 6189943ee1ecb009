"""Placeholder: being written."""
from mmengine.model import BaseModule
__all__ = ['SoftFreePVT','SoftFreePVTv2']

class SoftFreePVT(BaseModule):
    pass

class SoftFreePVTv2(BaseModule):
    pass
