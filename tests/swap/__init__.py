"""Tests of softfree_mm/swap/: kernels swapped into foreign models, the fit rules and adapters."""
