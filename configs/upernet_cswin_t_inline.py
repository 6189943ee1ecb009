# upernet / cswin_t: InLine set-up ('IISS'): InLine in stages 1-2, softmax in 3-4, stripes as wide as the stage (seed 003).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_cswin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './upernet_cswin_t_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=['inline', 'inline', 'softmax', 'softmax'],
        global_window=True))
