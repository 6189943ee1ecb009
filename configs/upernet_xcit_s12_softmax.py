# UperNet, XCiT-S12/16 backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 160k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: UperNet XCiT-S12/16 mIoU 45.9 (XCiT paper).
_base_ = [
    './_base_/models/upernet.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_160k_adamw.py', './_base_/default_runtime_seg.py'
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
    decode_head=dict(in_channels=[384, 384, 384, 384]),
    auxiliary_head=dict(in_channels=384))
