"""Tests of softfree_mm/models/: the backbones, their converters and checkpoints, export, OpenMMLab use."""
