# `make demo`'s detector step at XCiT-T12 width: maskrcnn_xcit_s12_poly3_demo.py (data, heads, schedule) with the
# XCiT-T12/16 backbone (embedding 192, 4 heads; the same poly3 XCA layers and stride-fixing adapter), started from
# cls_xcit_t12_poly3_demo.py's checkpoint.
# 1 process (CPU) x 4 images per batch.
_base_ = './maskrcnn_xcit_s12_poly3_demo.py'
model = dict(backbone=dict(arch='t12'), neck=dict(in_channels=[192, 192, 192, 192]))
