# upernet / xcit_s12: polynomial attention x^3 scaled by 1/sqrt(N) (seed 000).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_xcit_s12_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './upernet_xcit_s12_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='poly', degree=3)))
