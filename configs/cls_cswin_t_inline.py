# cls / cswin_t: the official InLine-CSWin-T (InLine, NeurIPS 2024): arch 'inline_tiny' (the preset holds the official attention
# layout).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_cswin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './cls_cswin_t_softmax.py'
model = dict(
    backbone=dict(
        arch='inline_tiny',
        attn_cfg=None,
        global_window=None,
        drop_path_rate=0.2))  # cfgs/inline_cswin_t.yaml
