# upernet / swin_t: the official Agent-Swin-T UperNet (Agent Attention, ECCV 2024;
# downstream/segmentation/configs/agent_swin/upernet_agent_swin_t_9-12-14-7.py): arch 'agent_tiny_downstream' of
# SoftFreeSwin (agents 9x9 / 12x12 / 14x14, the biases resized), drop path 0.3.
# Everything else (recipe: AdamW lr 6e-5, wd 0.01, 160k iterations; GPUs x images per GPU) is upernet_swin_t_softmax.py,
# with the six agent biases out of weight decay as the official optimizer.
# Reported: mIoU 46.68 (single scale), 58.53 (README's second column) (Agent-Attention segmentation README;
#   Swin-T 44.5).
# Parameters / FLOPs (tools/analysis/get_flops.py, 512x2048): ours 60.556M, 953.144 GFLOPs; reported 61M, 954G:
#   Agent-Attention segmentation README.
# Backbone start: the official Agent-Swin-T release (ImageNet-1k), fetched and converted on load. To evaluate the official
#   segmentor: python tools/convert_checkpoint.py agent_swin RELEASE.pth OUT.pth --whole, then load_from=OUT.pth
#   (release: https://cloud.tsinghua.edu.cn/f/280481ee38024bce8364/?dl=1).
_base_ = './upernet_swin_t_softmax.py'
agent_release = 'https://cloud.tsinghua.edu.cn/f/a2ddc1190c224f768a41/?dl=1'
model = dict(
    backbone=dict(
        arch='agent_tiny_downstream',
        attn_cfg=None,
        global_window=None,
        drop_path_rate=0.3,
        init_cfg=dict(checkpoint=agent_release)))
no_decay = dict(decay_mult=0.)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'an_bias': no_decay, 'na_bias': no_decay, 'ah_bias': no_decay, 'aw_bias': no_decay, 'ha_bias': no_decay,
    'wa_bias': no_decay}))
