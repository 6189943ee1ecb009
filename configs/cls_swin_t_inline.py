# cls / swin_t: InLine set-up ('IIIS'): InLine with global windows in stages 1-3, softmax windows in stage 4 (seed 003).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_swin_t_softmax.py.
# Reported: InLine Swin-T ImageNet top-1 82.4 (InLine paper; softmax 81.3).
_base_ = './cls_swin_t_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=['inline', 'inline', 'inline', 'softmax'],
        global_window=(True, True, True, False)))
