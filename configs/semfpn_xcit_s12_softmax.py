# Semantic FPN, XCiT-S12/16 backbone, softmax attention (the baseline), ADE20K 150 classes, crop 512x512.
# Recipe (ADE20K): AdamW lr 6e-5, wd 0.01, 80k iterations, warm-up + poly, 8 GPUs x 2 images (total batch 16).
# Reported: SemanticFPN XCiT-S12/16 mIoU 43.9 (XCiT paper).
# Backbone start: the official XCiT-S12/16 release (ImageNet-1k, 384, distilled; the XCiT detection README's start), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 512x2048): ours 28.486M, 205.127 GFLOPs; reported: no parameter
#   or FLOP figure in the XCiT segmentation README.
_base_ = [
    './_base_/models/semfpn.py', './_base_/datasets/ade20k_512.py',
    './_base_/schedules/seg_80k_adamw.py', './_base_/default_runtime_seg.py'
]
# the official softmax release this backbone starts from (the configs of other kernels inherit it: their
# other way to start, with the kernel swapped)
softmax_release = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth'
model = dict(
    backbone=dict(
        type='SoftFreeXCiT',
        arch='s12',
        patch_size=16,
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.05,  # the official XCiT segmentation configs
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=softmax_release)),
    neck=dict(in_channels=[384, 384, 384, 384]))
