# maskrcnn / swin_t: the official InLine-Swin-T (InLine, NeurIPS 2024): arch 'inline_tiny' of SoftFreeSwin, 'IIIS': InLine with
# the official per-channel residual in global windows in stages 1-3, softmax windows in stage 4.
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_swin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: the official InLine-Swin-T release (LeapLabTHU/InLine, ImageNet-1k), fetched and converted on load.
_base_ = './maskrcnn_swin_t_softmax.py'
model = dict(
    backbone=dict(
        arch='inline_tiny',  # InLine-Swin-T: the preset holds the official attention layout
        attn_cfg=None,
        global_window=None,
        init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/32810869fcc34410966b/?dl=1')))
