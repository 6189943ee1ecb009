# semfpn / pvt_s: the official Agent-PVT-S Semantic FPN (Agent Attention, ECCV 2024;
# downstream/segmentation/configs/agent_pvt/fpn_agent_pvt_s_12-16-28-28.py): PVT v1 (SoftFreePVT arch
# 'agent_small_downstream': agents 12x12 / 16x16 / 28x28 / 28x28, the biases resized), no spatial reduction.
# Everything else (recipe, GPUs x images per GPU, schedule, neck) is semfpn_pvt_v2_b2_softmax.py (the official run:
# 40k iterations).
# Reported: mIoU 44.18 (single scale), 56.17 (README's second column) (Agent-Attention segmentation README; PVT-S 39.8).
# Parameters / FLOPs (tools/analysis/get_flops.py, 512x2048): ours 24.389M, 211.663 GFLOPs; reported 24M, 211G:
#   Agent-Attention segmentation README.
# Backbone start: the official Agent-PVT-S release (ImageNet-1k), fetched and converted on load. To evaluate the official
#   segmentor: python tools/convert_checkpoint.py agent_pvt RELEASE.pth OUT.pth --whole, then load_from=OUT.pth
#   (release: https://cloud.tsinghua.edu.cn/f/11332fa565e443678e4c/?dl=1).
_base_ = './semfpn_pvt_v2_b2_softmax.py'
agent_release = 'https://cloud.tsinghua.edu.cn/f/36b8be9a8863456685a3/?dl=1'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVT',
        arch='agent_small_downstream',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=agent_release)))
