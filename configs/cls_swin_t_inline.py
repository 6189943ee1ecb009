# cls / swin_t: the official InLine-Swin-T (InLine, NeurIPS 2024): arch 'inline_tiny' (the preset holds the official attention
# layout).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_swin_t_softmax.py.
# Reported: InLine Swin-T ImageNet top-1 82.4 (InLine paper; softmax 81.3).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 29.224M, 4.476 GFLOPs; reported 30M, 4.5G: InLine
#   README (LeapLabTHU/InLine).
_base_ = './cls_swin_t_softmax.py'
model = dict(
    backbone=dict(
        arch='inline_tiny',
        attn_cfg=None,
        global_window=None,
        drop_path_rate=0.2))  # cfgs/inline_swin_t.yaml
