"""mmcv's compiled ops without a compiler: ``ops.py`` stands in for ``mmcv._ext`` (mmcv-lite has none) on
torchvision's kernels, ``finder.py`` puts it in place in every process; a compiled mmcv, when installed, wins."""
from .finder import MARK, PTH_LINE, PTH_NAME, install, is_standin  # noqa: F401
