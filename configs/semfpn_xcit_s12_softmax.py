# Semantic FPN, XCiT-S12/16 backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 80k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: SemanticFPN XCiT-S12/16 mIoU 43.9 (XCiT paper).
_base_ = [
    './_base_/models/semfpn.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_80k_adamw.py', './_base_/default_runtime_seg.py'
]
model = dict(
    backbone=dict(
        type='SoftFreeXCiT',
        arch='s12',
        patch_size=16,
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.1,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=None),
    neck=dict(in_channels=[384, 384, 384, 384]))
