# ImageNet-1k classification, Swin-T backbone -> global average pooling -> linear head, softmax attention.
# Recipe (DeiT / Swin): AdamW lr 1e-3, wd 0.05, 300 epochs, 8 GPUs x 128 images (total batch 1024), 224x224.
# Reported: top-1 81.3 (Swin paper; InLine paper: 81.3 -> 82.4 with InLine + local residual).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 28.288M, 4.509 GFLOPs; reported 28M, 4.5G: Swin
#   README (microsoft/Swin-Transformer), Swin paper arXiv 2103.14030.
_base_ = [
    './_base_/models/cls_linear.py', './_base_/datasets/imagenet_224.py',
    './_base_/schedules/cls_300e_adamw.py', './_base_/default_runtime_cls.py'
]
model = dict(
    backbone=dict(
        type='SoftFreeSwin',
        arch='tiny',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.2,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),  # ImageNet from scratch (a dict: a Pretrained override merges)
    head=dict(in_channels=768))
