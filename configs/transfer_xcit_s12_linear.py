# transfer / xcit_s12 / linear (8 GPUs x 128 images): stage 1 of the warm start (configs/_base_/transfer/xcit_s12.py):
# linear attention (elu+1) in every layer, the student of configs/cls_xcit_s12_linear.py; stage 2 is
# configs/finetune_xcit_s12_linear.py.
_base_ = './_base_/transfer/xcit_s12.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='linear', feature_map='elu+1')))
