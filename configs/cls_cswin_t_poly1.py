# cls / cswin_t: polynomial attention x^1 scaled by 1/sqrt(N) (arXiv 2410.18613; linear cost).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_cswin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './cls_cswin_t_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='poly', degree=1)))
