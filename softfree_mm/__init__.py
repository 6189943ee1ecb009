"""softfree_mm: softmax-free attention kernels swappable inside XCiT, PVT, Swin and CSwin, for OpenMMLab 2.x."""
__version__ = '0.1.0'

from . import compat  # noqa: F401  (named repairs of the frozen stack; must come first)
from . import registry  # noqa: F401  (registers every backbone into mmdet, mmseg, mmpretrain)
