# semfpn / swin_t: Agent-Swin-T (Agent Attention, ECCV 2024) in Semantic FPN: arch 'agent_tiny_downstream' of SoftFreeSwin
# (agents 9x9 / 12x12 / 14x14 as the official detection / segmentation set-up, the biases resized), softmax windows in
# stage 4.
# Everything else (recipe, GPUs x images per GPU, schedule) is semfpn_swin_t_softmax.py.
# Reported: no number in the anchors for this combination (the official Agent-Swin-T segmentor is UperNet 46.68).
# Backbone start: the official Agent-Swin-T release (LeapLabTHU/Agent-Attention, ImageNet-1k), fetched and converted on
#   load.
_base_ = './semfpn_swin_t_softmax.py'
model = dict(
    backbone=dict(
        arch='agent_tiny_downstream',
        attn_cfg=None,
        global_window=None,
        init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/a2ddc1190c224f768a41/?dl=1')))
