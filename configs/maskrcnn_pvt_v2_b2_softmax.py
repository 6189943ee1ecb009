# Mask R-CNN + FPN, PVTv2-b2 backbone, softmax attention (the baseline), COCO 3x multi-scale.
# Recipe (PVTv2 detection): AdamW lr 2e-4, wd 1e-4, 8 GPUs x 2 images (total batch 16), here on the 3x schedule.
# Reported (PVTv2 paper): box/mask AP 3x 47.8/43.1, 1x 45.3/41.2.
# Backbone start: the official PVTv2-b2 release (ImageNet-1k), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 800x1280): ours 45.017M, 309.133 GFLOPs; reported: no parameter
#   or FLOP figure in the PVT README.
_base_ = [
    './_base_/models/mask_rcnn_fpn.py', './_base_/datasets/coco_instance_ms.py',
    './_base_/schedules/det_3x_adamw.py', './_base_/default_runtime_det.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://github.com/whai362/PVT/releases/download/v2/pvt_v2_b2.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVTv2',
        arch='b2',
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[64, 128, 320, 512]))
optim_wrapper = dict(optimizer=dict(lr=2e-4, weight_decay=1e-4))
