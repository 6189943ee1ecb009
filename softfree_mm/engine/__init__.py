"""Training-time helpers: the shared logic of tools/train.py and test.py (``launch``, imported by the tools only)
and the hooks of ``engine.hooks`` (registered by ``softfree_mm.registry``)."""
