# transfer / cswin_t / poly1 (8 GPUs x 128 images): stage 1 of the warm start (configs/_base_/transfer/cswin_t.py): x
# / sqrt(N) in every layer, the student of configs/cls_cswin_t_poly1.py; stage 2 is configs/finetune_cswin_t_poly1.py.
_base_ = './_base_/transfer/cswin_t.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='poly', degree=1)))
