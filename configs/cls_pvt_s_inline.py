# cls / pvt_s: the official InLine-PVT-S (InLine, NeurIPS 2024): PVT v1 (SoftFreePVT arch 'inline_small': heads 2-4-10-16, no
# spatial reduction) with InLine and its official per-channel residual in every stage -> global average pooling ->
# linear head (the official model has no final norm).
# Recipe (the official cfgs/inline_pvt_s.yaml): AdamW lr 5e-4 per 512 images (1e-3 for the total batch 1024 here),
# wd 0.05, 300 epochs, drop path 0.1; 8 GPUs x 128 images (total batch 1024), 224x224.
# Reported: top-1 82.0 (InLine paper, the official release).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 21.556M, 3.930 GFLOPs; reported 21.6M, 3.9G:
#   InLine README.
_base_ = './cls_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVT',
        arch='inline_small',
        drop_path_rate=0.1,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),  # ImageNet from scratch (a dict: a Pretrained override merges)
    head=dict(in_channels=512))
