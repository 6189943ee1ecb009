# ImageNet-1k classification, CSwin-T backbone -> global average pooling -> linear head, softmax attention.
# Recipe (DeiT / Swin): AdamW lr 1e-3, wd 0.05, 300 epochs, 8 GPUs x 128 images (total batch 1024), 224x224.
# (Official CSwin-T: lr 2e-3 at 8 x 256 images with EMA: the same lr per image as here.)
# Reported: top-1 82.7 (CSwin paper).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 22.321M, 4.341 GFLOPs; reported 23M, 4.3G: CSWin
#   README (microsoft/CSWin-Transformer).
_base_ = [
    './_base_/models/cls_linear.py', './_base_/datasets/imagenet_224.py',
    './_base_/schedules/cls_300e_adamw.py', './_base_/default_runtime_cls.py'
]
model = dict(
    backbone=dict(
        type='SoftFreeCSWin',
        arch='tiny',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.2,  # the official CSwin-T training command (--drop-path 0.2)
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),  # ImageNet from scratch (a dict: a Pretrained override merges)
    head=dict(in_channels=512))
