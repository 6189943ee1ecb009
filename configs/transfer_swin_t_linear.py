# transfer / swin_t / linear (8 GPUs x 128 images): stage 1 of the warm start (configs/_base_/transfer/swin_t.py):
# linear attention (elu+1) in every layer, the student of configs/cls_swin_t_linear.py; stage 2 is
# configs/finetune_swin_t_linear.py.
_base_ = './_base_/transfer/swin_t.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='linear', feature_map='elu+1')))
