# semfpn / swin_t: InLine set-up ('IIIS'): InLine with global windows in stages 1-3, softmax windows in stage 4 (seed 003).
# Everything else (recipe, GPUs x images per GPU, schedule) is semfpn_swin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './semfpn_swin_t_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=['inline', 'inline', 'inline', 'softmax'],
        global_window=(True, True, True, False)))
