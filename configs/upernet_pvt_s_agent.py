# upernet / pvt_s: Agent-PVT-S (Agent Attention, ECCV 2024) in UperNet: PVT v1 (SoftFreePVT arch 'agent_small_downstream':
# agents 12x12 / 16x16 / 28x28 / 28x28 as the official segmentation set-up, the biases resized), no spatial reduction.
# Everything else (recipe, GPUs x images per GPU, schedule, neck) is upernet_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination (the official Agent-PVT-S segmentor is Semantic FPN 44.18).
# Backbone start: the official Agent-PVT-S release (LeapLabTHU/Agent-Attention, ImageNet-1k), fetched and converted on
#   load.
_base_ = './upernet_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVT',
        arch='agent_small_downstream',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/36b8be9a8863456685a3/?dl=1')))
