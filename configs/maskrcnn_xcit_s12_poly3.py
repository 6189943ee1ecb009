# maskrcnn / xcit_s12: polynomial attention x^3 scaled by 1/sqrt(N) (polynomial attention, arXiv 2410.18613).
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_xcit_s12_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the ImageNet checkpoint of configs/cls_xcit_s12_poly3.py
# (work_dirs/cls_xcit_s12_poly3/epoch_400.pth); a missing file stops training with the way to make it or to opt out.
_base_ = './maskrcnn_xcit_s12_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/cls_xcit_s12_poly3/epoch_400.pth'),
        attn_cfg=dict(_delete_=True, type='poly', degree=3)))
