# Mask R-CNN + FPN, CSwin-T backbone (stripes 1-2-7-7), softmax attention (the baseline), COCO 3x multi-scale.
# Recipe (CSwin detection): AdamW lr 1e-4, wd 0.05, 36 epochs, 8 GPUs x 2 images (total batch 16).
# Reported (CSwin paper, 3x): box/mask AP 49.0/43.6.
# Backbone start: the official CSWin-T release (ImageNet-1k), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 800x1280): ours 41.959M, 280.154 GFLOPs; reported 42M, 279G:
#   CSWin README.
_base_ = [
    './_base_/models/mask_rcnn_fpn.py', './_base_/datasets/coco_instance_ms.py',
    './_base_/schedules/det_3x_adamw.py', './_base_/default_runtime_det.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://github.com/microsoft/CSWin-Transformer/releases/download/v0.1.0/cswin_tiny_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeCSWin',
        arch='tiny',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[64, 128, 256, 512]))
