# transfer / pvt_v2_b2 / inline (8 GPUs x 128 images): stage 1 of the warm start
# (configs/_base_/transfer/pvt_v2_b2.py): InLine in stages 1-3, softmax in stage 4, no spatial reduction, the student
# of configs/cls_pvt_v2_b2_inline.py; stage 2 is configs/finetune_pvt_v2_b2_inline.py.
_base_ = './_base_/transfer/pvt_v2_b2.py'
model = dict(
    backbone=dict(
        attn_cfg=['inline', 'inline', 'inline', 'softmax'],
        sr_ratios=(1, 1, 1, 1)))
