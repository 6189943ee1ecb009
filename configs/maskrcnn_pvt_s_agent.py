# maskrcnn / pvt_s: the official Agent-PVT-S Mask R-CNN 1x (Agent Attention, ECCV 2024;
# downstream/detection/configs/agent_pvt/agent_pvt_s_mrcnn_1x_12-16-28-28.py): PVT v1 (SoftFreePVT arch
# 'agent_small_downstream': heads 1-2-5-8, no spatial reduction, agent attention everywhere with the detection set-up's
# agents 12x12 / 16x16 / 28x28 / 28x28, the biases resized).
# Recipe (official): AdamW lr 2e-4, wd 1e-4, drop path 0.2, 1x (12 epochs), 8 GPUs x 2 images (total batch 16); the
# official run trains at one scale (1333x800, mmdet's coco_instance), this config keeps the multi-scale pipeline of
# maskrcnn_pvt_v2_b2_softmax.py.
# Reported: box/mask AP 1x 44.5/41.2 (Agent-Attention detection README; PVT-S 1x 40.4/37.8).
# Parameters / FLOPs (tools/analysis/get_flops.py, 800x1280): ours 40.289M, 292.758 GFLOPs; reported 40M, 293G:
#   Agent-Attention detection README (mmcv 1.x's counter at 1280x800
#   plus the attention's products by hand).
# Backbone start: the official Agent-PVT-S release (ImageNet-1k), fetched and converted on load. To evaluate the official
#   detector: python tools/convert_checkpoint.py agent_pvt RELEASE.pth OUT.pth --whole, then load_from=OUT.pth
#   (release: https://cloud.tsinghua.edu.cn/f/8e333aa6b55e45d4b76c/?dl=1).
_base_ = './maskrcnn_pvt_v2_b2_softmax.py'
agent_release = 'https://cloud.tsinghua.edu.cn/f/36b8be9a8863456685a3/?dl=1'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVT',
        arch='agent_small_downstream',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=agent_release)))
optim_wrapper = dict(optimizer=dict(lr=2e-4, weight_decay=1e-4))
# the 1x schedule (12 epochs, lr steps at 8 and 11), as the official config
train_cfg = dict(max_epochs=12)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1)
]
