# upernet / soft_s: SOFT's own backbone, SOFT-Small-Norm (SOFT, arXiv 2110.11945): SoftFreeSOFT arch 'small_norm' (conv stem,
# SOFT-Norm kernels with landmark ratios 8 / 4 / 2 and convs on v 9 / 5 / 3 in stages 1-3, softmax + class token in stage 4).
# Recipe: upernet_pvt_v2_b2_softmax.py (GPUs x images per GPU: 8 GPUs x 2 images, total batch 16, AdamW).
# Reported (SOFT README): SOFT-Small-Norm UperNet mIoU 46.2 (512x512, 160k).
# Backbone start: the official SOFT-Small-Norm release (Google Drive, fudan-zvg/SOFT README; its EMA weights, which
# the official evaluation uses), fetched and converted on load.
# Parameters / FLOPs (tools/analysis/get_flops.py, 512x512): ours 68.833M, 398.114 GFLOPs; reported: no parameter or
#   FLOP figure held here.
_base_ = './upernet_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeSOFT',
        arch='small_norm',
        drop_path_rate=0.1,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://drive.google.com/file/d/1OBjn7FzVdNP1Urqxq7X0yDykyPhxAAW1/view?usp=sharing')))
