"""Tests of softfree_mm/analysis/: attention capture and layouts, norms, injectivity / locality, the study."""
