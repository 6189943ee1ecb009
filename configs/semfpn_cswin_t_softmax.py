# Semantic FPN, CSwin-T backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 80k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: Semantic FPN CSwin-T mIoU 48.2 (CSWin README, 80k iterations).
# Backbone start: the official CSWin-T release (ImageNet-1k), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 512x2048): ours 26.059M, 204.587 GFLOPs; reported 26M, 202G:
#   CSWin README.
_base_ = [
    './_base_/models/semfpn.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_80k_adamw.py', './_base_/default_runtime_seg.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://github.com/microsoft/CSWin-Transformer/releases/download/v0.1.0/cswin_tiny_224.pth'
model = dict(
    backbone=dict(
        type='SoftFreeCSWin',
        arch='tiny',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.3,  # the official upernet_cswin_tiny.py
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[64, 128, 256, 512]))
