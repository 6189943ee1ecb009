# transfer / pvt_v2_b2 / poly1 (8 GPUs x 128 images): stage 1 of the warm start
# (configs/_base_/transfer/pvt_v2_b2.py): x / sqrt(N) in every layer, the student of configs/cls_pvt_v2_b2_poly1.py;
# stage 2 is configs/finetune_pvt_v2_b2_poly1.py.
_base_ = './_base_/transfer/pvt_v2_b2.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='poly', degree=1)))
