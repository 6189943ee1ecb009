# maskrcnn / swin_t: polynomial attention x^1 scaled by 1/sqrt(N) (arXiv 2410.18613; linear cost).
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_swin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the ImageNet checkpoint of configs/cls_swin_t_poly1.py
# (work_dirs/cls_swin_t_poly1/epoch_300.pth); a missing file stops training with the way to make it or to opt out.
_base_ = './maskrcnn_swin_t_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/cls_swin_t_poly1/epoch_300.pth'),
        attn_cfg=dict(_delete_=True, type='poly', degree=1)))
