# cls / pvt_v2_b2: InLine set-up: InLine in stages 1-3, softmax in stage 4, no spatial reduction (InLine, NeurIPS 2024).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './cls_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=['inline', 'inline', 'inline', 'softmax'],
        sr_ratios=(1, 1, 1, 1)))
