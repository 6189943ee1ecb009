"""Training-time helpers (not imported by ``import softfree_mm``): the shared logic of tools/train.py and test.py."""
