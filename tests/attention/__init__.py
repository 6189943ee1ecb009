"""Tests of softfree_mm/attention/: the kernels, their contract and their fused paths."""
