# Semantic FPN, Swin-T backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 80k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: no SemanticFPN number in the anchors for Swin-T.
# Backbone start: the official Swin-T release (ImageNet-1k), fetched and converted on load.
_base_ = [
    './_base_/models/semfpn.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_80k_adamw.py', './_base_/default_runtime_seg.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        type='SoftFreeSwin',
        arch='tiny',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[96, 192, 384, 768]))
