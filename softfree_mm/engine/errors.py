"""The errors the tools print as one line (``error: ...``, exit status 2) instead of a traceback."""
import re
from typing import Optional


class UsageError(Exception):
    """A mistake in what the user asked for (config, CLI option, device): printed as one line, exit status 2."""


class BadInput(Exception):
    """A data file, annotation file or checkpoint that cannot be used; the message is one line naming it."""


class NonFiniteLoss(Exception):
    """The loss of an iteration is NaN or inf; the message names the iteration and the loss terms."""


def short_error(e: BaseException, limit: Optional[int] = None) -> str:
    """``Type: message`` on one line, cut to ``limit`` characters when given."""
    msg = ' '.join(str(e).split())
    msg = f'{type(e).__name__}: {msg}' if msg else type(e).__name__
    return msg if limit is None or len(msg) <= limit else msg[:limit - 3] + '...'


def error_line(e: BaseException) -> str:
    """The one line of a BadInput / NonFiniteLoss, also when a DataLoader worker re-raised it with the worker's
    traceback in the message."""
    msg = str(e)
    if 'Original Traceback' in msg:
        m = re.search(r'(?:BadInput|NonFiniteLoss): (.+?)\s*$', msg.strip())
        if m:
            return m.group(1)
    return ' '.join(msg.split())
