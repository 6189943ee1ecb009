# ImageNet-1k classification, XCiT-S12/16 backbone -> class-attention layers -> class token -> linear head, softmax attention.
# Recipe (DeiT / Swin): AdamW lr 1e-3, wd 0.05, 400 epochs, 8 GPUs x 128 images (total batch 1024), 224x224.
# Reported: top-1 82.0 (XCiT paper, 224, no distillation).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 26.253M, 4.815 GFLOPs; reported 26M, 4.8G: XCiT
#   README (params), XCiT paper arXiv 2106.09681 (FLOPs).
_base_ = [
    './_base_/models/cls_linear.py', './_base_/datasets/imagenet_224.py',
    './_base_/schedules/cls_300e_adamw.py', './_base_/default_runtime_cls.py'
]
model = dict(
    backbone=dict(
        type='SoftFreeXCiT',
        arch='s12',
        patch_size=16,
        out_type='cls_token',
        norm_cfg=dict(type='BN', requires_grad=True),  # the classification XCiT uses plain BN
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.05,
        init_cfg=dict(type='Scratch')),  # ImageNet from scratch (a dict: a Pretrained override merges)
    neck=None,
    head=dict(in_channels=384))

# XCiT trains 400 epochs (lr 5e-4 per 512 images, as DeiT)
max_epochs = 400
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=max_epochs)
]
