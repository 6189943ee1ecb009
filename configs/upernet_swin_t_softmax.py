# UperNet, Swin-T backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 160k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: UperNet Swin-T mIoU 44.5 (Swin paper).
# Backbone start: the official Swin-T release (ImageNet-1k), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 512x2048): ours 59.942M, 940.819 GFLOPs; reported 60M, 945G:
#   Swin-Transformer-Semantic-Segmentation README.
_base_ = [
    './_base_/models/upernet.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_160k_adamw.py', './_base_/default_runtime_seg.py'
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
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
