# Mask R-CNN + FPN, XCiT-S12/16 backbone, softmax attention (the baseline), COCO 3x multi-scale.
# Recipe (XCiT detection): AdamW lr 1e-4, wd 0.05, 36 epochs, 8 GPUs x 2 images (total batch 16).
# Reported (XCiT paper, 3x): box AP 45.3, mask AP 40.8.
# Backbone start: the official XCiT-S12/16 release (ImageNet-1k, 384, distilled; the XCiT detection README's start), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 800x1280): ours 44.387M, 286.374 GFLOPs; reported: no parameter
#   or FLOP figure in the XCiT detection README.
_base_ = [
    './_base_/models/mask_rcnn_fpn.py', './_base_/datasets/coco_instance_ms.py',
    './_base_/schedules/det_3x_adamw.py', './_base_/default_runtime_det.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeXCiT',
        arch='s12',
        patch_size=16,
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.05,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[384, 384, 384, 384]))
