# Semantic FPN, PVTv2-b2 backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 80k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: SemanticFPN: PVT-S v1 mIoU 39.8 (PVT paper); no PVTv2-b2 number in the anchors.
# Backbone start: the official PVTv2-b2 release (ImageNet-1k), fetched and converted on load.
_base_ = [
    './_base_/models/semfpn.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_80k_adamw.py', './_base_/default_runtime_seg.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://github.com/whai362/PVT/releases/download/v2/pvt_v2_b2.pth'
model = dict(
    backbone=dict(
        type='SoftFreePVTv2',
        arch='b2',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[64, 128, 320, 512]))
