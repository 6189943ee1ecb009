from .backbones import *  # noqa: F401,F403
from .backbones import __all__  # noqa: F401
