# `make demo`'s pretraining step at XCiT-T12 width: cls_xcit_s12_poly3_demo.py (data, pipelines, schedule) with the
# XCiT-T12/16 backbone (embedding 192, 4 heads; the same 12 XCA layers with poly3, class-attention layers and head).
# The two demo cores train T12 about twice as fast as S12, and only T12 gets far enough in the demo's minutes.
# 1 process (CPU) x 32 images.
_base_ = './cls_xcit_s12_poly3_demo.py'
model = dict(backbone=dict(arch='t12'), head=dict(in_channels=192))
