"""Warning filters the tools apply before they import the OpenMMLab stack (``import tool_warnings`` first).

Precise on purpose: each entry names one message of the frozen stack that its users cannot act on and that would
otherwise be printed before every tool's own output. Everything else is shown as usual.
"""
import warnings

QUIET = (
    # mmengine 0.10.7 (and openmim) import pkg_resources, which setuptools >= 81 flags as deprecated on import
    (UserWarning, r'pkg_resources is deprecated as an API'),
    # mmseg 1.2.2's own decode heads call its build_loss, and its own ADE20K pipelines set reduce_zero_label
    (UserWarning, r'``build_loss`` would be deprecated soon'),
    (UserWarning, r'`reduce_zero_label` will be deprecated'),
)

for category, message in QUIET:
    warnings.filterwarnings('ignore', message=message, category=category)
