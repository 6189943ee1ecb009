"""Warning filters the tools apply before they import the OpenMMLab stack (``import tool_warnings`` first).

Precise on purpose: each entry names one message of the frozen stack that its users cannot act on and that would
otherwise be printed before every tool's own output. Everything else is shown as usual.
The same entries go into PYTHONWARNINGS (after the user's own), so that every process a tool starts (the demo's
steps, torchrun's workers, spawned data loader workers) has them from its first import on.
"""
import logging
import os
import re
import warnings

QUIET = (
    # mmengine 0.10.7 (and openmim) import pkg_resources, which setuptools >= 81 flags as deprecated on import
    (UserWarning, 'pkg_resources is deprecated as an API'),
    # mmseg 1.2.2's own decode heads call its build_loss, and its own ADE20K pipelines set reduce_zero_label
    (UserWarning, '``build_loss`` would be deprecated soon'),
    (UserWarning, '`reduce_zero_label` will be deprecated'),
    # mmengine 0.10.7's visualiser wants x < width, y < height, mmdet clips boxes to x <= width: each drawn box that
    # touches the right or bottom edge gives both notes (it is drawn as a polygon); the picture is right
    (UserWarning, 'Warning: The bbox is out of bounds, the drawn bbox may not be in the image'),
    (UserWarning, 'Warning: The polygon is out of bounds, the drawn polygon may not be in the image'),
)

# the same kind of note written by mmengine's logger (WARNING lines, not Python warnings): its file backends, which
# mmdet's and mmseg's loading transforms reach, announce their own deprecation on first use; mmdet has no 'function'
# registry of its own, so DetInferencer's collate function comes from mmengine's, with a warning saying so
QUIET_LOGS = (
    '"FileClient" will be deprecated in future',
    '"HardDiskBackend" is the alias of "LocalBackend"',
    'Failed to search registry with scope "mmdet" in the "function" registry tree.',
)


class _QuietLogs(logging.Filter):
    def filter(self, record):
        return not str(record.msg).startswith(QUIET_LOGS)


def quiet_mmengine_logs():
    """Every MMLogger (the runner's, made later in the process) drops QUIET_LOGS; a no-op without mmengine."""
    try:
        from mmengine.logging import MMLogger
    except ImportError:
        return
    if getattr(MMLogger, '_softfree_quiet', False):
        return
    init = MMLogger.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.addFilter(_QuietLogs())

    MMLogger.__init__ = __init__
    MMLogger._softfree_quiet = True
    for logger in MMLogger._instance_dict.values():
        logger.addFilter(_QuietLogs())


def env_entries():
    """QUIET as PYTHONWARNINGS entries (action:message:category; the message is the literal start of the text).
    A message with ':' or ',' cannot be written there: those stay filters of the tool's own process."""
    return [f'ignore:{message}:{category.__name__}' for category, message in QUIET
            if ':' not in message and ',' not in message]


def install(environ=os.environ):
    for category, message in QUIET:
        warnings.filterwarnings('ignore', message=re.escape(message), category=category)
    given = [e for e in environ.get('PYTHONWARNINGS', '').split(',') if e]
    environ['PYTHONWARNINGS'] = ','.join(given + [e for e in env_entries() if e not in given])
    quiet_mmengine_logs()


install()
