# semfpn / pvt_s: the official InLine-PVT-S (InLine, NeurIPS 2024): PVT v1 (SoftFreePVT arch 'inline_small': heads 2-4-10-16, no
# spatial reduction) with InLine and its official per-channel residual in every stage.
# Everything else (recipe, GPUs x images per GPU, schedule, neck) is semfpn_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination (InLine-PVT-S ImageNet top-1 82.0).
# Backbone start: the official InLine-PVT-S release (LeapLabTHU/InLine, ImageNet-1k), fetched and converted on load.
_base_ = './semfpn_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVT',
        arch='inline_small',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/1ab953b2479d433080a3/?dl=1')))
