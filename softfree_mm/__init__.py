"""softfree_mm: softmax-free attention kernels swappable inside XCiT, PVT, Swin and CSwin, for OpenMMLab 2.x."""
__version__ = '0.1.0'

from .mmcv_ext import install as _serve_mmcv_ext  # noqa: E402  (before anything imports mmcv.ops)
_serve_mmcv_ext()
from .mim_cache import make_mim_cache as _make_mim_cache  # noqa: E402
_make_mim_cache()  # before any mim process of this home folder can race to create it
from .swap import swap_attention  # noqa: E402,F401  (torch only: kernels into timm / mmdet / mmpretrain models)

try:
    import mmengine  # noqa: F401
except ImportError:  # the kernel library (softfree_mm.attention) needs torch only
    mmengine = None
if mmengine is not None:
    from . import compat  # noqa: F401  (named repairs of the frozen stack; must come first)
    from . import registry  # noqa: F401  (registers every backbone into mmdet, mmseg, mmpretrain)
