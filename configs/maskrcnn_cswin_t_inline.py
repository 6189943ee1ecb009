# maskrcnn / cswin_t: the official InLine-CSWin-T (InLine, NeurIPS 2024): arch 'inline_tiny' of SoftFreeCSWin, 'IISS', depths
# 2-4-18-1: InLine with the official per-channel residual over the whole grid in stages 1-2, softmax stripes 7 in
# stage 3, global softmax in stage 4.
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_cswin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: the official InLine-CSWin-T release (LeapLabTHU/InLine, ImageNet-1k), fetched and converted on load.
_base_ = './maskrcnn_cswin_t_softmax.py'
model = dict(
    backbone=dict(
        arch='inline_tiny',  # InLine-CSWin-T: the preset holds the official attention layout
        attn_cfg=None,
        global_window=None,
        init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/49fa2ecc543647c4b970/?dl=1')))
