"""Kept for one importer only, softfree_mm/engine/dry_run.py, until it imports SoftFreeBackbone from
``softfree_mm.models.backbones.base`` (the kit); then this file goes."""
from .backbones.base import SoftFreeBackbone  # noqa: F401
