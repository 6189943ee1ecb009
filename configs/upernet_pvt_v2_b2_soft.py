# upernet / pvt_v2_b2: SOFT set-up: SOFT in stages 1-3 (landmark ratios 8/4/2), softmax in stage 4, no spatial reduction (SOFT, arXiv 2110.11945).
# Gaussian kernel with tied keys, Nystrom landmarks by a strided conv, 20 Newton steps (fp32), depthwise conv on v of size 9 / 5 / 3 (the official forms).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this backbone; SOFT's own backbone, SOFT-Small-Norm, reached UperNet mIoU 46.2.
# Backbone start: no release exists for this kernel: the ImageNet checkpoint of configs/cls_pvt_v2_b2_soft.py
# (work_dirs/cls_pvt_v2_b2_soft/epoch_300.pth); a missing file stops training with the way to make it or to opt out.
_base_ = './upernet_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/cls_pvt_v2_b2_soft/epoch_300.pth'),
        attn_cfg=[dict(type='soft', landmark_ratio=8, conv_size=9), dict(type='soft', landmark_ratio=4, conv_size=5),
                  dict(type='soft', landmark_ratio=2, conv_size=3), 'softmax'],
        sr_ratios=(1, 1, 1, 1)))
