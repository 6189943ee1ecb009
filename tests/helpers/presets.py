"""Tiny presets of every backbone family softfree_mm declares (tests that go over all of them share these): each
family's own ``Family.tiny``, by class name.
"""
import softfree_mm  # noqa: F401  (declares every family)
from softfree_mm.models.family import FAMILIES

TINY = {name: dict(cls.family.tiny) for name, cls in FAMILIES.items()}
