"""Tiny presets of every backbone class softfree_mm registers (tests that go over all of them share these).

The five families of the support table (``softfree_mm.analysis.support.TINY``) plus SOFT's own backbone.
"""
from softfree_mm.analysis import support

TINY = dict(support.TINY, SoftFreeSOFT=dict(arch=dict(embed_dims=(16, 32, 32, 32), num_heads=(1, 2, 2, 2),
                                                     depths=(1, 1, 1, 1))))
