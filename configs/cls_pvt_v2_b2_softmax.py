# ImageNet-1k classification, PVTv2-b2 backbone -> global average pooling -> linear head, softmax attention.
# Recipe (DeiT / Swin): AdamW lr 1e-3, wd 0.05, 300 epochs, 8 GPUs x 128 images (total batch 1024), 224x224.
# Reported: top-1 82.0 (PVTv2 paper).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 25.363M, 4.046 GFLOPs; reported 25.4M, 4.0G: PVT
#   README (params), PVTv2 paper arXiv 2106.13797 (FLOPs).
_base_ = [
    './_base_/models/cls_linear.py', './_base_/datasets/imagenet_224.py',
    './_base_/schedules/cls_300e_adamw.py', './_base_/default_runtime_cls.py'
]
model = dict(
    backbone=dict(
        type='SoftFreePVTv2',
        arch='b2',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.1,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),  # ImageNet from scratch (a dict: a Pretrained override merges)
    head=dict(in_channels=512))
