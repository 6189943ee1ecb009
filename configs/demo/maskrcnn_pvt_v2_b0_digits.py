# The detection and segmentation study's token-attention detector (tools/analysis/task_study.py, docs/study.md
# "Detection and segmentation"): `make demo`'s Mask R-CNN (maskrcnn_xcit_t12_poly3_demo.py: the digits scenes at
# their own size, demo-sized 64-channel FPN and heads, 400 iterations, AdamW lr 6e-4) with the kernel study's PVTv2-b0
# without spatial reduction (study_pvt_v2_b0_digits.py: widths 32-64-160-256, depths 2-2-2-2, every stage attending
# over its whole grid) in place of XCiT, its four stages feeding the FPN, started from the study's classifier of the
# same kernel (init_cfg Pretrained, prefix 'backbone.'; the study passes the checkpoint). The study sets attn_cfg per
# run. 1 process (CPU) x 4 images.
_base_ = './maskrcnn_xcit_t12_poly3_demo.py'
softmax_release = None  # the start is the study's own classifier, not a release
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVTv2',
        arch='b0',
        sr_ratios=(1, 1, 1, 1),
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/study/pvt_v2_b0_classifier.pth', prefix='backbone.')),
    neck=dict(in_channels=[32, 64, 160, 256]))
