# transfer / pvt_v2_b2 / soft (8 GPUs x 128 images): stage 1 of the warm start (configs/_base_/transfer/pvt_v2_b2.py):
# SOFT in stages 1-3, softmax in stage 4, the student of configs/cls_pvt_v2_b2_soft.py; stage 2 is
# configs/finetune_pvt_v2_b2_soft.py.
_base_ = './_base_/transfer/pvt_v2_b2.py'
model = dict(
    backbone=dict(
        attn_cfg=[dict(type='soft', landmark_ratio=8, conv_size=9), dict(type='soft', landmark_ratio=4, conv_size=5),
                  dict(type='soft', landmark_ratio=2, conv_size=3), 'softmax'],
        sr_ratios=(1, 1, 1, 1)))
