# Mask R-CNN + FPN, Swin-T backbone (window 7), softmax attention (the baseline), COCO 3x multi-scale.
# Recipe (Swin detection): AdamW lr 1e-4, wd 0.05, drop path 0.2, 36 epochs, 8 GPUs x 2 images (total batch 16).
# Reported (Swin paper): box/mask AP 3x 46.0/41.6, 1x 43.7/39.8.
# Backbone start: the official Swin-T release (ImageNet-1k), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 800x1280): ours 47.795M, 263.319 GFLOPs; reported 48M, 267G:
#   Swin-Transformer-Object-Detection README.
_base_ = [
    './_base_/models/mask_rcnn_fpn.py', './_base_/datasets/coco_instance_ms.py',
    './_base_/schedules/det_3x_adamw.py', './_base_/default_runtime_det.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeSwin',
        arch='tiny',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[96, 192, 384, 768]))
