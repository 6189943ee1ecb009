# transfer / cswin_t / soft (8 GPUs x 128 images): stage 1 of the warm start (configs/_base_/transfer/cswin_t.py):
# SOFT in stages 1-3, softmax in stage 4, the student of configs/cls_cswin_t_soft.py; stage 2 is
# configs/finetune_cswin_t_soft.py.
_base_ = './_base_/transfer/cswin_t.py'
model = dict(
    backbone=dict(
        attn_cfg=[dict(type='soft', landmark_ratio=8, conv_size=9), dict(type='soft', landmark_ratio=4, conv_size=5),
                  dict(type='soft', landmark_ratio=2, conv_size=3), 'softmax'],
        global_window=True))
